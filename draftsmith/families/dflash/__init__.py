from draftsmith.families.dflash import export, network  # noqa: F401  (registers "dflash" and its export hooks)
