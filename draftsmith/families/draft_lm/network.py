"""The draft LM family's network: ``layers.causal_lm``'s ``DraftLMNetwork``, registered as ``draft_lm``."""

from __future__ import annotations

from draftsmith.families.registry import register
from draftsmith.layers.causal_lm import DraftLMConfig, DraftLMNetwork

register("draft_lm", config=DraftLMConfig)(DraftLMNetwork)
