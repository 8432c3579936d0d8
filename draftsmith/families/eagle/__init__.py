from draftsmith.families.eagle import export, network  # noqa: F401  (registers the family and its export hooks)
