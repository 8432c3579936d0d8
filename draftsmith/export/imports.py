"""Drafters trained elsewhere -> draftsmith native dirs (``draftsmith import``), checked against the target.

EAGLE-3 checkpoints in the layouts the field writes, each read as its own loader reads it:

- ``speculators``: vllm-project/speculators (``speculators_model_type: eagle3``; ``layers.0.*``; aux ids
  ``eagle_aux_hidden_state_layer_ids`` in vLLM numbering: id k = HF ``hidden_states[k]``).
- ``sglang``: SGLang's ``LlamaForCausalLMEagle3``, which SpecForge trains and writes and the original EAGLE
  repository (SafeAILab) released its EAGLE-3 checkpoints in (``midlayer.*``; aux ids in
  ``eagle_config.eagle_aux_hidden_state_layer_ids``, SGLang numbering: id k = HF ``hidden_states[k + 1]``).
- ``vllm``: vLLM's ``Eagle3LlamaForCausalLM`` (``layers.0.*``; top-level aux ids, vLLM numbering).
- ``specforge``: SpecForge's ``PEagleDraftModel`` (``layers.0.*``, flat Llama config; aux ids as the top-level ones
  when present, else in ``eagle_config``, SGLang numbering).

PARD as vLLM serves it (``{"method": "draft_model", "parallel_drafting": true}``): any HF causal LM whose config
names its placeholder ``pard_token`` (AMD's PARD releases, draftsmith's vLLM export; depth ``num_depths``, else 8),
loaded by ``from_pretrained`` and checked against the target's vocabulary and tokenizer -> a native ``pard`` drafter.

P-EAGLE (EAGLE-3's tensors plus ``mask_hidden``, the placeholder's stand-in feature, and a placeholder token id) in
the speculators layout (``speculators_model_type: peagle``, ``mask_token_id``, the depth its greedy proposal
drafts), in vLLM's (``pard_token`` or ``mask_token_id``; ``num_depths`` where draftsmith wrote it) and in SpecForge's
(``architectures: PEagleDraftModel``; SpecForge keeps the token in its training config, so ``mask_token_id`` must be
added to config.json, one line says so; depth ``num_depths``, else SpecForge's training default 8) becomes a native
``peagle`` drafter, keeping the checkpoint's own token embedding (SpecForge trains it); DFlash in the
speculators layout (``speculators_model_type: dflash``: ``fc``, ``hidden_norm``, Qwen3 layers, ``norm``; block size,
``aux_hidden_state_layer_ids``, ``mask_token_id``) a native ``dflash`` drafter whose masks are the target's embedding
of ``mask_token_id`` (``mask_from_token``), as speculators computes them. DFlash in z-lab's layout (``architectures:
DFlashDraftModel`` with ``dflash_config``: what z-lab releases, vLLM and SGLang serve and SpecForge trains; its
``target_layer_ids`` i = HF ``hidden_states[i + 1]``) likewise, or with the learned mask of a ``mask_embedding.pt``
beside it (draftsmith's own vLLM export).

Medusa heads in vLLM's layout (``model_type: medusa``, ``blocks.{i}.layers.{j}``, ``lm_heads.{i}``: draftsmith's
vLLM export) and in the Medusa repository's layout (FasterDecoding/Medusa ``medusa_model.py``, also what TGI
reads): ``config.json`` with ``medusa_num_heads`` / ``medusa_num_layers`` and ``medusa_lm_head.safetensors`` or
``.pt`` holding ``medusa_head``'s state, head i = ``nn.Sequential(ResBlock x layers, Linear(H, V))``: keys
``{i}.{j}.linear.{weight,bias}`` and ``{i}.{layers}.weight``; head i reads the target's last (normed) hidden state
and predicts the token i + 2 ahead, as draftsmith's Medusa does.

``import_drafter`` detects what a checkpoint holds (``detect``: its family and layout) and hands it to that family's
importer (``IMPORTERS``). The EAGLE-3 layouts' facts (the decoder layer's tensor prefix, where the aux ids are and
how they are numbered) are ``eagle_layout.LAYOUTS``, the table the exporters write by. Without aux ids every loader
captures HF ``hidden_states`` (2, L/2, L-3) (``eagle_layout.loader_default_layers``). A grouped-query layer
(``num_key_value_heads`` < heads) is imported exactly: each key/value head's projection rows are repeated for
the query heads that share it. What draftsmith's EAGLE-3 layer cannot compute (another norm placement, RoPE
scaling, biases) is refused with one line naming the config field, never approximated.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from transformers import AutoConfig

from draftsmith.core.files import made_whole, refuse_existing
from draftsmith.core.native import save_native
from draftsmith.errors import DraftsmithError
from draftsmith.export import dspark
from draftsmith.export.common import target_fingerprint
from draftsmith.export.eagle_layout import (
    EAGLE3_NORM_FLAGS,
    LAYOUTS,
    SPECULATORS_DFLASH_IDS,
    ZLAB_DFLASH_IDS,
    feature_layers,
    read_layer_tensors,
    stack_indices,
    vocab_maps,
)
from draftsmith.families.eagle.network import Eagle3Config, EagleModel
from draftsmith.families.peagle.network import PEagleConfig, PEagleModel


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


@dataclass
class Checkpoint:
    """A drafter checkpoint dir: its ``config.json`` and (read on first use: Medusa's keep theirs elsewhere) its
    tensors."""

    src: Path
    config: dict

    @cached_property
    def state(self) -> dict[str, torch.Tensor]:
        return read_weights(self.src)


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


@dataclass(frozen=True)
class Detected:
    """What a checkpoint holds: its family (which importer reads it) and the layout it is in."""

    family: str
    """``eagle3`` (EAGLE-3 and P-EAGLE), ``dflash``, ``dspark``, ``pard`` or ``medusa``."""
    layout: str
    """eagle3: a ``LAYOUTS`` name; dflash and dspark: ``speculators`` or ``z-lab``; pard: ``vllm``; medusa: ``medusa`` (the
    Medusa repository's) or ``vllm``."""


def read_checkpoint(src: Path) -> Checkpoint:
    if not (src / "config.json").is_file():
        raise DraftsmithError(f"{src}: no config.json (not a drafter checkpoint dir)")
    try:
        return Checkpoint(src, json.loads((src / "config.json").read_text()))
    except json.JSONDecodeError as e:
        raise DraftsmithError(f"{src / 'config.json'} is not valid JSON ({e.msg})") from None


def detect(ckpt: Checkpoint) -> Detected:
    """The family and layout of a checkpoint, from its config and tensor names (see the module docstring)."""
    config = ckpt.config
    if "medusa_num_heads" in config:
        return Detected("medusa", "medusa")
    if config.get("model_type") == "medusa":
        return Detected("medusa", "vllm")
    state = ckpt.state
    if "pard_token" in config and "fc.weight" not in state and "mask_hidden" not in state:
        return Detected("pard", "vllm")  # a causal LM with a placeholder token (not P-EAGLE's)
    # DSpark before DFlash (its checkpoints are DFlash's plus heads), DFlash before the EAGLE layouts: z-lab's tensors
    # look like vLLM's EAGLE-3
    if config.get("speculators_model_type") == "dspark":
        return Detected("dspark", "speculators")
    if "dflash_config" in config and "markov_head.markov_w1.weight" in state:
        return Detected("dspark", "z-lab")
    if config.get("speculators_model_type") == "dflash":
        return Detected("dflash", "speculators")
    if "dflash_config" in config:
        return Detected("dflash", "z-lab")
    return Detected("eagle3", eagle_layout_of(config, state))


def eagle_layout_of(config: dict, state: dict) -> str:
    """Which EAGLE-3 layout (``LAYOUTS``) a checkpoint is in, from its config and tensor names."""
    if config.get("speculators_model_type") is not None:
        kind = config["speculators_model_type"]
        if kind not in ("eagle3", "peagle"):
            raise DraftsmithError(
                f"speculators_model_type {kind!r}: only eagle3, peagle, dflash and dspark checkpoints are imported"
            )
        return "speculators"
    if any(k.startswith(LAYOUTS["sglang"].prefix) for k in state):
        return "sglang"
    if "PEagleDraftModel" in (config.get("architectures") or []):
        return "specforge"
    if any(k.startswith(LAYOUTS["vllm"].prefix) for k in state) and "fc.weight" in state:
        return "vllm"
    raise DraftsmithError(
        f"unknown drafter layout (architectures {config.get('architectures')}; no speculators_model_type, no "
        "midlayer.* or layers.0.* + fc tensors): draftsmith imports EAGLE-3 and P-EAGLE in the speculators, "
        "SGLang/SpecForge/EAGLE and vLLM layouts"
    )


EAGLE31_LAYOUTS = ("speculators", "vllm")
"""The layouts whose EAGLE-3 norm flags (``EAGLE3_NORM_FLAGS``) are imported (SpecForge's ``norm_output`` means
another thing)."""


def check_supported(config: dict, layer: dict, where: str, layout: str) -> None:
    """Refuse what draftsmith's EAGLE-3 layer does not compute, naming the field: EAGLE-3's norm flags (EAGLE-3.1's,
    speculators' residual norm) outside the layouts that mean by them what draftsmith does."""
    flags = () if layout in EAGLE31_LAYOUTS else EAGLE3_NORM_FLAGS
    for flag in flags:
        if bool(config.get(flag, False)):
            raise DraftsmithError(
                f"{where}: {flag}={config[flag]}: the {layout} layout's EAGLE-3 has no such norm (its loaders keep "
                "the un-normed feature as the residual, and SpecForge's norm_output means another thing); not imported"
            )
    check_layer(layer, where, "EAGLE-3")


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


def layer_shape(cfg, layer: dict):
    """``cfg`` (an EAGLE or DFlash config) with its decoder layers shaped as the checkpoint's ``layer`` config."""
    heads = layer["num_attention_heads"]
    cfg.hidden_size, cfg.num_heads, cfg.intermediate_size = layer["hidden_size"], heads, layer["intermediate_size"]
    cfg.head_dim = layer.get("head_dim") or layer["hidden_size"] // heads
    cfg.rms_norm_eps = layer.get("rms_norm_eps", cfg.rms_norm_eps)
    rope = layer.get("rope_parameters") or {}
    cfg.rope_theta = rope.get("rope_theta", layer.get("rope_theta", cfg.rope_theta))
    cfg.max_position_embeddings = layer.get("max_position_embeddings", cfg.max_position_embeddings)
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


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """One safetensors file; an unreadable one is one line."""
    try:
        return load_file(path)
    except SafetensorError as e:
        raise DraftsmithError(f"{path}: cannot read the weights (truncated or corrupt: {e})") from None


def write_imported(network, ckpt: Checkpoint, layout: str, target: ImportTarget, out: Path, what: str) -> Path:
    """The native dir for ``target`` in its dtype, recording where it came from; prints how to score it."""
    fingerprint = target_fingerprint(target.dir, target.dtype)
    record = {"imported_from": {"path": str(ckpt.src), "layout": layout}}
    made_whole(out, lambda tmp: save_native(network, SimpleNamespace(fingerprint=fingerprint), tmp, record))
    print(f"import: {ckpt.src} ({layout}, {what}) -> {out}")
    print(f"score it: draftsmith score --target {target.name}:{target.dtype} --drafter imported={out}")
    return out


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


def import_drafter(
    src: str | Path, target: str, out: str | Path, dtype: str | None = None, overwrite: bool = False
) -> Path:
    """Convert an EAGLE-3, P-EAGLE, DFlash or Medusa checkpoint trained elsewhere into a native drafter dir that
    ``score`` and ``fit`` take.

    Checked against the target before anything is written: vocabulary, hidden size, feature layers within its
    depth, the draft vocabulary's maps. The target's embedding fills in a checkpoint that ships none (speculators
    and vLLM share it with the target).

    Args:
        src: the checkpoint dir (EAGLE-3 in the speculators, SGLang / SpecForge / EAGLE or vLLM layout, P-EAGLE in
            the speculators, vLLM or SpecForge layout, DFlash in speculators' or z-lab's, or Medusa heads in the
            Medusa repository's: detected).
        target: the target it drafts for: ``default``, ``smollm2`` or a model dir, optionally ``:DTYPE``; the dtype
            it resolves to (``auto`` as every command resolves it) is recorded in the drafter's fingerprint, so
            ``score`` and ``fit`` with the same target spec take the drafter.
        out: the native dir to write.
        dtype: the dtype the target computes in (float32, bfloat16, float16 or auto); default: the target's
            ``:DTYPE``, else auto.
        overwrite: replace an existing ``out`` (the old one stays until the new one is whole).

    Returns:
        ``out``.
    """
    from draftsmith.targets import parse_target, resolve, target_dtype

    spec = parse_target(target, dtype)
    refuse_existing(Path(out), overwrite, "import")
    ckpt, out = read_checkpoint(Path(src)), Path(out)  # the cheap checks first: a built-in target may build for minutes
    found = detect(ckpt)
    path = resolve(spec)
    return IMPORTERS[found.family](ckpt, found.layout, ImportTarget(path, target_dtype(spec, path), spec.source), out)


def import_eagle3(ckpt: Checkpoint, layout: str, target: ImportTarget, out: Path) -> Path:
    """An EAGLE-3 or P-EAGLE checkpoint in one of ``LAYOUTS`` -> a native eagle3 or peagle drafter."""
    config, state, facts = ckpt.config, ckpt.state, LAYOUTS[layout]
    layer = config[facts.layer_config] if facts.layer_config else config
    where = f"{ckpt.src} ({layout} layout)"
    check_supported(config, layer, where, layout)
    tcfg = target.config
    num_layers, vocab = tcfg.num_hidden_layers, tcfg.vocab_size
    layers = feature_layers(config, layout, num_layers)
    prefix = facts.prefix
    draft_vocab = state["lm_head.weight"].shape[0] if "lm_head.weight" in state else None
    check_target(config, layer, state, layers, tcfg, where)
    missing = [
        k for k in ("fc.weight", "norm.weight", "lm_head.weight", f"{prefix}self_attn.q_proj.weight") if k not in state
    ]
    if missing:
        raise DraftsmithError(f"{where}: missing tensors {missing}")
    more = stack_indices(state)
    peagle = is_peagle(config, state, layout)
    if more and peagle:
        raise DraftsmithError(
            f"{where}: a P-EAGLE with {1 + len(more)} decoder layers (layers.{more[-1]}.*); draftsmith's P-EAGLE has "
            "one: not imported"
        )
    layers_state = read_layer_tensors(state, prefix, where)  # a gap in the stack is one line, before any work
    norms = {flag: bool(config.get(flag, False)) for flag in EAGLE3_NORM_FLAGS}
    if peagle and any(norms.values()):
        raise DraftsmithError(
            f"{where}: a P-EAGLE with EAGLE-3.1's norms (draftsmith's P-EAGLE has none): not imported"
        )
    cfg = Eagle3Config.from_target(tcfg, 3, layers, draft_vocab, **norms, num_layers=1 + len(more))
    cfg = layer_shape(cfg, layer)
    extra, what = {}, f"feature layers {list(layers)}, draft vocabulary {draft_vocab}"
    if more or any(norms.values()):
        what += f", {1 + len(more)} decoder layer(s)" + "".join(f", {k}" for k, v in norms.items() if v)
    if peagle:
        cfg, extra, depth = peagle_config(cfg, config, state, where)
        what += f", P-EAGLE depth {depth}"
    network = PEagleModel(cfg) if extra else EagleModel(cfg)
    ungroup_kv(layers_state, layer)
    d2t, t2d = state.get("d2t"), state.get("t2d")
    if d2t is None:
        if draft_vocab != vocab:
            raise DraftsmithError(f"{where}: a {draft_vocab}-token draft vocabulary without d2t (which ids?)")
        d2t = torch.zeros(draft_vocab, dtype=torch.long)
    if t2d is None:
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[torch.arange(len(d2t)) + d2t.long()] = True
    embed = state.get("embed_tokens.weight")
    if embed is None:  # shared with the target by the engines that ship none
        embed = target_embedding(target.dir)
    weights = {
        "embed_tokens.weight": embed,
        "fc.weight": state["fc.weight"],
        "norm.weight": state["norm.weight"],
        "lm_head.weight": state["lm_head.weight"],
        "d2t": d2t.long(),
        "t2d": t2d.bool(),
        **layers_state,
        **{k: v for k, v in state.items() if k.startswith(("fc_norm.", "input_norm."))},
        **extra,
    }
    load_weights(network, weights, where, "EAGLE-3")
    vocab_maps(network)  # d2t/t2d consistent, inside the target's vocabulary
    return write_imported(network, ckpt, layout, target, out, what)


PEAGLE_DEPTH = 8
"""The depth of a P-EAGLE checkpoint that records none (SpecForge's ``training.num_depths`` default)."""


def is_peagle(config: dict, state: dict, layout: str) -> bool:
    """A P-EAGLE checkpoint in any layout: speculators' model type, SpecForge's class, vLLM's ``pard_token``, or
    the placeholder feature only P-EAGLE has."""
    return (
        config.get("speculators_model_type") == "peagle"
        or layout == "specforge"
        or "pard_token" in config
        or "mask_hidden" in state
    )


def peagle_config(cfg: Eagle3Config, config: dict, state: dict, where: str) -> tuple[PEagleConfig, dict, str]:
    """A P-EAGLE checkpoint's config (EAGLE-3's plus its depth and placeholder token), the tensor EAGLE-3 lacks
    (``mask_hidden``) and how its depth was found."""
    if "mask_hidden" not in state:
        raise DraftsmithError(f"{where}: a P-EAGLE checkpoint without its mask_hidden tensor (a partial save?)")
    mask = next((config[k] for k in ("mask_token_id", "pard_token") if config.get(k) is not None), None)
    if mask is None:
        raise DraftsmithError(
            f'{where}: a P-EAGLE checkpoint without its placeholder token: add "mask_token_id": ID to its config.json '
            "(SpecForge keeps it in its training config: model.mask_token_id)"
        )
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    depth = methods[0].get("speculative_tokens") or config.get("num_depths")
    said = f"{depth}" if depth else f"{PEAGLE_DEPTH} (none recorded: SpecForge's default num_depths)"
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    peagle = PEagleConfig(**fields, depth=int(depth or PEAGLE_DEPTH), mask_token_id=int(mask))
    return peagle, {"mask_hidden": state["mask_hidden"].reshape(-1)}, said


PARD_DEPTH = 8
"""The depth given a PARD checkpoint that records none (vLLM takes K from its serve command, not the checkpoint;
a drafter drafts fewer when asked)."""


def import_pard(ckpt: Checkpoint, layout: str, target: ImportTarget, out: Path) -> Path:
    """A PARD draft LM as vLLM serves it (any HF causal LM whose config names its placeholder ``pard_token``: AMD's
    PARD releases, draftsmith's vLLM export) -> a native ``pard`` drafter, loaded by ``from_pretrained`` and checked
    against the target (vocabulary, tokenizer when it ships one)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftsmith.core.target import tokenizer_hash
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


def target_embedding(target: Path) -> torch.Tensor:
    """The target's input embedding, read from its safetensors files without loading the model."""
    return target_tensor(target, ("embed_tokens.weight", "wte.weight"))


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
    from draftsmith.families.dspark.network import DSparkConfig, DSparkModel

    backbone, weights, where = dflash_parts(ckpt, layout, target, "DSpark")
    cfg = DSparkConfig(**dataclasses.asdict(backbone) | dspark.read_heads(ckpt.config, where))
    state = ckpt.state
    heads = {k: v for k, v in state.items() if k.startswith(dspark.HEADS)}
    network = DSparkModel(cfg)
    load_weights(network, weights | heads, where, "DSpark")
    what = f"DSpark, {cfg.num_layers} layers, block {cfg.depth + 1}, Markov rank {cfg.markov_rank}"
    return write_imported(network, ckpt, layout, target, out, what)


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


IMPORTERS = {
    "eagle3": import_eagle3,
    "dflash": import_dflash,
    "dspark": import_dspark,
    "pard": import_pard,
    "medusa": import_medusa,
}
"""One importer per family ``detect`` tells apart; each reads the layout it is given."""
