from draftsmith.families.kangaroo import network  # noqa: F401  (registers the family)
