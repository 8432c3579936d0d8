"""Lightning training of drafters against a frozen target."""
