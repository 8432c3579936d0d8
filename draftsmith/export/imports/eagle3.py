"""EAGLE-3 and P-EAGLE checkpoints in the layouts the field writes -> native ``eagle3`` / ``peagle`` drafters, each
layout read as its own loader reads it:

- ``speculators``: vllm-project/speculators (``speculators_model_type: eagle3``; ``layers.0.*``; aux ids
  ``eagle_aux_hidden_state_layer_ids`` in vLLM numbering: id k = HF ``hidden_states[k]``).
- ``sglang``: SGLang's ``LlamaForCausalLMEagle3``, which SpecForge trains and writes and the original EAGLE
  repository (SafeAILab) released its EAGLE-3 checkpoints in (``midlayer.*``; aux ids in
  ``eagle_config.eagle_aux_hidden_state_layer_ids``, SGLang numbering: id k = HF ``hidden_states[k + 1]``).
- ``vllm``: vLLM's ``Eagle3LlamaForCausalLM`` (``layers.0.*``; top-level aux ids, vLLM numbering).
- ``specforge``: SpecForge's ``PEagleDraftModel`` (``layers.0.*``, flat Llama config; aux ids as the top-level ones
  when present, else in ``eagle_config``, SGLang numbering).

P-EAGLE (EAGLE-3's tensors plus ``mask_hidden``, the placeholder's stand-in feature, and a placeholder token id) in
the speculators layout (``speculators_model_type: peagle``, ``mask_token_id``, the depth its greedy proposal
drafts), in vLLM's (``pard_token`` or ``mask_token_id``; ``num_depths`` where draftsmith wrote it) and in SpecForge's
(``architectures: PEagleDraftModel``; SpecForge keeps the token in its training config, so ``mask_token_id`` must be
added to config.json, one line says so; depth ``num_depths``, else SpecForge's training default 8) becomes a native
``peagle`` drafter, keeping the checkpoint's own token embedding (SpecForge trains it).

The layouts' facts (the decoder layer's tensor prefix, where the aux ids are and how they are numbered) are
``eagle_layout.LAYOUTS``, the table the exporters write by. Without aux ids every loader captures HF
``hidden_states`` (2, L/2, L-3) (``eagle_layout.loader_default_layers``). What draftsmith's EAGLE-3 layer cannot
compute (another norm placement, RoPE scaling, biases) is refused with one line naming the config field.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.export.eagle_layout import (
    EAGLE3_NORM_FLAGS,
    LAYOUTS,
    feature_layers,
    read_layer_tensors,
    stack_indices,
    vocab_maps,
)
from draftsmith.export.imports.core import (
    Checkpoint,
    ImportTarget,
    check_layer,
    check_target,
    layer_shape,
    load_weights,
    target_embedding,
    ungroup_kv,
    write_imported,
)
from draftsmith.families.eagle.config import Eagle3Config
from draftsmith.families.eagle.network import EagleModel
from draftsmith.families.eagle.peagle.network import PEagleConfig, PEagleModel
from draftsmith.families.registry import extended


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
    peagle = extended(cfg, PEagleConfig, depth=int(depth or PEAGLE_DEPTH), mask_token_id=int(mask))
    return peagle, {"mask_hidden": state["mask_hidden"].reshape(-1)}, said
