from draftsmith.families.medusa import export, network  # noqa: F401  (registers the family and its export hooks)
