"""Cross-vocabulary drafting: a draft LM with another tokenizer, its drafts translated through text."""
