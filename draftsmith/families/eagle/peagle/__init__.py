from draftsmith.families.eagle.peagle import export, network  # noqa: F401  (registers "peagle" and its export hooks)
