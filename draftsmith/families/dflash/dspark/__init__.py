from draftsmith.families.dflash.dspark import export, network  # noqa: F401  (registers "dspark" and its export hooks)
