"""Drafter specs: a typed union of what can draft for a target, and the one place shorthand strings are read.

Python code names drafters with these dataclasses (``NGram(3)``, ``Trained("runs/x/drafters/eagle3")``,
``Adaptive(head, 0.5)``, ...); ``parse_spec`` reads the command line's shorthand (``ngram:N:W``, ``target``,
``adaptive:T:HEAD``, a path, each optionally ``NAME=``) into them, and ``build_drafter`` makes the verifier's
drafter from a spec.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from draftsmith.core.draft import Drafter
from draftsmith.core.native import is_native
from draftsmith.core.target import Target
from draftsmith.errors import DraftsmithError


@dataclass(frozen=True)
class NGram:
    """Prompt lookup: continue the latest earlier occurrence of the context's last n-gram."""

    max_ngram: int = 3
    """Longest suffix looked up (shorter ones are tried next)."""
    width: int = 1
    """> 1: a tree of the ``width`` latest distinct continuations."""


@dataclass(frozen=True)
class Trained:
    """A drafter draftsmith trained: a ``DrafterModule`` Lightning ``.ckpt`` or a native export dir."""

    path: str


@dataclass(frozen=True)
class DraftModel:
    """A Hugging Face causal LM directory sharing the target's tokenizer."""

    path: str


@dataclass(frozen=True)
class SelfDraft:
    """The target drafting for itself (every draft accepted under greedy: the verifier's upper bound)."""


@dataclass(frozen=True)
class Adaptive:
    """A trained acceptance head's drafter (SpecDec++): drafts until a rejection is predicted likely."""

    head: str
    """The head's ``.ckpt`` or native dir."""
    threshold: float | None = None
    """Stop once P(some drafted token is rejected) exceeds it (None: the threshold trained with the head)."""


@dataclass(frozen=True)
class Confident:
    """A draft LM that stops a round's draft after a token it gave less than ``threshold`` probability (HF assisted
    generation's confidence stopping, at a fixed threshold); for a DSpark drafter, its confidence head's cut at this
    survival threshold (0: the whole block)."""

    drafter: str
    """A Hugging Face draft-model dir, a trained draft LM or a DSpark drafter (``.ckpt`` or native dir)."""
    threshold: float | None = None
    """None: a draft LM's ``DRAFT_LM_THRESHOLD`` (HF's starting one), a DSpark drafter's recorded threshold."""


DRAFT_LM_THRESHOLD = 0.4
"""``confidence:DRAFT_LM``'s threshold where none is given: HF assisted generation's starting one."""


@dataclass(frozen=True)
class SkipLayers:
    """SWIFT-style self-speculation without training: the target drafts for itself skipping a share of its layers
    (``layers/self_draft.py``)."""

    ratio: float = 0.5
    """Share of the target's layers skipped while drafting."""
    threshold: float = 0.0
    """Stop a draft before its first token of top-1 probability below this (0: draft all K)."""


@dataclass(frozen=True)
class XVocab:
    """A Hugging Face causal LM directory with its own tokenizer (another vocabulary): drafts translated through text
    (``families/xvocab``)."""

    path: str


@dataclass(frozen=True)
class Rasd:
    """RASD: retrieval candidates (the context's, a datastore's) fused into a tree drafter's tree
    (``families/rasd``)."""

    drafter: str
    """The tree drafter (a trained drafter, a HF draft-model dir, or ``target``)."""
    datastore: str | None = None
    """A datastore dir (``draftsmith datastore``), or None."""
    context: bool = True
    """Retrieve from the prompt and the generated text."""
    nodes: int = 16
    """Retrieval nodes added per round at most."""
    ngram: int = 4
    """Longest context suffix matched."""
    prune: int = 8
    """Keep retrieval paths whose first token is among the drafter's this many most likely (0: all)."""
    depth: int | None = None
    """The model drafter's depth per round (None: the round's K); retrieval's paths go as deep as K."""


DrafterSpec = NGram | Trained | DraftModel | SelfDraft | Adaptive | Confident | SkipLayers | XVocab | Rasd


@dataclass(frozen=True)
class Named:
    """A drafter spec with the name reports give it."""

    name: str
    spec: DrafterSpec


def named_paths(spec: DrafterSpec) -> list[str]:
    """The files and directories ``spec`` names (a nested ``rasd:`` drafter's included)."""
    match spec:
        case Trained(path) | DraftModel(path) | XVocab(path):
            return [path]
        case Adaptive(head):
            return [head]
        case Confident(drafter):  # a nested spec, as for rasd
            return named_paths(_parse(drafter))
        case Rasd():
            return [*([spec.datastore] if spec.datastore else []), *named_paths(_parse(spec.drafter))]
    return []


def check_paths(drafters: list[Named]) -> None:
    """Refuse in one line a drafter whose path does not exist: checked before the target is loaded, which for a
    built-in target may mean building it for minutes."""
    from draftsmith.families.rasd.retrieval import SuffixIndex

    for d in drafters:
        missing = [p for p in named_paths(d.spec) if not Path(p).exists()]
        if missing:
            raise DraftsmithError(f"--drafter {d.name}: {missing[0]} does not exist")
        if isinstance(d.spec, Rasd) and d.spec.datastore is not None:
            SuffixIndex.read_record(d.spec.datastore)  # a broken datastore is one line too


def parse_spec(text: str) -> Named:
    """Shorthand -> spec: ``[NAME=]SPEC`` with SPEC ``ngram``, ``ngram:N``, ``ngram:N:W``, ``target``,
    ``adaptive:THRESHOLD:HEAD`` (or ``adaptive:HEAD``), ``confidence:THRESHOLD:DRAFT_LM`` (or
    ``confidence:DRAFT_LM``), ``skip``, ``skip:RATIO`` or ``skip:RATIO:THRESHOLD``, ``xvocab:DIR`` (a HF draft
    model with another tokenizer), ``rasd:DRAFTER`` or ``rasd:KEY=VALUE,...:DRAFTER`` (retrieval fused into a tree
    drafter's tree; keys: ``datastore``, ``context`` (0/1), ``nodes``, ``ngram``, ``prune``), a trained drafter
    (``.ckpt`` or native dir) or a HF draft-model dir. A bare SPEC names itself."""
    name, eq, rest = text.partition("=")
    name, body = (name, rest) if eq and name and "/" not in name and ":" not in name else (text, text)
    return Named(name, _parse(body))


def _parse(text: str) -> DrafterSpec:
    if text.startswith("adaptive:"):
        threshold, head = _thresholded(text, "adaptive:THRESHOLD:HEAD")
        return Adaptive(head, threshold)
    if text.startswith("confidence:"):
        threshold, path = _thresholded(text, "confidence:THRESHOLD:DRAFT_LM")
        if threshold is None:
            return Confident(path)
        if not 0 <= threshold <= 1:
            raise DraftsmithError(f"drafter {text!r}: expected confidence:THRESHOLD:DRAFT_LM, THRESHOLD in [0, 1]")
        return Confident(path, threshold)
    if text == "ngram" or text.startswith("ngram:"):
        parts = text.split(":")[1:]
        if len(parts) > 2 or not all(x.isdigit() and int(x) > 0 for x in parts):
            raise DraftsmithError(f"drafter {text!r}: expected ngram, ngram:N or ngram:N:W with positive integers")
        return NGram(*[int(x) for x in parts])
    if text == "target":
        return SelfDraft()
    if text.startswith("rasd:"):
        return _rasd(text)
    if text.startswith("xvocab:"):
        return XVocab(text.removeprefix("xvocab:"))
    if text == "skip" or text.startswith("skip:"):
        return _skip(text)
    path = Path(text)
    if path.suffix == ".ckpt" or is_native(path):
        return Trained(text)
    return DraftModel(text)


def _skip(text: str) -> SkipLayers:
    form = f"drafter {text!r}: expected skip, skip:RATIO or skip:RATIO:THRESHOLD, RATIO in [0, 1), THRESHOLD in [0, 1]"
    try:
        values = [float(x) for x in text.split(":")[1:]]
    except ValueError:
        raise DraftsmithError(form) from None
    if len(values) > 2 or (values and not 0 <= values[0] < 1) or (len(values) == 2 and not 0 <= values[1] <= 1):
        raise DraftsmithError(form)
    return SkipLayers(*values)


def _rasd(text: str) -> Rasd:
    form = (
        f"drafter {text!r}: expected rasd:DRAFTER or rasd:KEY=VALUE,...:DRAFTER with keys datastore, context (0/1), "
        "ngram, depth (positive), nodes and prune (>= 0; nodes=0: the model drafter alone)"
    )
    first, _, rest = text.removeprefix("rasd:").partition(":")
    if "=" not in first or not rest:
        drafter = "" if "=" in first and text.endswith(":") else text.removeprefix("rasd:")  # rasd:nodes=4:
        return Rasd(_named_drafter(text, drafter, "rasd:DRAFTER or rasd:KEY=VALUE,...:DRAFTER"))
    options: dict = {}
    for item in first.split(","):
        key, _, value = item.partition("=")
        if key == "datastore" and value:
            options[key] = value
        elif key == "context" and value in ("0", "1"):
            options[key] = value == "1"
        elif key in ("nodes", "ngram", "prune", "depth") and value.isdigit() and (int(value) > 0 or key in NON_NEG):
            options[key] = int(value)
        else:
            raise DraftsmithError(form)
    return Rasd(rest, **options)


NON_NEG = ("nodes", "prune")
"""``rasd:`` keys that take 0: no retrieval nodes (the model drafter alone, as ``families.rasd.budget`` measures it), no
pruning."""


def _named_drafter(text: str, drafter: str, form: str) -> str:
    """``drafter``, the spec nested in ``text``; an empty one (``rasd:``) is refused: ``Path("")`` is the current
    directory, which passed the path check and named a drafter ``''`` after the target was loaded."""
    if not drafter:
        raise DraftsmithError(f"drafter {text!r} names no drafter: expected {form}")
    return drafter


def _thresholded(text: str, form: str) -> tuple[float | None, str]:
    """``KIND:THRESHOLD:REST`` -> (THRESHOLD, REST); ``KIND:REST`` -> (None, REST). ``form`` names the shorthand in
    the error for a THRESHOLD that is no number."""
    first, _, rest = text.partition(":")[2].partition(":")
    if not rest:
        return None, _named_drafter(text, first, form)
    try:
        return float(first), rest
    except ValueError:
        raise DraftsmithError(f"drafter {text!r}: expected {form}, THRESHOLD in [0, 1]") from None


def build_drafter(spec: DrafterSpec, target: Target) -> Drafter:
    """The verifier's drafter for ``spec``, checked against ``target``."""
    from draftsmith.families.acceptance_head.network import load_adaptive
    from draftsmith.families.ngram.drafter import NGramDrafter
    from draftsmith.families.registry import load_trained
    from draftsmith.layers.causal_lm import DraftLM
    from draftsmith.layers.self_draft import LayerSkipDrafter

    match spec:
        case NGram(max_ngram, width):
            return NGramDrafter(max_ngram=max_ngram, width=width)
        case SelfDraft():
            return DraftLM(target.model, target.tokenizer)
        case SkipLayers(ratio, threshold):
            return LayerSkipDrafter(ratio, threshold)
        case Adaptive(head, threshold):
            return load_adaptive(head, target, threshold)
        case Confident(path, threshold):
            from draftsmith.families.dflash.dspark.network import DSparkDrafter

            drafter = build_drafter(_parse(path), target)
            if isinstance(drafter, DSparkDrafter):  # its confidence head's cut, at this survival threshold
                drafter.threshold = drafter.threshold if threshold is None else threshold  # None: its recorded one
                return drafter
            if not isinstance(drafter, DraftLM):
                raise DraftsmithError(
                    f"drafter 'confidence:{threshold}:{path}': confidence stopping is for draft LMs, and {path} "
                    f"drafts with a {type(drafter).__name__} (DSpark drafters take it too: their head's cut)"
                )
            drafter.stop_below = DRAFT_LM_THRESHOLD if threshold is None else threshold
            return drafter
        case Trained(path):
            if not Path(path).exists():
                raise DraftsmithError(f"drafter {path!r}: no such checkpoint")
            return load_trained(path, target)
        case Rasd():
            from draftsmith.families.rasd.drafter import RasdDrafter
            from draftsmith.families.rasd.retrieval import SuffixIndex

            store = None if spec.datastore is None else SuffixIndex.load(spec.datastore, target.fingerprint)[0]
            inner = build_drafter(_parse(spec.drafter), target)
            return RasdDrafter(inner, store, spec.context, spec.nodes, spec.ngram, spec.prune, depth=spec.depth)
        case XVocab(path):
            from draftsmith.families.xvocab.drafter import XVocabDrafter

            _check_model_dir(f"xvocab:{path}", Path(path), "a model directory with config.json")
            return XVocabDrafter.from_pretrained(path, target.tokenizer, device=str(target.device))
        case DraftModel(path):
            _check_model_dir(path, Path(path), "'ngram', 'target' or a model directory with config.json")
            return DraftLM.from_pretrained(path, device=str(target.device))
    raise DraftsmithError(f"not a drafter spec: {spec!r}")


def _check_model_dir(spec: str, path: Path, expected: str) -> None:
    """Refuse, in one line naming ``spec``, a path that is not a HF model directory with a readable config.json."""
    config = path / "config.json"
    if not config.is_file():
        raise DraftsmithError(f"drafter {spec!r}: not {expected}")
    try:
        json.loads(config.read_text())
    except json.JSONDecodeError as e:
        raise DraftsmithError(f"drafter {spec!r}: {config} is not valid JSON ({e.msg})") from None


def load_drafter(spec: str | DrafterSpec, target: Target) -> Drafter:
    """``build_drafter`` on a spec or its shorthand (see ``parse_spec``)."""
    return build_drafter(parse_spec(spec).spec if isinstance(spec, str) else spec, target)
