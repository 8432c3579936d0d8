from draftsmith.families.draft_lm import export, network  # noqa: F401  (registers the family and its export hooks)
