"""The rows of a score report: what ``score_drafters`` returns, what reports, plots and benchmarks read by attribute.

A row serialises (``to_dict``) to the dict ``report.json`` saves, and a saved report's rows read back
(``from_dict``), reports saved before a field existed included (its value is then None).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from draftsmith.core.trees import VerifyRule
from draftsmith.decode.auto_k import Shape
from draftsmith.decode.metrics import DrafterMetrics, PlainMetrics


@dataclass
class PlainRow(PlainMetrics):
    """Plain decoding of the target in a score run, and how many of its answers pass their prompt's check (prompts
    with checks only, ``data/checks.py``; None without)."""

    checked: int | None = None
    checks_passed: int | None = None
    references: dict[str, PlainMetrics] | None = None
    """Plain decoding of other targets in the same interleaved run (``score_drafters(references=...)``: the same
    weights with the fastest kernels, or in float32), by name; None without."""

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(PlainMetrics)}
        if self.checked is not None:
            out |= {"checked": self.checked, "checks_passed": self.checks_passed}
        if self.references is not None:
            out["references"] = {name: m.to_dict() for name, m in self.references.items()}
        return out

    @classmethod
    def from_dict(cls, d: dict) -> PlainRow:
        metrics = {f.name: d[f.name] for f in fields(PlainMetrics)}
        refs = {name: PlainMetrics(**m) for name, m in d["references"].items()} if "references" in d else None
        return cls(**metrics, checked=d.get("checked"), checks_passed=d.get("checks_passed"), references=refs)

    @property
    def fastest(self) -> PlainMetrics:
        """The fastest plain decoding of the run: this target's or a reference's."""
        return max([self, *(self.references or {}).values()], key=lambda m: m.tokens_per_s)


OPTIONAL_METRICS = ("tau_full", "verify_ratio")
"""Metrics reports saved before they were measured lack (None when read back; the tables print "–")."""


@dataclass
class ScoreRow(DrafterMetrics):
    """One drafter's row of a score report: what the verifier measured (``DrafterMetrics``) and what the run adds."""

    prompts: int | None = None
    """Prompts decoded (None in reports saved before it was recorded)."""
    auto_k: Shape | None = None
    """The draft shape ``--k auto`` chose, when it chose."""
    lossy: bool = False
    """Judge decoding: output leaves the target's wherever the judge keeps a rejected token."""
    judged: int | None = None
    """Judge decoding: draft tokens only the judge kept."""
    judged_share: float | None = None
    """Judge decoding: ``judged`` / accepted draft tokens."""
    divergences: list[dict] | None = None
    """Greedy rows whose output left plain greedy output: where, and the target's logit gap there
    (``score.divergences``)."""
    categories: dict[str, dict] | None = None
    """τ, speedup and prompts per prompt category (``metrics.by_category``)."""
    extra: dict = field(default_factory=dict)
    """What the drafter adds (``Drafter.extra_metrics``: online adaptation's ``online``, ...) and, read back from a
    saved report, what a benchmark added; saved as top-level keys."""
    target: str | None = None
    """The target the drafter decoded with when it is not the run's (a drafter that fine-tuned its own: Medusa-2)."""
    verify: VerifyRule | None = None
    """The multi-candidate rule, when not SpecInfer."""
    checked: int | None = None
    """Answers whose prompt has a check (``data/checks.py``)."""
    checks_passed: int | None = None
    """Of those, answers that pass it."""
    prompt_rounds: list[tuple[int, int]] | None = None
    """Per prompt, in the run's order: (accepted draft tokens, verification rounds), so that a report can give the
    spread of τ between prompts (``metrics.tau_gain``); None in reports saved before it was recorded."""

    def to_dict(self) -> dict:
        """The row as ``report.json`` saves it: the metrics, then each addition only where it is set."""
        out = {
            f.name: getattr(self, f.name)
            for f in fields(DrafterMetrics)
            if not (f.name in OPTIONAL_METRICS and getattr(self, f.name) is None)
        }
        if self.prompts is not None:
            out["prompts"] = self.prompts
        if self.auto_k is not None:
            out["auto_k"] = self.auto_k.to_dict()
        if self.lossy:
            out |= {"lossy": True, "judged": self.judged, "judged_share": self.judged_share}
        if self.divergences is not None:
            out["divergences"] = self.divergences
        if self.categories is not None:
            out["categories"] = self.categories
        out |= self.extra
        for name in ("target", "verify"):
            if getattr(self, name) is not None:
                out[name] = str(getattr(self, name))
        if self.checked is not None:
            out |= {"checked": self.checked, "checks_passed": self.checks_passed}
        if self.prompt_rounds is not None:
            out["prompt_rounds"] = [list(pair) for pair in self.prompt_rounds]
        return out

    @classmethod
    def from_dict(cls, d: dict) -> ScoreRow:
        """A saved report's row; keys this class does not name land in ``extra``."""
        metrics = {f.name: d.get(f.name) if f.name in OPTIONAL_METRICS else d[f.name] for f in fields(DrafterMetrics)}
        own = {f.name for f in fields(cls)}
        return cls(
            **metrics,
            prompts=d.get("prompts"),
            auto_k=Shape.from_dict(d["auto_k"]) if d.get("auto_k") else None,
            lossy=d.get("lossy", False),
            judged=d.get("judged"),
            judged_share=d.get("judged_share"),
            divergences=d.get("divergences"),
            categories=d.get("categories"),
            extra={key: value for key, value in d.items() if key not in own},
            target=d.get("target"),
            verify=VerifyRule(d["verify"]) if d.get("verify") else None,
            checked=d.get("checked"),
            checks_passed=d.get("checks_passed"),
            prompt_rounds=[tuple(pair) for pair in d["prompt_rounds"]] if d.get("prompt_rounds") else None,
        )


def read_rows(saved: list[dict]) -> list[ScoreRow]:
    """A saved report's ``drafters``, as rows."""
    return [ScoreRow.from_dict(d) for d in saved]


def to_dicts(rows: list[ScoreRow]) -> list[dict]:
    """Rows as a report saves them."""
    return [row.to_dict() for row in rows]


def read_block(saved: dict) -> tuple[PlainRow, list[ScoreRow]]:
    """A saved report's (or a benchmark's block's) ``plain`` and ``drafters``, as rows."""
    return PlainRow.from_dict(saved["plain"]), read_rows(saved["drafters"])


def block_dicts(plain: PlainRow, rows: list[ScoreRow]) -> dict:
    """``plain`` and ``drafters`` as a report saves them (``read_block``'s inverse)."""
    return {"plain": plain.to_dict(), "drafters": to_dicts(rows)}
