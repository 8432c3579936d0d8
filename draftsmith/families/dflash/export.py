"""DFlash's blocks for the export formats it has (vLLM, SGLang, speculators); DSpark's (``families/dflash/dspark/export.py``)
are these with its heads.

- z-lab's layout (vLLM 0.32 ``qwen3_dflash.py``, ``DFlashDraftModel``, ``model_type`` qwen3): ``dflash_config``
  {``mask_token_id``, ``target_layer_ids``}, target layer id i captured as HF ``hidden_states[i + 1]``; ``fc``,
  ``hidden_norm``, Qwen3 layers (``q_norm``/``k_norm``), ``norm``; embedding and head shared with the target when
  absent; an optional ``mask_embedding.pt`` ([H]) replaces the mask id's embedding (written only for a learned mask).
  SpecForge's ``DFlashDraftModel`` also loads it (with ``block_size``; it always embeds the masks as
  ``mask_token_id``, so it computes draftsmith's drafter only for ``mask_from_token``). vLLM norms the context keys
  for all layers in one call with the stacked ``k_norm`` weights; on CPU that call uses the first layer's weight for
  every layer, so only one-layer drafters export for vLLM's CPU build.
- SGLang (``--speculative-algorithm DFLASH``, ``--speculative-dflash-block-size``; z-lab's collaboration with LMSYS,
  2026) reads z-lab's layout with the masks embedded as ``dflash_config.mask_token_id``: only a drafter trained so
  (``model.mask_from_token: true``) is written. SpecForge's ``DFlashDraftModel`` (which trains drafters for SGLang)
  loads the dir and computes draftsmith's logits (tests/test_peers.py).
- speculators (``speculators_model_type: dflash``, speculators 0.9.0 ``models/dflash``: ``DFlashSpeculatorConfig``
  with a Qwen3 ``transformer_layer_config`` of the draft's layers, ``block_size`` = K + 1,
  ``aux_hidden_state_layer_ids`` (id k = HF ``hidden_states[k]``; vLLM's ``update_dflash`` maps them to its
  ``target_layer_ids`` k - 1), ``mask_token_id``, ``sample_from_anchor`` false: the anchor is the committed token,
  the K masks draft; ``sliding_window_non_causal`` true, which vLLM reads as "every layer bidirectional", see
  ``speculators_dir``). ``DFlashDraftModel`` holds ``fc``, ``hidden_norm``, ``layers.N.*`` (Qwen3 names,
  ``q_norm``/``k_norm``), ``norm``; it always reloads ``embed_tokens`` from the verifier and saves none, so its masks
  are the target's embedding of ``mask_token_id``: only a drafter trained so exports there, a learned mask embedding
  is refused.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.families.registry import exports
from draftsmith.layers.export import (
    SPECULATORS_VERSION,
    AuxIds,
    Source,
    cast,
    dtype_name,
    llama_config,
    speculators_config,
    write,
)

ZLAB_DFLASH_IDS = AuxIds(("dflash_config", "target_layer_ids"), 1)
"""z-lab's DFlash ids (vLLM, SGLang and SpecForge read them): target layer i's output, HF ``hidden_states[i + 1]``."""
SPECULATORS_DFLASH_IDS = AuxIds(("aux_hidden_state_layer_ids",), 0)
"""speculators' DFlash ids: id k = HF ``hidden_states[k]`` (vLLM's ``update_dflash`` maps them to z-lab's k - 1)."""


def zlab_dir(
    src: Source,
    out: Path,
    dtype: str | None,
    target: dict,
    fmt: str,
    heads: tuple[str, ...] = (),
    extra: dict | None = None,
) -> None:
    """A DFlash drafter in z-lab's layout (vLLM's, SGLang's and SpecForge's ``DFlashDraftModel``), plus
    ``mask_embedding.pt`` for a learned mask (which only vLLM reads). ``heads``: more tensor prefixes to write (a
    DSpark's heads); ``extra``: config keys over these (``dflash_config`` merged)."""
    cfg = src.network.cfg
    state = src.network.state_dict()
    keep = ("fc.", "hidden_norm.", "norm.", "layers.", *heads)
    tensors = cast({k: v for k, v in state.items() if k.startswith(keep)}, dtype)
    config = {
        **llama_config(cfg, target, cfg.vocab_size),
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "num_hidden_layers": cfg.num_layers,
        "target_hidden_size": cfg.target_hidden_size,
        "dflash_config": {
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": ZLAB_DFLASH_IDS.ids(cfg.feature_layers),
        },
        "block_size": cfg.depth + 1,  # z-lab's field, which SpecForge and SGLang read (vLLM takes K from its command)
        "num_target_layers": target["num_hidden_layers"],  # z-lab's too: SpecForge's class requires it
        "torch_dtype": dtype_name(tensors),
    }
    extra = dict(extra or {})
    config["dflash_config"] |= extra.pop("dflash_config", {})
    write(out, tensors, config | extra, fmt)
    if not cfg.mask_from_token:  # else every loader embeds the masks as mask_token_id, as the drafter does
        torch.save(state["mask_embedding"].to(tensors["fc.weight"].dtype), out / "mask_embedding.pt")


@exports("vllm", "dflash")
def vllm_dflash(src: Source, out: Path, dtype: str | None) -> dict:
    cfg = src.network.cfg
    target = src.target_config("vllm")
    bad = [k for k in cfg.feature_layers if not ZLAB_DFLASH_IDS.offset <= k < target["num_hidden_layers"]]
    if bad:
        raise DraftsmithError(
            f"vLLM feeds DFlash the outputs of target layers 0..{target['num_hidden_layers'] - 2} (HF hidden_states "
            f"1..{target['num_hidden_layers'] - 1}); this drafter reads hidden_states{bad}"
        )
    if cfg.num_layers > 1:
        raise DraftsmithError(
            f"vLLM 0.32's CPU build norms every DFlash layer's context keys with the first layer's k_norm, so a "
            f"{cfg.num_layers}-layer drafter would draft wrongly there: train num_layers: 1 to export for vLLM"
        )
    zlab_dir(src, out, dtype, target, "vllm")
    return {"method": "dflash", "model": str(out), "num_speculative_tokens": cfg.depth}


@exports("sglang", "dflash")
def sglang_dflash(src: Source, out: Path, dtype: str | None, k: int | None) -> dict:
    if not src.network.cfg.mask_from_token:
        raise DraftsmithError(
            "SGLang's and SpecForge's DFlash embed the masks as the target's embedding of mask_token_id; this drafter "
            "learned its own mask embedding: train it with model.mask_from_token: true to export here (vLLM's layout, "
            "--to vllm, carries a learned one)"
        )
    zlab_dir(src, out, dtype, src.target_config("sglang"), "sglang")
    return {"speculative-algorithm": "DFLASH", "speculative-dflash-block-size": src.network.cfg.depth + 1}


def speculators_dir(
    src: Source, out: Path, dtype: str | None, heads: tuple[str, ...] = (), extra: dict | None = None
) -> None:
    """The DFlash layout; ``heads``: more tensor prefixes to write and ``extra``: more config keys (a DSpark's)."""
    cfg = src.network.cfg
    if not cfg.mask_from_token:
        raise DraftsmithError(
            f"speculators' {src.method} embeds its masks as the target's embedding of mask_token_id and keeps no mask "
            "tensor; this drafter learned its own mask embedding: train it with model.mask_from_token: true to "
            "export here (vLLM's DFlash layout, --to vllm, carries a learned one)"
        )
    target = src.target_config("speculators")
    state = src.network.state_dict()
    keep = ("fc.", "hidden_norm.", "norm.", "layers.", *heads)
    tensors = cast({k: v for k, v in state.items() if k.startswith(keep)}, dtype)
    layer = llama_config(cfg, target, cfg.vocab_size) | {"model_type": "qwen3", "num_hidden_layers": cfg.num_layers}
    config = {
        "architectures": ["DFlashDraftModel"],
        "speculators_model_type": "dflash",
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": speculators_config(src, target, cfg.depth),
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg.vocab_size,
        "block_size": cfg.depth + 1,
        "target_hidden_size": cfg.target_hidden_size,
        "aux_hidden_state_layer_ids": SPECULATORS_DFLASH_IDS.ids(cfg.feature_layers),
        "mask_token_id": cfg.mask_token_id,
        "sample_from_anchor": False,
        # no sliding-window layers, so speculators reads the same either way (its full-attention layers are always
        # bidirectional); vLLM 0.32's update_dflash turns false, speculators' default, into dflash_config.causal
        # true for every layer: a drafter trained bidirectionally then drafts causally there (measured: other
        # drafts and 37 accepted tokens where the verifier's drafter had 39; tests/test_export_vllm.py)
        "sliding_window_non_causal": True,
        "torch_dtype": dtype_name(tensors),
    }
    write(out, tensors, config | (extra or {}), "speculators")


@exports("speculators", "dflash")
def speculators_dflash(src: Source, out: Path, dtype: str | None, k: int | None) -> None:
    speculators_dir(src, out, dtype)
