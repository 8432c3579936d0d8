from draftsmith.families.hydra import network  # noqa: F401  (registers the family)
