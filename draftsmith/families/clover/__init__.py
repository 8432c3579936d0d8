from draftsmith.families.clover import network  # noqa: F401  (registers the family)
