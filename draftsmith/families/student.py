"""The causal-LM student that the draft LM, PARD and S2D families train: a fresh Llama of a ``StudentShape`` for a
target's tokens, or a trained one loaded and checked against the target (``model.init``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedModel

from draftsmith.core.fingerprint import tokenizer_hash
from draftsmith.core.target import Target
from draftsmith.errors import DraftsmithError


@dataclass(frozen=True)
class StudentShape:
    """A freshly initialised Llama student (used when ``init`` is None)."""

    layers: int = 2
    """Decoder layers."""
    hidden: int = 128
    """Hidden size."""
    heads: int = 2
    """Attention heads."""
    intermediate: int = 384
    """MLP width."""
    tie_embeddings: bool = False
    """Share the input embedding and the LM head."""


def fresh_config(target: Target, shape: StudentShape) -> dict:
    """The HF config (as a dict) of a fresh Llama student of ``shape`` for ``target``'s tokens."""
    s, t = shape, target.config
    cfg = LlamaConfig(
        vocab_size=target.vocab_size,
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.heads,
        max_position_embeddings=t.max_position_embeddings,
        bos_token_id=t.bos_token_id,
        eos_token_id=t.eos_token_id,
        pad_token_id=t.pad_token_id,
        tie_word_embeddings=s.tie_embeddings,
    )
    return json.loads(cfg.to_json_string(use_diff=False))


def load_student(path: Path, target: Target) -> PreTrainedModel:
    """The causal LM ``model.init`` names (an HF dir, or a draft LM checkpoint / native export), in train mode,
    checked against ``target`` (vocabulary and tokenizer)."""
    from draftsmith.core.native import is_native
    from draftsmith.families.registry import load_network

    if not path.exists():
        raise DraftsmithError(f"model.init: {path} does not exist")
    if path.suffix == ".ckpt" or is_native(path):
        network, info = load_network(path, target)
        if info["method"] != "draft_lm":
            raise DraftsmithError(f"model.init: {path} holds a {info['method']} drafter, not a draft_lm")
        return network.merged().model.train()
    if not (path / "config.json").is_file():
        raise DraftsmithError(f"model.init: {path} is not a model directory, checkpoint or native export")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    vocab = model.get_output_embeddings().weight.shape[0]
    if vocab != target.vocab_size:
        raise DraftsmithError(f"model.init: {path} has {vocab} output tokens, the target {target.vocab_size}")
    has_tokenizer = (path / "tokenizer_config.json").is_file() and target.tokenizer is not None
    if has_tokenizer and tokenizer_hash(AutoTokenizer.from_pretrained(path)) != tokenizer_hash(target.tokenizer):
        raise DraftsmithError(f"model.init: {path} has another tokenizer than the target")
    return model.train()
