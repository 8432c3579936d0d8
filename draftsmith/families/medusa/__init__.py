from draftsmith.families.medusa import network  # noqa: F401  (registers the family)
