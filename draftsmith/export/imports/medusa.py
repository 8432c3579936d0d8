"""Medusa heads -> native ``medusa1`` drafters, in two layouts.

- ``vllm``: vLLM's ``MedusaModel`` (``model_type: medusa``, ``blocks.{i}.layers.{j}``, ``lm_heads.{i}``: draftsmith's
  vLLM export).
- ``medusa``: the Medusa repository's (FasterDecoding/Medusa ``medusa_model.py``, also what TGI reads):
  ``config.json`` with ``medusa_num_heads`` / ``medusa_num_layers`` and ``medusa_lm_head.safetensors`` or ``.pt``
  holding ``medusa_head``'s state, head i = ``nn.Sequential(ResBlock x layers, Linear(H, V))``: keys
  ``{i}.{j}.linear.{weight,bias}`` and ``{i}.{layers}.weight``.

Head i reads the target's last (normed) hidden state and predicts the token i + 2 ahead, as draftsmith's Medusa does.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.export.imports.core import Checkpoint, ImportTarget, load_safetensors, write_imported


def medusa_weights(src: Path) -> dict[str, torch.Tensor]:
    if (src / "medusa_lm_head.safetensors").is_file():
        return load_safetensors(src / "medusa_lm_head.safetensors")
    if (src / "medusa_lm_head.pt").is_file():
        return torch.load(src / "medusa_lm_head.pt", map_location="cpu", weights_only=True)
    raise DraftsmithError(f"{src}: a Medusa config without medusa_lm_head.safetensors or medusa_lm_head.pt")


def medusa_tensors(ckpt: Checkpoint, layout: str) -> tuple[int, int, dict]:
    """(heads, blocks per head, draftsmith's Medusa tensors, None where the checkpoint lacks one) of Medusa heads in
    the Medusa repository's layout or vLLM's (``MedusaModel``: ``blocks.{i}.layers.{j}``, ``lm_heads.{i}``; without
    ``medusa_fc_bias`` vLLM's blocks have no bias: zeros)."""
    src, config = ckpt.src, ckpt.config
    if layout == "medusa":
        heads, layers = config["medusa_num_heads"], config.get("medusa_num_layers", 1)
        state, ours = medusa_weights(src), {}
        for i in range(heads):
            for j in range(layers):
                for kind in ("weight", "bias"):
                    ours[f"blocks.{i}.layers.{j}.{kind}"] = state.get(f"{i}.{j}.linear.{kind}")
            ours[f"lm_heads.{i}.weight"] = state.get(f"{i}.{layers}.weight")
        return heads, layers, ours
    heads, layers, vocab = config.get("num_heads"), config.get("num_hidden_layers", 1), config.get("vocab_size")
    if config.get("truncated_vocab_size", vocab) != vocab:
        raise DraftsmithError(
            f"{src} (vLLM Medusa layout): truncated_vocab_size {config['truncated_vocab_size']} < vocab_size {vocab} "
            "(draftsmith's Medusa heads predict the whole vocabulary); not imported"
        )
    state, ours = ckpt.state, {}
    for i in range(heads or 0):
        for j in range(layers):
            weight = ours[f"blocks.{i}.layers.{j}.weight"] = state.get(f"blocks.{i}.layers.{j}.weight")
            bias = state.get(f"blocks.{i}.layers.{j}.bias")  # read by vLLM only with medusa_fc_bias (default off)
            if not config.get("medusa_fc_bias") and weight is not None:
                bias = weight.new_zeros(len(weight))
            ours[f"blocks.{i}.layers.{j}.bias"] = bias
        ours[f"lm_heads.{i}.weight"] = state.get(f"lm_heads.{i}.weight")
    return heads, layers, ours


def import_medusa(ckpt: Checkpoint, layout: str, target: ImportTarget, out: Path) -> Path:
    """Medusa heads (the Medusa repository's layout or vLLM's, see ``medusa_tensors``) -> a native medusa1
    drafter."""
    from draftsmith.families.registry import build_network

    heads, layers, ours = medusa_tensors(ckpt, layout)
    where = f"{ckpt.src} ({layout} Medusa layout)"
    if not heads:
        raise DraftsmithError(f"{where}: no num_heads in config.json")
    tcfg = target.config
    head = ours.get("lm_heads.0.weight")
    if head is None:
        raise DraftsmithError(f"{where}: no LM head for head 0 (medusa_num_layers / num_hidden_layers={layers}?)")
    if tuple(head.shape) != (tcfg.vocab_size, tcfg.hidden_size):
        raise DraftsmithError(
            f"{where} was trained for another target: LM head {tuple(head.shape)} vs the target's "
            f"(vocabulary {tcfg.vocab_size}, hidden size {tcfg.hidden_size})"
        )
    network = build_network(
        "medusa1",
        {"num_heads": heads, "num_layers": layers, "hidden_size": tcfg.hidden_size, "vocab_size": tcfg.vocab_size},
    )
    missing = [k for k, v in ours.items() if v is None]
    if missing:
        raise DraftsmithError(f"{where}: missing tensors for {missing[:3]} ({heads} heads)")
    try:
        network.load_state_dict({k: v.float() for k, v in ours.items()})
    except RuntimeError as e:
        raise DraftsmithError(f"{where}: {str(e).splitlines()[-1].strip()}") from None
    return write_imported(network, ckpt, layout, target, out, f"{heads} heads x {layers} blocks")
