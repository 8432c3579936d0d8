from draftsmith.families.falcon import network  # noqa: F401  (registers the family)
