from draftsmith.families.acceptance_head import network  # noqa: F401  (registers the family)
