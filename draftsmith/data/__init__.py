"""Prompts, on-policy data generation, the default target's corpus."""
