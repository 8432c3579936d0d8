"""Drafters trained elsewhere -> draftsmith native dirs (``draftsmith import``), checked against the target.

``import_drafter`` reads a checkpoint dir (``core.read_checkpoint``), detects what it holds (``detect``: its family
and layout) and hands it to that family's importer (``IMPORTERS``), one module per family, each reading the layouts
the field writes it in:

- ``eagle3``: EAGLE-3 and P-EAGLE in the speculators, SGLang / SpecForge / original EAGLE (SafeAILab) and vLLM
  layouts (``eagle_layout.LAYOUTS``, the table the exporters write by).
- ``dflash``: DFlash and DSpark in the speculators layout and z-lab's (what z-lab releases, vLLM and SGLang serve and
  SpecForge trains).
- ``pard``: PARD draft LMs as vLLM serves them (AMD's PARD releases, draftsmith's vLLM export).
- ``medusa``: Medusa heads in the Medusa repository's layout (FasterDecoding/Medusa, TGI) and vLLM's.

``core`` is what they share: the checkpoint dir's tensors, the target they are checked against, the checks and shaping
of a decoder layer, the native dir written. What a drafter of draftsmith's cannot compute is refused with one line
naming the config field, never approximated.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftsmith.core.files import refuse_existing
from draftsmith.export.imports.core import Checkpoint, ImportTarget, read_checkpoint
from draftsmith.export.imports.dflash import import_dflash, import_dspark
from draftsmith.export.imports.eagle3 import eagle_layout_of, import_eagle3
from draftsmith.export.imports.medusa import import_medusa
from draftsmith.export.imports.pard import import_pard


@dataclass(frozen=True)
class Detected:
    """What a checkpoint holds: its family (which importer reads it) and the layout it is in."""

    family: str
    """``eagle3`` (EAGLE-3 and P-EAGLE), ``dflash``, ``dspark``, ``pard`` or ``medusa``."""
    layout: str
    """eagle3: a ``LAYOUTS`` name; dflash and dspark: ``speculators`` or ``z-lab``; pard: ``vllm``; medusa: ``medusa`` (the
    Medusa repository's) or ``vllm``."""


def detect(ckpt: Checkpoint) -> Detected:
    """The family and layout of a checkpoint, from its config and tensor names (see the importers' docstrings)."""
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


IMPORTERS = {
    "eagle3": import_eagle3,
    "dflash": import_dflash,
    "dspark": import_dspark,
    "pard": import_pard,
    "medusa": import_medusa,
}
"""One importer per family ``detect`` tells apart; each reads the layout it is given."""
