"""speculators-format drafter directories (vLLM's ``speculators`` library; vLLM serves them directly): each family
writes its own (its speculators hook, ``families/<family>/export.py``, registered with ``@exports("speculators",
...)``: EAGLE-3, P-EAGLE, DFlash and DSpark), and this format asks it for that block and makes the ``vllm serve``
command.

Facts, read in speculators 0.3.0 (``config.py``: ``SpeculatorsConfig`` / ``VerifierConfig``, ``proposals/greedy.py``)
and in vLLM 0.32 ``transformers_utils/configs/speculators/{base,algos}.py`` (which requires
``speculators_config.proposal_methods[0].speculative_tokens``, ``verifier.name_or_path`` and
``transformer_layer_config``): every dir carries ``speculators_config`` (``layers.export.speculators_config``), so
``vllm serve OUT`` reads the verifier and the draft length from it. The facts of each family's layout are in its
hook's module.

A speculators hook is ``hook(src, out, dtype, k) -> dict | None``: it writes the drafter dir ``out`` (floating-point
weights in ``dtype``, None: as trained), its proposal drafting ``k`` tokens where the family drafts a chain (default
4; a parallel drafter its trained depth), and returns a vLLM ``--speculative-config`` where vLLM must be given one
(DSpark's K), else None.

speculators 0.9.0's own ``Eagle3DraftModel`` / ``PEagleDraftModel`` / ``DFlashDraftModel.from_pretrained`` load these
dirs and compute the same logits and tokens as draftsmith's drafter (EAGLE-3 over the training-time test, P-EAGLE over
every anchor's placeholder chain, DFlash over a block at every anchor; tests/test_peers.py, in its own venv).
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.export.common import Source
from draftsmith.export.serve import DEFAULTS, Serving, at_k, vllm_command
from draftsmith.families.registry import export_hook


def export(src: Source, out: Path, dtype: str | None, serving: Serving = DEFAULTS) -> str:
    """Write the family's speculators dir; return the ``vllm serve`` command, the target in ``serving.dtype``."""
    spec = export_hook(src.method, "speculators")(src, out, dtype, serving.k)
    if spec is not None:
        return vllm_command(src.target_dir, at_k(spec, serving.k), serving.dtype)
    command = f"vllm serve {out}" + (f" --dtype {serving.dtype}" if serving.dtype else "")
    return command + "  # the verifier is read from speculators_config.verifier.name_or_path"
