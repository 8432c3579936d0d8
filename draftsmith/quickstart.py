"""``draftsmith quickstart``: the whole pipeline on the embedded default target."""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith import default_target
from draftsmith.eval.score import score


def quickstart(out: Path = Path("runs/quickstart"), fast: bool = False, num_prompts: int = 20, k: int = 4) -> dict:
    """Build (or reuse) the default target and score the baseline drafters on held-out prompts.

    Args:
        out: run directory; every stage's artifact is reused when present.
        fast: tiny budgets everywhere (seconds; for tests and smoke runs).
        num_prompts: held-out prompts to score on.
        k: tokens drafted per round.
    """
    config = default_target.FAST if fast else default_target.TargetBuildConfig()
    print("[1/2] default target")
    target_dir = default_target.build(config)
    build = json.loads((target_dir / "build.json").read_text())
    print(
        f"  {target_dir}: held-out perplexity {build['target']['heldout_ppl']} "
        f"(unigram {build['unigram_heldout_ppl']}), {build['target']['params'] / 1e6:.1f}M parameters"
    )
    print("[2/2] score baseline drafters")
    drafters = ["ngram"] + (["sibling"] if (target_dir / "sibling").is_dir() else [])
    specs = [str(target_dir / d) if d == "sibling" else d for d in drafters]
    return score(
        target=str(target_dir),
        drafter=specs,
        prompts="builtin:heldout",
        k=k,
        num_prompts=4 if fast else num_prompts,
        max_new_tokens=24 if fast else 64,
        out=Path(out) / "score",
    )
