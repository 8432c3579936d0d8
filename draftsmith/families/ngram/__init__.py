"""The n-gram (prompt lookup) drafter: no network, nothing to train."""
