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

speculators 0.9.0's own ``Eagle3DraftModel`` / ``PEagleDraftModel.from_pretrained`` load these dirs and compute the
same logits and tokens as draftsmith's drafter (EAGLE-3 over the training-time test, P-EAGLE over every anchor's
placeholder chain; tests/test_peers.py, in its own venv).
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.export import eagle_layout
from draftsmith.export.common import Source, cast, dtype_name, write
from draftsmith.export.vllm import eagle3_tensors

METHODS = ("eagle3", "peagle")
SPECULATORS_VERSION = "0.3.0"
"""The speculators release whose config classes this layout follows (and that validates it in tests)."""


def export(src: Source, out: Path, dtype: str | None, speculative_tokens: int = 4) -> str:
    """Write the speculators dir; return the ``vllm serve`` command."""
    cfg = src.network.cfg
    target = src.target_config("speculators")
    aux = eagle_layout.aux_layer_ids(cfg, target["num_hidden_layers"], "vllm")
    tensors = eagle3_tensors(src.network, "layers.0.")
    peagle = src.method == "peagle"
    if peagle:
        tensors["mask_hidden"] = src.network.state_dict()["mask_hidden"].reshape(1, 1, -1)
    tensors = cast(tensors, dtype)
    if peagle:
        speculative_tokens = cfg.depth  # one forward drafts what it was trained for
    config = {
        "architectures": ["PEagleDraftModel" if peagle else "Eagle3DraftModel"],
        "speculators_model_type": src.method,
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
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
        },
        "transformer_layer_config": eagle_layout.llama_config(cfg, target, cfg.vocab_size),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": aux,
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        **({"mask_token_id": cfg.mask_token_id} if peagle else {}),
        "torch_dtype": dtype_name(tensors),
    }
    write(out, tensors, config, "speculators")
    return f"vllm serve {out}  # the verifier is read from speculators_config.verifier.name_or_path"
