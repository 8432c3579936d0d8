"""PARD draft LMs as vLLM serves them (``{"method": "draft_model", "parallel_drafting": true}``) -> native ``pard``
drafters.

Any HF causal LM whose config names its placeholder ``pard_token`` (AMD's PARD releases, draftsmith's vLLM export;
depth ``num_depths``, else 8), loaded by ``from_pretrained`` and checked against the target's vocabulary and
tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.export.imports.core import Checkpoint, ImportTarget, write_imported

PARD_DEPTH = 8
"""The depth given a PARD checkpoint that records none (vLLM takes K from its serve command, not the checkpoint;
a drafter drafts fewer when asked)."""


def import_pard(ckpt: Checkpoint, layout: str, target: ImportTarget, out: Path) -> Path:
    """A PARD draft LM as vLLM serves it (any HF causal LM whose config names its placeholder ``pard_token``: AMD's
    PARD releases, draftsmith's vLLM export) -> a native ``pard`` drafter, loaded by ``from_pretrained`` and checked
    against the target (vocabulary, tokenizer when it ships one)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftsmith.core.fingerprint import tokenizer_hash
    from draftsmith.families.pard.network import PardConfig, PardNetwork

    src, config, tcfg = ckpt.src, ckpt.config, target.config
    where = f"{src} (PARD: a causal LM with pard_token)"
    if config.get("vocab_size") != tcfg.vocab_size:
        raise DraftsmithError(
            f"{where} was trained for another target: vocabulary {config.get('vocab_size')} vs the target's "
            f"{tcfg.vocab_size}"
        )
    token = config["pard_token"]
    if not (isinstance(token, int) and 0 <= token < tcfg.vocab_size):
        raise DraftsmithError(f"{where}: pard_token {token!r} is not a token id below the vocabulary {tcfg.vocab_size}")
    both = all((d / "tokenizer_config.json").is_file() for d in (src, target.dir))
    if both and tokenizer_hash(AutoTokenizer.from_pretrained(src)) != tokenizer_hash(
        AutoTokenizer.from_pretrained(target.dir)
    ):
        raise DraftsmithError(f"{where} was trained for another target: its tokenizer differs from the target's")
    try:
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as e:
        raise DraftsmithError(f"{where}: transformers cannot load it ({str(e).splitlines()[0]})") from None
    depth = config.get("num_depths") or PARD_DEPTH
    hf_config = json.loads(model.config.to_json_string(use_diff=False))
    network = PardNetwork(PardConfig(hf_config, token, int(depth)), model.eval())
    what = f"PARD draft LM, placeholder token {token}, depth {depth}" + (
        "" if config.get("num_depths") else " (assumed)"
    )
    return write_imported(network, ckpt, layout, target, out, what)
