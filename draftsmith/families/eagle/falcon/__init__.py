from draftsmith.families.eagle.falcon import export, network  # noqa: F401  (registers the family and why no engine serves it)
