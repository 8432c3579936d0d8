"""Turn a ``--drafter`` spec into a Drafter: ``ngram[:N]``, ``target`` (self-drafting), or a model dir."""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.core.draft import Drafter
from draftsmith.core.native import is_native
from draftsmith.core.target import Target
from draftsmith.errors import DraftsmithError
from draftsmith.families.draft_lm.network import DraftLM
from draftsmith.families.ngram.drafter import NGramDrafter
from draftsmith.families.registry import load_trained


def load_drafter(spec: str, target: Target) -> Drafter:
    """Build the drafter named by ``spec`` for ``target``.

    Specs: ``ngram``, ``ngram:N`` or ``ngram:N:W`` (prompt lookup up to N-grams; W > 1 proposes
    a tree of the W latest distinct continuations), ``target``
    (the target drafting for itself: every draft accepted under greedy), a trained
    drafter (a ``DrafterModule`` Lightning ``.ckpt`` or a native export dir), or a
    directory holding a Hugging Face causal LM sharing the target's tokenizer.
    ``adaptive:THRESHOLD:HEAD`` is a trained acceptance head's drafter stopping at THRESHOLD
    (a bare HEAD path uses the threshold recorded with it).
    """
    if spec.startswith("adaptive:"):
        threshold, _, head = spec.removeprefix("adaptive:").partition(":")
        try:
            value = float(threshold)
        except ValueError:
            raise DraftsmithError(f"drafter {spec!r}: expected adaptive:THRESHOLD:HEAD, THRESHOLD in [0, 1]") from None
        from draftsmith.families.acceptance_head.network import load_adaptive

        return load_adaptive(head, target, value)
    if spec == "ngram" or spec.startswith("ngram:"):
        parts = spec.split(":")[1:]
        if len(parts) > 2 or not all(x.isdigit() and int(x) > 0 for x in parts):
            raise DraftsmithError(f"drafter {spec!r}: expected ngram, ngram:N or ngram:N:W with positive integers")
        n, width = [int(x) for x in parts] + [3, 1][len(parts) :]
        return NGramDrafter(max_ngram=n, width=width)
    if spec == "target":
        return DraftLM(target.model, target.tokenizer)
    path = Path(spec)
    if path.suffix == ".ckpt" or is_native(path):
        if not path.exists():
            raise DraftsmithError(f"drafter {spec!r}: no such checkpoint")
        return load_trained(path, target)
    config = path / "config.json"
    if not config.is_file():
        raise DraftsmithError(f"drafter {spec!r}: not 'ngram', 'target' or a model directory with config.json")
    try:
        json.loads(config.read_text())
    except json.JSONDecodeError as e:
        raise DraftsmithError(f"drafter {spec!r}: {config} is not valid JSON ({e.msg})") from None
    return DraftLM.from_pretrained(path, device=str(target.device))
