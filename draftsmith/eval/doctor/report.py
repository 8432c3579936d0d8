"""``draftsmith doctor``'s verdicts: one ``Check`` per check (a line for the user, its numbers for ``doctor.json``),
the statuses, and ``doctor.md``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

PASS, FAIL, NOT_RUN, INFO = "pass", "fail", "not run", "info"

JUDGED = 0.1
"""First-token acceptance a comparison of readings needs somewhere: below it, no reading is told from another."""


@dataclass
class Check:
    """One check's outcome: one line for the user, the numbers behind it for ``doctor.json``."""

    name: str
    status: str
    """``pass``, ``fail``, ``not run`` or ``info`` (measured, nothing to judge it against)."""
    finding: str
    """What was found or measured (for ``not run``: why it was not run)."""
    cause: str = ""
    fix: str = ""
    data: dict = field(default_factory=dict)

    def line(self) -> str:
        text = f"{self.status.upper():<7} {self.name}: {self.finding}"
        if self.cause:
            text += f"; cause: {self.cause}"
        if self.fix:
            text += f"; fix: {self.fix}"
        return text

    def to_dict(self) -> dict:
        return asdict(self)


def dead(name: str, finding: str, data: dict) -> Check:
    """A measured comparison that cannot tell its readings apart: the drafter accepts next to nothing at any."""
    return Check(
        name,
        INFO,
        f"{finding}: below {JUDGED} at every reading, nothing to tell apart",
        cause="the drafter accepts next to nothing whatever this check varies; the cause is elsewhere",
        data=data,
    )


def not_run(name: str, why: str) -> Check:
    return Check(name, NOT_RUN, why)


def markdown(report: dict) -> str:
    """``doctor.md``: what was examined, then one row per check."""
    rows = [
        "# draftsmith doctor",
        "",
        f"Drafter `{report['drafter']}` ({report['source']}) against target `{report['target']['name']}` "
        f"on {report['prompts']} prompts from `{report['prompts_source']}` (greedy, up to "
        f"{report['max_new_tokens']} new tokens, K = {report['k']}).",
        "",
        "| check | status | finding | cause | fix |",
        "|---|---|---|---|---|",
    ]
    for c in report["checks"]:
        cells = [c["name"], c["status"], c["finding"], c["cause"], c["fix"]]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"
