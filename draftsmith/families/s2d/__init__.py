from draftsmith.families.s2d import network  # noqa: F401  (registers the family)
