from draftsmith.families.eagle import network  # noqa: F401  (registers the family)
