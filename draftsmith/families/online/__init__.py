"""Online speculative decoding: a draft LM that learns while it serves."""
