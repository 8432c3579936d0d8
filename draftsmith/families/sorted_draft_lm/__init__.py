from draftsmith.families.sorted_draft_lm import network  # noqa: F401  (registers the family)
