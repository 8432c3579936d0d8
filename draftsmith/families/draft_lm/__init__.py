from draftsmith.families.draft_lm import network  # noqa: F401  (registers the family)
