"""speculators-format EAGLE-3 and P-EAGLE directories (vLLM's ``speculators`` library; vLLM serves them directly).

Facts, read in speculators 0.3.0 (``models/eagle3/config.py``: ``Eagle3SpeculatorConfig``,
``config.py``: ``SpeculatorsConfig`` / ``VerifierConfig``, ``proposals/greedy.py``;
``models/eagle3/core.py``: ``Eagle3DraftModel`` holds ``layers.N.*``, ``fc``, ``norm``, ``lm_head``,
``embed_tokens``, ``d2t`` [Vd] int offsets and ``t2d`` [V] bool with ``t2d.sum() == draft_vocab_size``)
and in vLLM 0.32 ``transformers_utils/configs/speculators/{base,algos}.py`` (which requires
``speculators_config.proposal_methods[0].speculative_tokens``, ``verifier.name_or_path`` and
``transformer_layer_config``, and defaults ``norm_before_residual`` to *True*: always written here).
``architectures`` is ``Eagle3DraftModel``, what speculators' own checkpoints carry: the model class registered
for ``eagle3`` is ``Eagle3DraftModel`` (``models/eagle3/core.py``) and transformers' ``save_pretrained`` writes the
saving class's name (``modeling_utils.py``), not the config class's stale default ``Eagle3Speculator``. Neither
loader dispatches on it (speculators uses ``speculators_model_type``; vLLM 0.32 ``algos.py::update_eagle3``
overwrites it). EAGLE-1 is registered in speculators 0.3.0 (``eagle``) but vLLM 0.32 serves only ``eagle3``
(and newer types) from this format, so it is not exported here.

P-EAGLE (``speculators_model_type: peagle``, speculators 0.9.0 ``models/peagle``: ``PEagleSpeculatorConfig`` is
EAGLE-3's with ``mask_token_id``; ``PEagleDraftModel`` adds ``mask_hidden`` (1, 1, aux x H), the placeholder's
stand-in for the target features, before ``fc``). vLLM 0.32 (``algos.py::update_peagle``) serves it as EAGLE-3 with
``parallel_drafting``, ``pard_token`` = ``mask_token_id``.

DFlash (``speculators_model_type: dflash``, speculators 0.9.0 ``models/dflash``: ``DFlashSpeculatorConfig`` with a
Qwen3 ``transformer_layer_config`` of the draft's layers, ``block_size`` = K + 1, ``aux_hidden_state_layer_ids`` (id k
= HF ``hidden_states[k]``; vLLM's ``update_dflash`` maps them to its ``target_layer_ids`` k - 1), ``mask_token_id``,
``sample_from_anchor`` false: the anchor is the committed token, the K masks draft; ``sliding_window_non_causal``
true, which vLLM reads as "every layer bidirectional", see ``_dflash``). ``DFlashDraftModel`` holds
``fc``, ``hidden_norm``, ``layers.N.*`` (Qwen3 names, ``q_norm``/``k_norm``), ``norm``; it always reloads
``embed_tokens`` from the verifier and saves none, so its masks are the target's embedding of ``mask_token_id``: only
a drafter trained so (``model.mask_from_token: true``) exports here, a learned mask embedding is refused.

speculators 0.9.0's own ``Eagle3DraftModel`` / ``PEagleDraftModel`` / ``DFlashDraftModel.from_pretrained`` load these
dirs and compute the same logits and tokens as draftsmith's drafter (EAGLE-3 over the training-time test, P-EAGLE over
every anchor's placeholder chain, DFlash over a block at every anchor; tests/test_peers.py, in its own venv).
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.export import dspark, eagle_layout
from draftsmith.export.common import Source, cast, dtype_name, write
from draftsmith.export.serve import DEFAULTS, Serving, at_k, vllm_command
from draftsmith.export.vllm import eagle3_tensors, norm_flags

METHODS = ("eagle3", "peagle", "dflash", "dspark")
SPECULATORS_VERSION = "0.3.0"
"""The speculators release whose config classes this layout follows (and that validates it in tests)."""


def speculators_config(src: Source, target: dict, speculative_tokens: int) -> dict:
    """The ``speculators_config`` block: a greedy proposal of ``speculative_tokens`` tokens and the verifier."""
    return {
        "algorithm": src.method,
        "proposal_methods": [
            {
                "proposal_type": "greedy",
                "speculative_tokens": speculative_tokens,
                "verifier_accept_k": 1,
                "accept_tolerance": 0.0,
            }
        ],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": str(src.target_dir), "architectures": target.get("architectures", [])},
    }


def _dflash(src: Source, out: Path, dtype: str | None, heads: tuple[str, ...] = (), extra: dict | None = None) -> None:
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
    layer = eagle_layout.llama_config(cfg, target, cfg.vocab_size) | {
        "model_type": "qwen3",
        "num_hidden_layers": cfg.num_layers,
    }
    config = {
        "architectures": ["DFlashDraftModel"],
        "speculators_model_type": "dflash",
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": speculators_config(src, target, cfg.depth),
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg.vocab_size,
        "block_size": cfg.depth + 1,
        "target_hidden_size": cfg.target_hidden_size,
        "aux_hidden_state_layer_ids": eagle_layout.SPECULATORS_DFLASH_IDS.ids(cfg.feature_layers),
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


def export(src: Source, out: Path, dtype: str | None, serving: Serving = DEFAULTS) -> str:
    """Write the speculators dir (its proposal drafting ``serving.k`` tokens, default 4; a P-EAGLE its trained
    depth); return the ``vllm serve`` command, the target in ``serving.dtype``."""
    command = f"vllm serve {out}" + (f" --dtype {serving.dtype}" if serving.dtype else "")
    command += "  # the verifier is read from speculators_config.verifier.name_or_path"
    if src.method in ("dflash", "dspark"):
        if src.method == "dspark":
            _dflash(src, out, dtype, dspark.HEADS, dspark.speculators_fields(src.network.cfg))
            spec = dspark.speculative_config(out, src.network.cfg.depth)
            return vllm_command(src.target_dir, at_k(spec, serving.k), serving.dtype)
        _dflash(src, out, dtype)
        return command
    speculative_tokens = serving.k or 4
    cfg = src.network.cfg
    if getattr(cfg, "num_layers", 1) > 1:
        raise DraftsmithError(
            f"--to speculators: a {cfg.num_layers}-layer EAGLE-3; draftsmith exports one decoder layer in speculators' "
            "layout (its peer tests load that): export it --to vllm"
        )
    target = src.target_config("speculators")
    aux = eagle_layout.aux_layer_ids(cfg, target["num_hidden_layers"], "speculators")
    tensors = eagle3_tensors(src.network, eagle_layout.LAYOUTS["speculators"].prefix)
    peagle = src.method == "peagle"
    if peagle:
        tensors["mask_hidden"] = src.network.state_dict()["mask_hidden"].reshape(1, 1, -1)
    tensors = cast(tensors, dtype)
    if peagle:
        speculative_tokens = min(serving.k or cfg.depth, cfg.depth)  # one forward drafts at most its depth
    config = {
        "architectures": ["PEagleDraftModel" if peagle else "Eagle3DraftModel"],
        "speculators_model_type": src.method,
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": speculators_config(src, target, speculative_tokens),
        "transformer_layer_config": eagle_layout.llama_config(cfg, target, cfg.vocab_size),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": aux,
        **norm_flags(cfg),
        **({"mask_token_id": cfg.mask_token_id} if peagle else {}),
        "torch_dtype": dtype_name(tensors),
    }
    write(out, tensors, config, "speculators")
    return command
