"""draftsmith: train draft models for speculative decoding and prove their speedup."""

__version__ = "0.1.0"
