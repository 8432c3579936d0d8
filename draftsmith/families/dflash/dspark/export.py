"""DSpark's blocks for the export formats it has (vLLM, speculators): DFlash's (``families/dflash/export.py``) with
the heads; ``draftsmith import`` reads them back (``draftsmith.export.dspark.read_heads``).

Facts, read in the pinned sources:

- speculators 0.9.0 ``models/dspark`` (``DSparkSpeculatorConfig`` is DFlash's config plus ``sample_from_anchor``,
  ``markov_rank``, ``markov_head_type`` vanilla | gated | rnn, ``enable_confidence_head``,
  ``confidence_head_with_markov``; ``DSparkDraftModel`` adds ``markov_head.markov_w1`` (V, r) / ``markov_w2`` (Vd, r)
  and ``confidence_head.proj`` (Linear(H [+ r], 1) with bias) to DFlash's tensors). ``sample_from_anchor`` defaults
  to true there (the anchor row drafts too); draftsmith's DSpark is DFlash's fill-in block, written ``false``.
  ``--to speculators`` writes this layout; vLLM 0.32 serves it (``transformers_utils/configs/speculators/algos.py::
  update_dspark``: ``Qwen3DSparkModel``, target layer ids k - 1, ``dspark_bonus_anchor`` = not sample_from_anchor).
- vLLM 0.32 ``model_executor/models/qwen3_dspark.py`` (``Qwen3DSparkModel``: DFlash's Qwen3 backbone plus
  ``markov_head.markov_w1/markov_w2`` and ``confidence_head.proj`` with bias, reading ``markov_rank``,
  ``enable_confidence_head``, ``confidence_head_with_markov`` at the top of the config; the masks are the vocabulary
  row of ``dflash_config.mask_token_id``, ``mask_embedding`` is dropped) and ``config/speculative.py`` (a ``qwen3``
  config with ``architectures: DSparkDraftModel`` is served as ``Qwen3DSparkModel``; ``sample_from_anchor``
  defaults to true: written ``false``). SpecForge 0.2.0 ``modeling/draft/dspark.py`` (``DSparkDraftModel``, z-lab's
  DFlash layout with ``dflash_config.projector_type: dspark`` and the heads' settings in ``dflash_config``; vanilla
  Markov head and ``confidence_head.proj`` of the same names; it refuses equal query and key/value heads unless
  ``dflash_config.attention_mode`` is ``mha``) loads the same dir: ``--to vllm`` writes both sets of keys.
- vLLM 0.32 drafts DSpark only in its V2 GPU model runner (``config/vllm.py``: the V1 runner, which its CPU build
  uses, refuses ``dspark speculative decoding``); with ``enable_adaptive_verification`` its confidence head sets a
  batch-wide draft budget from measured costs, not draftsmith's per-round threshold.
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.families.dflash.export import speculators_dir, zlab_dir
from draftsmith.families.registry import exports
from draftsmith.layers.export import Source

HEADS = ("markov_head.", "confidence_head.")
"""The tensor prefixes DSpark adds to DFlash's (the same names in every peer)."""


def head_fields(cfg) -> dict:
    """The heads' settings under the peers' names."""
    return {
        "markov_rank": cfg.markov_rank,
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": cfg.confidence_with_markov,
    }


def speculators_fields(cfg) -> dict:
    """What a speculators DSpark config adds to the DFlash one draftsmith writes."""
    return {"architectures": ["DSparkDraftModel"], "speculators_model_type": "dspark", **head_fields(cfg)}


def speculative_config(out, depth: int) -> dict:
    """vLLM's ``--speculative-config`` for a DSpark export: K its trained depth, given (vLLM 0.32 would take a
    speculators DSpark's K from ``block_size``, one more than this fill-in block drafts), capped there by
    ``serve.at_k`` (``parallel_drafting``, which vLLM sets for DSpark itself)."""
    return {"method": "dspark", "model": str(out), "num_speculative_tokens": depth, "parallel_drafting": True}


@exports("vllm", "dspark")
def vllm_dspark(src: Source, out: Path, dtype: str | None) -> dict:
    """z-lab's DFlash layout with the heads, read by vLLM (top-level keys) and SpecForge (``dflash_config``)."""
    cfg = src.network.cfg
    if not cfg.mask_from_token:
        raise DraftsmithError(
            "vLLM's and SpecForge's DSpark embed the masks as the target's embedding of mask_token_id and drop a mask "
            "tensor; this drafter learned its own: train it with model.mask_from_token: true to export here"
        )
    heads = head_fields(cfg)
    extra = {
        "architectures": ["DSparkDraftModel"],
        "sample_from_anchor": False,  # the fill-in block: the committed token, then the masks draft
        **heads,
        "dflash_config": {"projector_type": "dspark", "attention_mode": "mha", **heads},
    }
    zlab_dir(src, out, dtype, src.target_config("vllm"), "vllm", HEADS, extra)
    return speculative_config(out, cfg.depth)


@exports("speculators", "dspark")
def speculators_dspark(src: Source, out: Path, dtype: str | None, k: int | None) -> dict:
    """speculators' DSpark; vLLM is given its K in a ``--speculative-config`` (``speculative_config``)."""
    speculators_dir(src, out, dtype, HEADS, speculators_fields(src.network.cfg))
    return speculative_config(out, src.network.cfg.depth)
