from draftsmith.families.dflash import network  # noqa: F401  (registers "dflash")
