"""Scoring drafters by real speculative decoding (``decode``) beside plain decoding, and their reports."""
