from draftsmith.families.pard import network  # noqa: F401  (registers "pard")
