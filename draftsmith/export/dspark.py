"""DSpark checkpoints read back (``draftsmith import``): the heads' settings in the peers' configs. The facts read in
the peers' sources and the writing are DSpark's export hooks, ``families/dflash/dspark/export.py``."""

from __future__ import annotations

from draftsmith.errors import DraftsmithError
from draftsmith.families.dflash.dspark.export import HEADS

__all__ = ["HEADS", "read_heads"]


def read_heads(config: dict, where: str) -> dict:
    """The heads' settings of a DSpark checkpoint (``dflash_config`` first, as SpecForge reads them, then the top
    level, as speculators and vLLM do) as DSparkConfig fields; what draftsmith's DSpark does not compute is one line."""
    nested = config.get("dflash_config") or {}

    def field(name, default=None):
        return nested.get(name, config.get(name, default))

    rank, kind = field("markov_rank", 0) or 0, str(field("markov_head_type", "vanilla")).lower()
    if rank <= 0:
        raise DraftsmithError(f"{where}: markov_rank {rank}: no Markov head (a DFlash drafter, imported as one)")
    if kind != "vanilla":
        raise DraftsmithError(f"{where}: markov_head_type {kind!r} (draftsmith's DSpark has the vanilla Markov head)")
    if not field("enable_confidence_head", True):
        raise DraftsmithError(f"{where}: enable_confidence_head=false (draftsmith's DSpark cuts its drafts by it)")
    return {"markov_rank": int(rank), "confidence_with_markov": bool(field("confidence_head_with_markov", False))}
