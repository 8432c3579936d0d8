"""Run an exported EAGLE-3 or P-EAGLE drafter through a peer's own model class (runs in the peer's venv, not
draftsmith's).

    python peer_forward.py PEER JOBS.json
    python peer_forward.py PEER write OUT_DIR TARGET_DIR

``PEER``: ``speculators`` (``speculators.models.eagle3.Eagle3DraftModel.from_pretrained``, the speculators export)
or ``specforge`` (``specforge.modeling.draft.llama3_eagle.LlamaForCausalLMEagle3.from_pretrained``, the SGLang
export: SpecForge's draft class is the one its ``to_sglang`` exporter writes for SGLang). ``JOBS.json``: ``inputs``
(a safetensors path), ``target`` (a dir, or null) and ``runs`` {NAME: EXPORT_DIR}; each run writes ``NAME.safetensors``
beside the jobs file, or ``NAME.error`` (the traceback) where the peer refuses the export. ``inputs``:
``input_ids`` (1, T) the sequence x and ``features`` (1, T, 3*Ht) the target's concatenated aux hidden states at
each position, in draftsmith's convention: step j of the training-time test pairs the features (step 0) or the
previous step's output with the tokens x[j+1 : j+1+T] (zero-padded), and anchor i of step j predicts x[i+j+2].
Each output: ``logits.j`` (1, T, Vd) per step, computed by the peer's code, and ``d2t`` as the peer
loaded it. A P-EAGLE export (speculators' ``PEagleDraftModel``; ``steps`` = its depth D) gives ``logits.d`` per
depth instead: depth 0 the T anchors (anchor a pairs x[a+1] with the features of position a), depth d the (1, T - d,
Vd) placeholders d of anchors 0..T-1-d, each seeing the real rows up to its anchor and its own chain (SpecForge's
``PEagleDraftModel`` reads draftsmith's vLLM P-EAGLE export likewise). A DFlash export
(``DFlashDraftModel``; ``steps`` = its depth K) gives ``logits.d`` (1, T - K - 1, V) per mask d: anchor a's block is
x[a+1] at position a + 1 then K masks, seeing the features of positions 0..a; mask d predicts x[a+d+2]; SpecForge
runs a DFlash in z-lab's layout (``DFlashDraftModel``, draftsmith's vLLM export) so, with the target's embedding and
LM head (``target``). A DSpark export (speculators' or SpecForge's ``DSparkDraftModel``) gives DFlash's ``logits.d``
with each mask's Markov bias from its true previous token x[a+d+1], and ``confidence.d`` (1, T - K - 1) the confidence
head's logits. ``write``: a randomly initialised EAGLE-3 for the target (one decoder layer with grouped-query attention,
a scattered 48-token draft vocabulary, aux layers HF hidden_states 1, 2, 3), built and saved by the peer's own code
(speculators: ``Eagle3DraftModel.from_training_args`` + ``save_pretrained``; SpecForge: ``LlamaForCausalLMEagle3``
+ ``load_embedding`` + ``save_pretrained``), norms perturbed away from 1. Only torch, safetensors and the peer are
imported: draftsmith is not installed in the peer's venv.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # SpecForge compiles its rotary forward: eager on CPU is enough
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402


def shifted(x: torch.Tensor, by: int) -> torch.Tensor:
    """x[:, by:] right-padded with zeros to x's length."""
    return torch.cat([x[:, by:], x.new_zeros(x.shape[0], by)], dim=1)


def speculators_logits(export: str, x: torch.Tensor, features: torch.Tensor, steps: int):
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(export)
    config.transformer_layer_config._attn_implementation = "eager"  # dense masks: no flex-attention compile on CPU
    model = Eagle3DraftModel.from_pretrained(export, config=config).eval()
    logits = []
    model.lm_head.register_forward_hook(lambda _m, _i, out: logits.append(out))
    with torch.no_grad():  # speculators' TTT feeds x shifted by 1 + j at step j: give it x[1:]
        model(features, shifted(x, 1), document_ids=torch.zeros_like(x), ttt_steps=steps)
    return logits, model.d2t


def speculators_peagle_logits(export: str, x: torch.Tensor, features: torch.Tensor, depth: int):
    """P-EAGLE's training forward with its random anchor sampling (COD) replaced by every anchor at every depth."""
    import speculators.models.peagle.core as core
    from speculators.models.peagle import PEagleDraftModel, PEagleSpeculatorConfig

    t = x.shape[1]
    anchors = [torch.arange(t - d) for d in range(depth)]
    core.generate_cod_sample_indices = lambda **_: (
        torch.cat(anchors),
        torch.cat([torch.full((len(a),), d) for d, a in enumerate(anchors)]),
    )
    config = PEagleSpeculatorConfig.from_pretrained(export)
    config.transformer_layer_config._attn_implementation = "eager"
    model = PEagleDraftModel.from_pretrained(export, config=config).eval()
    logits = []
    model.lm_head.register_forward_hook(lambda _m, _i, out: logits.append(out))
    from speculators.losses.utils import resolve_loss_config

    with torch.no_grad():  # the verifier's last states only feed its loss (eager: its fused one needs Triton): zeros
        last = torch.zeros(1, t, model.config.transformer_layer_config.hidden_size)
        model(features, shifted(x, 1), document_ids=torch.zeros_like(x), verifier_last_hidden_states=last,
              num_depths=depth, loss_config=resolve_loss_config("kl_div", "eager"))  # fmt: skip
    return list(logits[0].split([len(a) for a in anchors], dim=1)), model.d2t


def speculators_dflash_logits(export: str, x: torch.Tensor, features: torch.Tensor, depth: int):
    """DFlash's training forward (up to its logits) with its random anchor choice replaced by every anchor whose
    block fits: speculators' anchor p is the committed token's position (draftsmith's anchor a = p - 1)."""
    import speculators.models.dflash.core as core
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig

    t = x.shape[1]
    anchors = torch.arange(1, t - depth)
    core.select_anchors = lambda *_: (anchors, torch.ones(len(anchors), dtype=torch.bool))
    config = DFlashSpeculatorConfig.from_pretrained(export)
    config.transformer_layer_config._attn_implementation = "eager"  # dense float masks: no flex-attention on CPU
    model = DFlashDraftModel.from_pretrained(export, config=config).eval()
    with torch.no_grad():  # the verifier's last states only feed its loss targets: zeros
        last = torch.zeros(1, t, model.config.transformer_layer_config.hidden_size)
        ones = torch.ones_like(x)
        _, logits, *_ = model._backbone_forward(features, x, ones, last, torch.zeros_like(x), max_anchors=len(anchors))
    blocks = logits.view(1, len(anchors), depth + 1, -1)  # slot 0: the anchor (not drafted)
    return [blocks[:, :, d + 1] for d in range(depth)], torch.zeros(blocks.shape[-1], dtype=torch.long)


def specforge_logits(export: str, x: torch.Tensor, features: torch.Tensor, steps: int):
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3

    model = LlamaForCausalLMEagle3.from_pretrained(export, attention_backend="sdpa").eval()
    # its rotary tables are non-persistent buffers that transformers 5's from_pretrained leaves uninitialised
    # (NaN cos_cached on this machine): rebuilt as the class's __init__ builds them, plain RoPE (what the
    # checkpoints this script reads carry)
    rotary = model.midlayer.self_attn.rotary_emb
    rotary.inv_freq = 1.0 / rotary.base ** (torch.arange(0, rotary.dim, 2).float() / rotary.dim)
    rotary._set_cos_sin_cache(rotary.max_position_embeddings + 20, "cpu", torch.float32)
    t = x.shape[1]
    mask = torch.full((t, t), torch.finfo(features.dtype).min).triu(1)[None, None]  # additive causal (1, 1, T, T)
    positions = torch.arange(t)[None]
    cache, logits = [[], []], []
    with torch.no_grad():  # the step loop of SpecForge's Eagle3 training model (algorithms/eagle3/model.py)
        hidden = model.project_hidden_states(features)
        for j in range(steps):
            embeds = model.embed_input_ids(shifted(x, j + 1))
            hidden = model.backbone(embeds, hidden, cache, mask, positions, None, True)
            logits.append(model.compute_logits(hidden))
    return logits, model.d2t


def specforge_peagle_logits(export: str, x: torch.Tensor, features: torch.Tensor, depth: int):
    """SpecForge's P-EAGLE training forward (``OnlinePEagleModel``: placeholders, flex-attention mask, the draft
    model's layers and logits) with its random anchor sampling (COD) replaced by every anchor at every depth and its
    loss by a hook on the logits; the placeholder token from the config, as SpecForge's training config gives it.
    Its loss module imports Triton (a GPU kernel, absent here) and is never called: a stand-in module is imported in
    its place. Flex attention runs eagerly (CPU)."""
    import types

    sys.modules["specforge.core.loss"] = types.SimpleNamespace(LogSoftmaxLoss=None)
    import specforge.algorithms.peagle.model as core
    from specforge.modeling.draft.peagle import PEagleDraftModel

    t = x.shape[1]
    anchors = [torch.arange(t - d) for d in range(depth)]
    core.generate_cod_sample_indices = lambda **_: (
        torch.cat(anchors),
        torch.cat([torch.full((len(a),), d) for d, a in enumerate(anchors)]),
    )
    logits = []
    core.compute_peagle_metrics = lambda **kw: (logits.append(kw["logits"]), (torch.zeros(()), {}))[1]
    model = PEagleDraftModel.from_pretrained(export).eval()
    training = core.OnlinePEagleModel(model, mask_token_id=model.config.mask_token_id, num_depths=depth)
    ones = torch.ones_like(x)
    with torch.no_grad():
        training(input_ids=shifted(x, 1), attention_mask=ones, target=None, loss_mask=ones, hidden_states=features)
    return list(logits[0].split([len(a) for a in anchors], dim=1)), model.d2t


def specforge_dflash_logits(export: str, x: torch.Tensor, features: torch.Tensor, depth: int, target: str):
    """SpecForge's ``DFlashDraftModel`` (z-lab's layout) over a block at every anchor that fits, as its own
    ``spec_generate`` calls it: the block (the committed token, then ``mask_token_id`` K times) embedded by the
    target, the context features up to the anchor, positions 0..a+K+1, non-causal; logits by the target's LM head."""
    from specforge.modeling.draft.dflash import DFlashDraftModel
    from transformers import AutoModelForCausalLM

    model = DFlashDraftModel.from_pretrained(export).eval()
    verifier = AutoModelForCausalLM.from_pretrained(target).eval()
    masks = torch.full((1, depth), model.mask_token_id)
    per_mask = [[] for _ in range(depth)]
    with torch.no_grad():
        for a in range(x.shape[1] - depth - 1):
            block = verifier.get_input_embeddings()(torch.cat([x[:, a + 1 : a + 2], masks], dim=1))
            hidden = model(
                position_ids=torch.arange(a + 2 + depth)[None],
                noise_embedding=block,
                target_hidden=features[:, : a + 1],
                is_causal=False,
            )
            logits = verifier.lm_head(hidden[:, 1:])
            for d in range(depth):
                per_mask[d].append(logits[:, d])
    return [torch.stack(m, dim=1) for m in per_mask], torch.zeros(logits.shape[-1], dtype=torch.long)


def speculators_dspark_logits(export: str, x: torch.Tensor, features: torch.Tensor, depth: int):
    """DSpark's training forward (DFlash's backbone, its Markov bias from each slot's true previous token, its
    confidence head) over a block at every anchor that fits, as ``speculators_dflash_logits``; its loss replaced by
    a hook taking the logits and confidence logits it is given."""
    import speculators.models.dflash.core as dflash_core
    import speculators.models.dspark.core as core
    from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig

    t = x.shape[1]
    anchors = torch.arange(1, t - depth)
    dflash_core.select_anchors = lambda *_: (anchors, torch.ones(len(anchors), dtype=torch.bool))
    seen = {}
    core.compute_metrics = lambda logits, targets, confidence, *_, **__: (
        seen.update(logits=logits, confidence=confidence),
        (torch.zeros(()), {}),
    )[1]
    config = DSparkSpeculatorConfig.from_pretrained(export)
    config.transformer_layer_config._attn_implementation = "eager"
    model = DSparkDraftModel.from_pretrained(export, config=config).eval()
    with torch.no_grad():
        last = torch.zeros(1, t, model.config.transformer_layer_config.hidden_size)
        model(features, x, torch.ones_like(x), last, torch.zeros_like(x), max_anchors=len(anchors))
    blocks = seen["logits"].view(1, len(anchors), depth + 1, -1)  # slot 0: the anchor (not drafted)
    confidence = seen["confidence"].view(1, len(anchors), depth + 1)
    d2t = torch.zeros(blocks.shape[-1], dtype=torch.long)
    return [blocks[:, :, d + 1] for d in range(depth)], d2t, [confidence[:, :, d + 1] for d in range(depth)]


def specforge_dspark_logits(export: str, x: torch.Tensor, features: torch.Tensor, depth: int, target: str):
    """SpecForge's ``DSparkDraftModel`` as ``specforge_dflash_logits`` calls its DFlash, then its own heads on the
    masks' states: ``apply_logits_head`` (the Markov bias of each mask's true previous token) and
    ``predict_confidence``."""
    from specforge.modeling.draft.dspark import DSparkDraftModel
    from transformers import AutoModelForCausalLM

    model = DSparkDraftModel.from_pretrained(export).eval()
    verifier = AutoModelForCausalLM.from_pretrained(target).eval()
    masks = torch.full((1, depth), model.mask_token_id)
    per_mask, per_conf = [[] for _ in range(depth)], [[] for _ in range(depth)]
    with torch.no_grad():
        for a in range(x.shape[1] - depth - 1):
            block = verifier.get_input_embeddings()(torch.cat([x[:, a + 1 : a + 2], masks], dim=1))
            hidden = model(
                position_ids=torch.arange(a + 2 + depth)[None],
                noise_embedding=block,
                target_hidden=features[:, : a + 1],
                is_causal=False,
            )[:, 1:]
            prev = x[:, a + 1 : a + 1 + depth]
            logits = model.apply_logits_head(verifier.lm_head(hidden), prev_token_ids=prev, hidden_states=hidden)
            confidence = model.predict_confidence(hidden, prev_token_ids=prev)
            for d in range(depth):
                per_mask[d].append(logits[:, d])
                per_conf[d].append(confidence[:, d])
    d2t = torch.zeros(logits.shape[-1], dtype=torch.long)
    return [torch.stack(m, dim=1) for m in per_mask], d2t, [torch.stack(c, dim=1) for c in per_conf]


def vocab_maps(vocab: int, draft_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))[:draft_vocab].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return t2d, ids - torch.arange(draft_vocab)


def perturb(model: torch.nn.Module) -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))


def write_speculators_dflash(out: str, target: str) -> None:
    """A randomly initialised two-layer DFlash (grouped-query attention, block of 5, masks the target's embedding of
    vocab - 3) for ``target``, built by ``DFlashDraftModel.from_training_args`` and saved by speculators."""
    from speculators.models.dflash import DFlashDraftModel

    model = speculators_block_drafter(DFlashDraftModel, target)
    perturb(model)
    model.save_pretrained(out)


def speculators_block_drafter(cls: type, target: str, **extra) -> torch.nn.Module:
    """``cls.from_training_args`` (speculators' DFlash or DSpark class) for ``target``: two layers, grouped-query
    attention, a block of 5, the target's token ``vocab - 3`` as the mask, the features of layers 1-3; ``extra``:
    the class's own arguments."""
    from transformers import AutoConfig

    verifier = AutoConfig.from_pretrained(target)
    verifier.num_hidden_layers, verifier.num_key_value_heads = 2, verifier.num_attention_heads // 2
    return cls.from_training_args(
        verifier,
        draft_vocab_size=verifier.vocab_size,
        block_size=5,
        mask_token_id=verifier.vocab_size - 3,
        verifier_name_or_path=target,
        target_layer_ids=[1, 2, 3],
        draft_attn_impl="eager",
        **extra,
    )


def markov_scaled(model: torch.nn.Module) -> None:
    """Its Markov head's weights scaled up (their init keeps the bias near zero, where a dropped head would not
    show)."""
    with torch.no_grad():
        model.markov_head.markov_w1.weight.normal_()
        model.markov_head.markov_w2.weight.mul_(3.0)


def write_speculators_dspark(out: str, target: str) -> None:
    """A randomly initialised two-layer DSpark (DFlash's as ``write_speculators_dflash``, fill-in block:
    ``sample_from_anchor`` false; vanilla Markov head of rank 8; confidence head reading the Markov embedding) built
    by ``DSparkDraftModel.from_training_args`` and saved by speculators."""
    from speculators.models.dspark import DSparkDraftModel

    model = speculators_block_drafter(
        DSparkDraftModel, target, sample_from_anchor=False, markov_rank=8, confidence_head_with_markov=True
    )
    perturb(model)
    markov_scaled(model)
    model.save_pretrained(out)


def write_speculators(out: str, target: str, kind: str = "eagle3") -> None:
    """A randomly initialised speculators drafter (``kind`` eagle3 or peagle) for ``target``, saved by speculators;
    an EAGLE-3 with the residual normed (``norm_before_residual``: their trainer's default), a P-EAGLE without."""
    from transformers import AutoConfig

    if kind == "peagle":
        from speculators.models.peagle import PEagleDraftModel as cls
    else:
        from speculators.models.eagle3 import Eagle3DraftModel as cls

    verifier = AutoConfig.from_pretrained(target)
    verifier.num_hidden_layers, verifier.num_key_value_heads = 1, verifier.num_attention_heads // 2
    t2d, d2t = vocab_maps(verifier.vocab_size, 48)
    extra = {"mask_token_id": verifier.vocab_size - 3, "num_depths": 4} if kind == "peagle" else {"ttt_steps": 3}
    model = cls.from_training_args(
        verifier,
        t2d=t2d,
        d2t=d2t,
        draft_vocab_size=48,
        norm_before_residual=kind == "eagle3",
        verifier_name_or_path=target,
        target_layer_ids=[1, 2, 3],
        draft_attn_impl="eager",
        **extra,
    )
    perturb(model)
    model.save_pretrained(out)


def write_specforge(out: str, target: str, kind: str = "eagle3") -> None:
    """A randomly initialised SpecForge drafter for ``target`` (one layer, grouped-query attention, a scattered
    48-token draft vocabulary, capture layers 0, 1, 2), saved by SpecForge. ``kind`` eagle3: its
    ``LlamaForCausalLMEagle3``; peagle: its ``PEagleDraftModel``, with the target's embedding perturbed (SpecForge
    trains it) and its placeholder token (vocab - 3) and depth 4 added to the config as its training config would
    give them."""
    from transformers import AutoConfig, LlamaConfig

    if kind == "peagle":
        from specforge.modeling.draft.peagle import PEagleDraftModel as cls
    else:
        from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3 as cls

    verifier = AutoConfig.from_pretrained(target)
    config = LlamaConfig(
        **{k: v for k, v in verifier.to_dict().items() if k not in ("architectures", "model_type")},
        architectures=[cls.__name__],
    )
    config.num_hidden_layers, config.num_key_value_heads = 1, verifier.num_attention_heads // 2
    config.draft_vocab_size, config.target_hidden_size = 48, verifier.hidden_size
    config.eagle_config = {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True}
    torch.manual_seed(0)
    model = cls(config)
    model.load_embedding(target)
    t2d, d2t = vocab_maps(verifier.vocab_size, 48)
    model.t2d.copy_(t2d)
    model.d2t.copy_(d2t)
    perturb(model)
    if kind == "peagle":
        with torch.no_grad():
            model.embed_tokens.weight.add_(0.1 * torch.randn_like(model.embed_tokens.weight))
        model.config.mask_token_id, model.config.num_depths = verifier.vocab_size - 3, 4
    model.save_pretrained(out)


def specforge_block_config(target: str, architecture: str, **dflash_config):
    """SpecForge's config of a randomly initialised two-layer block drafter for ``target`` in z-lab's layout
    (grouped-query attention, block of 5, masks vocab - 3, target layer ids 0, 1, 2): DFlash's, and DSpark's with
    its heads' keys added to ``dflash_config``."""
    from transformers import AutoConfig, Qwen3Config

    verifier = AutoConfig.from_pretrained(target)
    heads = verifier.num_attention_heads
    config = Qwen3Config(
        hidden_size=verifier.hidden_size,
        intermediate_size=verifier.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        head_dim=verifier.hidden_size // heads,
        num_hidden_layers=2,
        vocab_size=verifier.vocab_size,
        rms_norm_eps=verifier.rms_norm_eps,
        max_position_embeddings=verifier.max_position_embeddings,
        architectures=[architecture],
    )
    config.block_size, config.num_target_layers = 5, verifier.num_hidden_layers
    config.dflash_config = {"mask_token_id": verifier.vocab_size - 3, "target_layer_ids": [0, 1, 2], **dflash_config}
    return config


def write_specforge_dflash(out: str, target: str) -> None:
    """A randomly initialised two-layer DFlash (``specforge_block_config``), built by SpecForge's
    ``DFlashDraftModel`` and saved by it."""
    from specforge.modeling.draft.dflash import DFlashDraftModel

    torch.manual_seed(0)
    model = DFlashDraftModel(specforge_block_config(target, "DFlashDraftModel"))
    perturb(model)
    model.save_pretrained(out)


def write_specforge_dspark(out: str, target: str) -> None:
    """A randomly initialised two-layer DSpark in SpecForge's layout (``specforge_block_config``'s DFlash with a
    rank-8 vanilla Markov head, a confidence head reading the Markov embedding), built by SpecForge's
    ``DSparkDraftModel`` and saved by it."""
    from specforge.modeling.draft.dspark import DSparkDraftModel

    config = specforge_block_config(
        target, "DSparkDraftModel", markov_rank=8, enable_confidence_head=True, confidence_head_with_markov=True
    )
    torch.manual_seed(0)
    model = DSparkDraftModel(config)
    perturb(model)
    markov_scaled(model)
    model.save_pretrained(out)


def main() -> None:
    if sys.argv[2] == "write":
        peer, _, out, target = sys.argv[1:5]
        writers = {
            "speculators": write_speculators,
            "speculators-peagle": lambda o, t: write_speculators(o, t, "peagle"),
            "speculators-dflash": write_speculators_dflash,
            "specforge": write_specforge,
            "specforge-peagle": lambda o, t: write_specforge(o, t, "peagle"),
            "specforge-dflash": write_specforge_dflash,
            "speculators-dspark": write_speculators_dspark,
            "specforge-dspark": write_specforge_dspark,
        }
        writers[peer](out, target)
        return
    peer, jobs_file = sys.argv[1:3]
    with open(jobs_file) as f:
        jobs = json.load(f)
    data = load_file(jobs["inputs"])
    folder = os.path.dirname(os.path.abspath(jobs_file))
    for name, export in jobs["runs"].items():  # one process for all: the imports cost more than the forwards
        try:
            logits, d2t, *confidence = run(peer, export, data, jobs.get("target"))
        except Exception:  # noqa: BLE001 - a refusal to load is the run's result, reported to the caller
            import traceback

            with open(os.path.join(folder, f"{name}.error"), "w") as f:
                f.write(traceback.format_exc())
            continue
        tensors = {**{f"logits.{j}": v.float().contiguous() for j, v in enumerate(logits)}, "d2t": d2t}
        tensors |= {
            f"confidence.{j}": v.float().contiguous() for j, v in enumerate(confidence[0] if confidence else [])
        }
        save_file(tensors, os.path.join(folder, f"{name}.safetensors"))


def run(peer: str, export: str, data: dict, target: str | None):
    """The peer's class for ``export``'s kind over the inputs: (per-step logits, d2t[, per-mask confidence logits])."""
    args = (export, data["input_ids"], data["features"].float(), int(data["steps"]))
    with open(os.path.join(export, "config.json")) as f:
        config = json.load(f)
    kind = config.get("speculators_model_type")
    if peer == "specforge" and "DSparkDraftModel" in (config.get("architectures") or []):
        return specforge_dspark_logits(*args, target)
    if peer == "speculators" and kind == "dspark":
        return speculators_dspark_logits(*args)
    if peer == "specforge" and "dflash_config" in config:
        return specforge_dflash_logits(*args, target)  # the target's embedding and LM head
    if peer == "specforge" and "mask_token_id" in config:  # P-EAGLE (draftsmith's vLLM export, SpecForge's own)
        return specforge_peagle_logits(*args)
    if peer == "speculators" and kind in ("peagle", "dflash"):
        return {"peagle": speculators_peagle_logits, "dflash": speculators_dflash_logits}[kind](*args)
    return {"speculators": speculators_logits, "specforge": specforge_logits}[peer](*args)


if __name__ == "__main__":
    main()
