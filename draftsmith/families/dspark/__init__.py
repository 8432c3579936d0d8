from draftsmith.families.dspark import network  # noqa: F401  (registers "dspark")
