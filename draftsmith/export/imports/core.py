"""What every importer shares: reading a checkpoint dir, the target it is checked against, the checks and shaping of
a decoder layer draftsmith computes, and writing the native drafter.

A checkpoint dir is a ``config.json`` beside its tensors (``model.safetensors``, a sharded safetensors index or
``pytorch_model.bin``). A grouped-query layer (``num_key_value_heads`` < heads) is imported exactly: each key/value
head's projection rows are repeated for the query heads that share it. What draftsmith's layers cannot compute (RoPE
scaling, biases) is refused with one line naming the config field, never approximated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from transformers import AutoConfig

from draftsmith.core.files import made_whole
from draftsmith.core.native import save_native
from draftsmith.errors import DraftsmithError
from draftsmith.export.common import target_fingerprint
from draftsmith.layers.shape import LayerShape


def read_weights(src: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint dir: ``model.safetensors``, a sharded safetensors index, or
    ``pytorch_model.bin`` (the original EAGLE releases); a missing shard or an unreadable file is one line."""
    index = src / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (src / s).is_file()]
        if missing:
            raise DraftsmithError(
                f"{index}: names {len(missing)} missing shard(s), e.g. {missing[0]} (a partial download?)"
            )
        files = [src / s for s in shards]
    elif (src / "model.safetensors").is_file():
        files = [src / "model.safetensors"]
    elif (src / "pytorch_model.bin").is_file():
        return torch.load(src / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise DraftsmithError(f"{src}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")
    state = {}
    for f in files:
        state.update(load_safetensors(f))
    return state


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """One safetensors file; an unreadable one is one line."""
    try:
        return load_file(path)
    except SafetensorError as e:
        raise DraftsmithError(f"{path}: cannot read the weights (truncated or corrupt: {e})") from None


@dataclass
class Checkpoint:
    """A drafter checkpoint dir: its ``config.json`` and (read on first use: Medusa's keep theirs elsewhere) its
    tensors."""

    src: Path
    config: dict

    @cached_property
    def state(self) -> dict[str, torch.Tensor]:
        return read_weights(self.src)


def read_checkpoint(src: Path) -> Checkpoint:
    if not (src / "config.json").is_file():
        raise DraftsmithError(f"{src}: no config.json (not a drafter checkpoint dir)")
    try:
        return Checkpoint(src, json.loads((src / "config.json").read_text()))
    except json.JSONDecodeError as e:
        raise DraftsmithError(f"{src / 'config.json'} is not valid JSON ({e.msg})") from None


@dataclass
class ImportTarget:
    """The target an import is checked against and recorded for."""

    dir: Path
    """Its model directory."""
    dtype: str
    """The dtype it computes in (the target spec's, ``auto`` resolved), recorded in the drafter's fingerprint."""
    name: str
    """As the user named it (``smollm2``, a directory), for the printed ``score`` command."""

    @cached_property
    def config(self):
        return AutoConfig.from_pretrained(self.dir)


def check_target(config: dict, layer: dict, state: dict, layers, tcfg, where: str) -> None:
    """Refuse a checkpoint trained for another target, naming each field that differs."""
    num_layers, hidden, vocab = tcfg.num_hidden_layers, tcfg.hidden_size, tcfg.vocab_size
    differs = []
    if layer.get("vocab_size", vocab) != vocab:
        differs.append(f"vocabulary {layer['vocab_size']} vs the target's {vocab}")
    trained_hidden = config.get("target_hidden_size") or layer.get("hidden_size")
    if trained_hidden != hidden:
        differs.append(f"target hidden size {trained_hidden} vs the target's {hidden}")
    if "fc.weight" in state and state["fc.weight"].shape[1] != len(layers) * hidden:
        differs.append(f"fc input {state['fc.weight'].shape[1]} vs {len(layers)} feature layers x {hidden}")
    if not all(0 <= k <= num_layers for k in layers):
        differs.append(f"feature layers {list(layers)} vs the target's {num_layers} layers")
    if differs:
        raise DraftsmithError(f"{where} was trained for another target: {'; '.join(differs)}")


def target_embedding(target: Path) -> torch.Tensor:
    """The target's input embedding, read from its safetensors files without loading the model."""
    return target_tensor(target, ("embed_tokens.weight", "wte.weight"))


def target_tensor(target: Path, suffixes: tuple[str, ...], tied: torch.Tensor | None = None) -> torch.Tensor:
    """The target's tensor whose name ends with one of ``suffixes``, read from its safetensors files without loading
    the model; ``tied`` where it has none (tied word embeddings)."""
    for f in sorted(target.glob("*.safetensors")):
        with safe_open(f, framework="pt") as g:
            for key in g.keys():  # noqa: SIM118 (safe_open has no __iter__)
                if key.endswith(suffixes):
                    return g.get_tensor(key)
    if tied is not None:
        return tied
    raise DraftsmithError(f"{target}: no {'/'.join(suffixes)} tensor in its safetensors files (the drafter ships none)")


def check_layer(layer: dict, where: str, family: str) -> None:
    """Refuse a decoder layer draftsmith's ``family`` layer does not compute (RoPE scaling, biases), naming the
    field."""
    rope = layer.get("rope_scaling") or layer.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise DraftsmithError(
            f"{where}: rope_type {rope.get('rope_type', rope.get('type'))!r} (draftsmith's {family} layer has plain RoPE)"
        )
    for flag in ("attention_bias", "mlp_bias"):
        if layer.get(flag):
            raise DraftsmithError(f"{where}: {flag}=true (draftsmith's {family} layer has no biases)")


def layer_shape(cfg, layer: dict):
    """``cfg`` (an EAGLE or DFlash config) with its decoder layers shaped as the checkpoint's ``layer`` config."""
    heads, base = layer["num_attention_heads"], cfg.shape
    rope = layer.get("rope_parameters") or {}
    cfg.shape = LayerShape(
        hidden_size=layer["hidden_size"],
        num_attention_heads=heads,
        head_dim=layer.get("head_dim") or layer["hidden_size"] // heads,
        intermediate_size=layer["intermediate_size"],
        rms_norm_eps=layer.get("rms_norm_eps", base.rms_norm_eps),
        rope_theta=rope.get("rope_theta", layer.get("rope_theta", base.rope_theta)),
        max_position_embeddings=layer.get("max_position_embeddings", base.max_position_embeddings),
    )
    return cfg


def repeat_kv(weight: torch.Tensor, kv_heads: int, heads: int) -> torch.Tensor:
    """A grouped k/v projection (kv_heads * hd, in) as the equal per-query-head one (heads * hd, in)."""
    hd = weight.shape[0] // kv_heads
    return weight.view(kv_heads, hd, -1).repeat_interleave(heads // kv_heads, dim=0).reshape(heads * hd, -1)


def ungroup_kv(weights: dict, layer: dict) -> None:
    """Every k/v projection of ``weights`` (in place) as per query head, where the checkpoint's ``layer`` config has
    grouped-query attention (draftsmith's layers have one k/v head per query head)."""
    heads = layer["num_attention_heads"]
    kv_heads = layer.get("num_key_value_heads") or heads
    if kv_heads == heads:
        return
    for name in list(weights):
        if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            weights[name] = repeat_kv(weights[name], kv_heads, heads)


def load_weights(network, weights: dict, where: str, family: str) -> None:
    """``weights`` into ``network`` (floats as float32); a size mismatch, a missing or an extra tensor is one line."""
    try:
        result = network.load_state_dict(
            {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}, strict=False
        )
    except RuntimeError as e:  # a size mismatch
        raise DraftsmithError(f"{where}: {str(e).splitlines()[-1].strip()}") from None
    missing = [k for k in result.missing_keys if not k.startswith("rotary.")]
    if result.unexpected_keys or missing:
        raise DraftsmithError(
            f"{where}: tensors that do not fit draftsmith's {family}: missing {missing}, "
            f"unexpected {result.unexpected_keys}"
        )


def write_imported(network, ckpt: Checkpoint, layout: str, target: ImportTarget, out: Path, what: str) -> Path:
    """The native dir for ``target`` in its dtype, recording where it came from; prints how to score it."""
    fingerprint = target_fingerprint(target.dir, target.dtype)
    record = {"imported_from": {"path": str(ckpt.src), "layout": layout}}
    made_whole(out, lambda tmp: save_native(network, SimpleNamespace(fingerprint=fingerprint), tmp, record))
    print(f"import: {ckpt.src} ({layout}, {what}) -> {out}")
    print(f"score it: draftsmith score --target {target.name}:{target.dtype} --drafter imported={out}")
    return out
