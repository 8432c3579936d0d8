"""A scored block as the studies save it: named drafters decoded in one run, interleaved prompt by prompt with plain
decoding of the same target (``score.score_drafters``), its rows as a report saves them (``rows.block_dicts``) and
the machine's load average before and after."""

from __future__ import annotations

import os

from draftsmith.core.draft import Drafter
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.eval.rows import block_dicts
from draftsmith.eval.score import score_drafters
from draftsmith.families.specs import DrafterSpec, load_drafter


def score_block(
    target: Target,
    drafters: dict[str, str | DrafterSpec | Drafter],
    prompts: list[list[int]],
    k: int | str | dict[str, int],
    sampling: Sampling,
    max_new_tokens: int,
    categories: list | None = None,
    references: dict[str, Target] | None = None,
) -> dict:
    """Every drafter of ``drafters`` (name -> its spec or shorthand, ``families.specs``, or a drafter built already,
    as a study that sets its tree shape does) loaded on ``target`` and scored on ``prompts`` at ``k`` (one for all,
    ``"auto"`` or one per name) with ``sampling`` (``score_drafters``: ``categories`` per prompt, ``references``
    decoded plainly beside them); the block as a report saves it, with ``load``: the load average before and after."""
    built = {name: d if isinstance(d, Drafter) else load_drafter(d, target) for name, d in drafters.items()}
    load = os.getloadavg()[0]
    plain, rows = score_drafters(
        target, built, prompts, k, sampling, max_new_tokens, categories=categories, references=references
    )
    return block_dicts(plain, rows) | {"load": [round(load, 2), round(os.getloadavg()[0], 2)]}
