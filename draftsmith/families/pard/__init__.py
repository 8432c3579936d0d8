from draftsmith.families.pard import export, network  # noqa: F401  (registers "pard" and its export hooks)
