"""DFlash and DSpark checkpoints (a DFlash backbone, DSpark's with its heads) -> native ``dflash`` / ``dspark``
drafters.

DFlash in the speculators layout (vllm-project/speculators, ``speculators_model_type: dflash``: ``fc``,
``hidden_norm``, Qwen3 layers, ``norm``; block size, ``aux_hidden_state_layer_ids``, ``mask_token_id``) becomes a
native ``dflash`` drafter whose masks are the target's embedding of ``mask_token_id`` (``mask_from_token``), as
speculators computes them. DFlash in z-lab's layout (``architectures: DFlashDraftModel`` with ``dflash_config``:
what z-lab releases, vLLM and SGLang serve and SpecForge trains; its ``target_layer_ids`` i = HF
``hidden_states[i + 1]``) likewise, or with the learned mask of a ``mask_embedding.pt`` beside it (draftsmith's own
vLLM export). DSpark (``speculators_model_type: dspark``, or z-lab's layout with ``markov_head.*`` tensors) is
DFlash's import of the backbone, then its heads as ``export/dspark.py`` reads them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.export import dspark
from draftsmith.export.eagle_layout import SPECULATORS_DFLASH_IDS, ZLAB_DFLASH_IDS
from draftsmith.export.imports.core import (
    Checkpoint,
    ImportTarget,
    check_layer,
    check_target,
    layer_shape,
    load_weights,
    target_embedding,
    target_tensor,
    ungroup_kv,
    write_imported,
)


def dflash_fields(config: dict, layout: str) -> tuple[dict, dict]:
    """A DFlash checkpoint's layer config and its fields in one convention, by its layout (``speculators`` or
    ``z-lab``: vLLM's, SGLang's, SpecForge's): ``layers`` (HF ``hidden_states`` indices), ``mask``, ``block``,
    ``draft_vocab``, ``sample_from_anchor``."""
    if layout == "speculators":
        layer = config["transformer_layer_config"]
        return (
            layer,
            {
                "layers": SPECULATORS_DFLASH_IDS.read(config),
                "mask": config.get("mask_token_id"),
                "block": config.get("block_size"),
                "draft_vocab": config.get("draft_vocab_size", layer.get("vocab_size")),
                "sample_from_anchor": config.get("sample_from_anchor", False),
            },
        )
    dflash = config["dflash_config"]
    return (
        config,
        {
            "layers": ZLAB_DFLASH_IDS.read(config),
            "mask": dflash.get("mask_token_id"),
            "block": config.get("block_size"),
            "draft_vocab": config.get("draft_vocab_size", config.get("vocab_size")),
            "sample_from_anchor": dflash.get("sample_from_anchor", config.get("sample_from_anchor", False)),
        },
    )


def import_dflash(ckpt: Checkpoint, layout: str, target: ImportTarget, out: Path) -> Path:
    """A DFlash checkpoint in the speculators or z-lab layout -> a native dflash drafter (see the module docstring)."""
    from draftsmith.families.dflash.network import DFlashModel

    cfg, weights, where = dflash_parts(ckpt, layout, target, "DFlash")
    network = DFlashModel(cfg)
    load_weights(network, weights, where, "DFlash")
    what = f"DFlash, {cfg.num_layers} layers, block {cfg.depth + 1}, feature layers {list(cfg.feature_layers)}"
    return write_imported(network, ckpt, layout, target, out, what)


def dflash_parts(ckpt: Checkpoint, layout: str, target: ImportTarget, family: str):
    """A DFlash-backbone checkpoint (DFlash, DSpark) checked against the target: (its ``DFlashConfig``, the backbone's
    weights with the target's embedding and head where it ships none, where it came from for messages)."""
    from draftsmith.families.dflash.network import DFlashConfig

    src, config, state = ckpt.src, ckpt.config, ckpt.state
    layer, fields = dflash_fields(config, layout)
    where = f"{src} ({layout} {family})"
    check_layer(layer, where, family)
    if fields["sample_from_anchor"]:
        raise DraftsmithError(f"{where}: sample_from_anchor=true (draftsmith's {family} drafts only from its masks)")
    if "sliding_attention" in (layer.get("layer_types") or []):
        raise DraftsmithError(f"{where}: sliding-window layers (layer_types); draftsmith's DFlash attends fully")
    tcfg = target.config
    vocab = tcfg.vocab_size
    layers, mask, block = fields["layers"], fields["mask"], fields["block"]
    if layers is None or mask is None or not block or block < 2:
        raise DraftsmithError(
            f"{where}: a DFlash checkpoint needs its feature layers, mask_token_id and block_size >= 2 "
            f"(got {layers}, {mask}, {block})"
        )
    check_target(config, layer, state, layers, tcfg, where)
    if (fields["draft_vocab"] or vocab) != vocab:
        raise DraftsmithError(
            f"{where}: a {fields['draft_vocab']}-token draft vocabulary; draftsmith's DFlash drafts over the "
            f"target's whole {vocab}"
        )
    missing = [k for k in ("fc.weight", "hidden_norm.weight", "norm.weight") if k not in state]
    if missing:
        raise DraftsmithError(f"{where}: missing tensors {missing}")
    cfg = layer_shape(DFlashConfig.from_target(tcfg, tuple(layers), block - 1, layer["num_hidden_layers"]), layer)
    learned = src / "mask_embedding.pt"  # draftsmith's vLLM export of a learned mask
    cfg.mask_token_id, cfg.mask_from_token = int(mask), not learned.is_file()
    weights = {k: v for k, v in state.items() if k.startswith(("fc.", "hidden_norm.", "norm.", "layers."))}
    ungroup_kv(weights, layer)
    embed = state.get("embed_tokens.weight")
    embed = target_embedding(target.dir) if embed is None else embed
    head = state.get("lm_head.weight")
    head = target_tensor(target.dir, ("lm_head.weight",), tied=embed) if head is None else head
    mask_embedding = torch.load(learned, map_location="cpu", weights_only=True) if learned.is_file() else embed[mask]
    weights |= {"embed_tokens.weight": embed, "lm_head.weight": head, "mask_embedding": mask_embedding}
    return cfg, weights, where


def import_dspark(ckpt: Checkpoint, layout: str, target: ImportTarget, out: Path) -> Path:
    """A DSpark checkpoint in the speculators layout or z-lab's (SpecForge's, vLLM's) -> a native dspark drafter:
    DFlash's import of the backbone, then the heads."""
    from draftsmith.families.dflash.dspark.network import DSparkConfig, DSparkModel
    from draftsmith.families.registry import extended

    backbone, weights, where = dflash_parts(ckpt, layout, target, "DSpark")
    cfg = extended(backbone, DSparkConfig, **dspark.read_heads(ckpt.config, where))
    state = ckpt.state
    heads = {k: v for k, v in state.items() if k.startswith(dspark.HEADS)}
    network = DSparkModel(cfg)
    load_weights(network, weights | heads, where, "DSpark")
    what = f"DSpark, {cfg.num_layers} layers, block {cfg.depth + 1}, Markov rank {cfg.markov_rank}"
    return write_imported(network, ckpt, layout, target, out, what)
