from draftsmith.families.peagle import network  # noqa: F401  (registers "peagle")
