"""EAGLE-1 / EAGLE-3 networks as serving engines lay them out: tensor names, Llama config, aux layer ids.

draftsmith's ``EagleModel`` (``families/eagle/network.py``) names its decoder layer ``layer.*``; engines name it
``layers.0.*`` (vLLM, speculators) or ``midlayer.*`` (SGLang EAGLE-3). Its ``feature_layers`` are HF
``hidden_states`` indices (0 = embeddings, L = the final *normed* state); each engine numbers the
states it can capture its own way, checked here in one place.
"""

from __future__ import annotations

import torch

from draftsmith.errors import DraftsmithError


def layer_tensors(network: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """The decoder layer's tensors renamed ``layer.X`` -> ``{prefix}X``."""
    return {prefix + k.removeprefix("layer."): v for k, v in network.state_dict().items() if k.startswith("layer.")}


def llama_config(cfg, target_config: dict, vocab_size: int) -> dict:
    """The drafter's one decoder layer as a Llama config (what every loader builds the layer from)."""
    return {
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": vocab_size,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": target_config.get("bos_token_id"),
        "eos_token_id": target_config.get("eos_token_id"),
    }


def check_eagle1_feature(cfg, num_layers: int, engine: str) -> None:
    """EAGLE-1 engines feed the target's final normed hidden state (HF ``hidden_states[L]``)."""
    if tuple(cfg.feature_layers) != (num_layers,):
        raise DraftsmithError(
            f"{engine} feeds EAGLE-1 the target's final normed hidden state (HF hidden_states[{num_layers}]); "
            f"this drafter was trained on feature_layers={list(cfg.feature_layers)}"
        )


def aux_layer_ids(cfg, num_layers: int, engine: str) -> list[int]:
    """EAGLE-3 feature layers (HF ``hidden_states`` indices) as ``engine`` numbers its aux layers.

    vLLM 0.32 (``model_executor/models/llama.py`` + ``interfaces.py::_maybe_add_hidden_state``): id k is
    the residual stream entering layer k (k = L: leaving the last layer, *before* the final norm), so
    id k = HF ``hidden_states[k]`` for k < L. SGLang (``models/llama.py::set_eagle3_layers_to_capture``)
    captures ``val + 1`` for an explicit id, so id k = HF ``hidden_states[k + 1]``. Neither captures
    HF ``hidden_states[L]`` (normed); both take exactly three (fc is [H, 3*Ht] in both loaders).
    """
    layers = list(cfg.feature_layers)
    if len(layers) != 3:
        raise DraftsmithError(
            f"{engine} EAGLE-3 fuses exactly 3 target layers (fc [H, 3*Ht]); this drafter uses {layers}"
        )
    if len(set(layers)) != 3:
        raise DraftsmithError(f"{engine} captures each aux layer once; this drafter repeats one in {layers}")
    lowest = 1 if engine == "sglang" else 0
    bad = [k for k in layers if not lowest <= k < num_layers]
    if bad:
        raise DraftsmithError(
            f"{engine} cannot feed EAGLE-3 HF hidden_states{bad} of a {num_layers}-layer target (it captures "
            f"{lowest}..{num_layers - 1}; {num_layers} is the final *normed* state, which no engine exposes): "
            f"retrain with e.g. --model.init_args.feature_layers '[{max(1, num_layers - 3)}, "
            f"{max(1, num_layers - 2)}, {num_layers - 1}]'"
        )
    return [k - 1 for k in layers] if engine == "sglang" else layers


def vocab_maps(network: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t, t2d)`` of an EAGLE-3 drafter, checked: draft id i is target id i + d2t[i], ascending,
    inside the target vocabulary, and exactly the ids ``t2d`` marks."""
    d2t, t2d = network.d2t.detach().cpu().long(), network.t2d.detach().cpu().bool()
    ids = torch.arange(len(d2t)) + d2t  # (Vd,)
    ok = bool((ids[1:] > ids[:-1]).all()) and int(ids.min()) >= 0 and int(ids.max()) < len(t2d)
    if not ok or int(t2d.sum()) != len(d2t) or not bool(t2d[ids.clamp(0, len(t2d) - 1)].all()):
        raise DraftsmithError("drafter's d2t/t2d maps are inconsistent (draft ids must map ascending into t2d)")
    return d2t, t2d


def fold_fc_bias(network: torch.nn.Module, rtol: float = 1e-4) -> torch.Tensor:
    """EAGLE-1's embedding with ``fc.bias`` folded in, for a loader whose fc has no bias.

    fc(concat(e, f)) + b = W_e (e + c) + W_f f with W_e c = b: adding c to every embedding row is the
    same network. Returns the new (V, H) embedding; refuses when W_e cannot reproduce b.
    """
    w = network.fc.weight.detach().double()  # (H, 2H): [W_e | W_f], input order concat(embeds, hidden)
    b = network.fc.bias.detach().double()  # (H,)
    h = network.cfg.hidden_size
    c = torch.linalg.lstsq(w[:, :h], b[:, None]).solution[:, 0]  # (H,)
    err = float((w[:, :h] @ c - b).norm() / b.norm().clamp_min(1e-30))
    if err > rtol:
        raise DraftsmithError(
            f"cannot fold EAGLE-1's fc.bias into the embedding (relative residual {err:.2e} > {rtol}); "
            "this engine's EAGLE-1 fc has no bias and would drop it silently"
        )
    return (network.embed_tokens.weight.detach().double() + c).to(network.embed_tokens.weight.dtype)
