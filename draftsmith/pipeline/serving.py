"""The pipeline's serving advice, as measured: every drafter the verifier scored, ranked by its measured speedup, each
with how an engine serves it or why none does, and the command of the fastest servable one first.

Each option is set as it was measured: at the K ``--k auto`` chose for it (else the block's K) and with the target
in the dtype it was scored in (``export.serve``). The untrained options count too: prompt lookup (vLLM's ``ngram``)
and a draft-model directory (vLLM's ``draft_model``). RASD's fused drafter and an acceptance head's adaptive drafter
are ranked but not servable: no engine runs them (an engine user gets their model drafter, ranked on its own).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.eval.rows import ScoreRow, read_rows
from draftsmith.export.registry import WHY_NOT, serving_format, write_export
from draftsmith.export.serve import draft_model_config, ngram_config, vllm_command
from draftsmith.families.specs import Adaptive, DraftModel, Named, NGram, Rasd, Trained


@dataclass(frozen=True)
class Option:
    """One scored drafter as a way to serve the target."""

    name: str
    speedup: float
    """Measured by the verifier against plain decoding of the same target, same run."""
    tau: float
    k: int
    """The draft length it was measured at (and is served at)."""
    served: str
    """How an engine serves it, or why none does."""
    servable: bool
    command: str | None = None
    """The command that serves it; only for a servable option faster than plain decoding."""


@dataclass(frozen=True)
class Exported:
    """A trained drafter exported for serving."""

    format: str
    """The format written: its engine's, or ``native`` when that refused it."""
    command: str
    """The command the export returned (the serving command unless refused)."""
    refused: str | None = None
    """Why its engine's format refused it."""


def row_k(row: ScoreRow) -> int:
    """The K a row was measured at: ``--k auto``'s choice, else the block's."""
    return row.auto_k.k if row.auto_k else row.k


def serving_options(
    rows: list[ScoreRow], specs: list[Named], target_dir: Path, dtype: str, exported: dict[str, Exported]
) -> list[Option]:
    """Every row as an ``Option``, fastest first (ties: τ). ``exported``: the trained drafters exported for serving
    (a trained drafter not in it is not served: slower than plain decoding)."""
    by_name = {s.name: s.spec for s in specs}
    names = {s.spec.path: s.name for s in specs if isinstance(s.spec, Trained)}
    options = []
    for row in sorted(rows, key=lambda r: (r.speedup, r.tau), reverse=True):
        k, spec = row_k(row), by_name.get(row.name)
        command, served, servable = None, "not servable: no engine runs this drafter", False
        match spec:
            case NGram(max_ngram, 1):
                served = f"vLLM prompt lookup (method ngram, n-grams of {max_ngram} down to 1)"
                command, servable = vllm_command(target_dir, ngram_config(k, max_ngram), dtype), True
            case NGram():
                served = "not servable: vLLM's prompt lookup drafts one continuation, not a tree of several"
            case DraftModel(path):
                served = "vLLM draft model (method draft_model)"
                command, servable = vllm_command(target_dir, draft_model_config(path, k), dtype), True
            case Trained(path):
                served, command, servable = _trained(path, exported.get(row.name))
            case Rasd(drafter):
                served = (
                    f"not servable as such: no engine serves the fused tree; an engine serves its model drafter "
                    f"{names.get(drafter, drafter)} (ranked on its own) and, as a separate method, prompt lookup"
                )
            case Adaptive():
                served = "not servable: no engine stops drafts by an acceptance head; its drafter is served alone"
        command = command if row.speedup > 1.0 else None  # a slowdown is never offered as the thing to serve
        options.append(Option(row.name, row.speedup, row.tau, k, served, servable, command))
    return options


def _trained(path: str, exported: Exported | None) -> tuple[str, str | None, bool]:
    """(how it is served, the command, whether an engine serves it) for a trained drafter."""
    method = json.loads((Path(path) / "config.json").read_text())["method"]
    fmt = serving_format(method)
    if fmt == "native":
        return f"not servable: {WHY_NOT.get(method, f'no engine loads a {method} drafter')}", None, False
    if exported is not None and exported.refused:
        return f"not servable: {exported.refused}", None, False
    how = f"vLLM {method} drafter" if fmt == "vllm" else f"vLLM draft model (method draft_model; {fmt} export)"
    if exported is None:
        return f"{how} (not exported: slower than plain decoding)", None, True
    return how, exported.command, True


def export_best(out: Path, specs: list[Named], target_dir: Path, dtype: str) -> dict:
    """Rank every drafter of the ``--k auto`` block (else the largest K's) by measured speed (``serving_options``),
    export the fastest trained drafter, and every other trained one faster than plain decoding, in its serving
    format to ``out/export/<name>``, record it all in ``out/export/best.json`` (returned; its top level names the
    fastest trained drafter, ``options`` the ranking, ``serve`` the fastest servable option), print the fastest
    servable option's command first, and say plainly when no trained drafter beats plain decoding. Exporting takes a
    second, so it is redone every run and can never be stale."""
    block = out / "score" / "auto" / "report.json"
    if not block.is_file():
        block = max(out.glob("score/k*/report.json"), key=lambda p: int(p.parent.name[1:]))
    rows = read_rows(json.loads(block.read_text())["drafters"])
    trained = {s.name: Path(s.spec.path) for s in specs if isinstance(s.spec, Trained)}
    best = max((r for r in rows if r.name in trained), key=lambda r: (r.speedup, r.tau))
    shutil.rmtree(out / "export", ignore_errors=True)
    exported = {
        r.name: _export(trained[r.name], out / "export" / r.name, row_k(r))
        for r in rows
        if r.name in trained and (r is best or r.speedup > 1.0)
    }
    options = serving_options(rows, specs, target_dir, dtype, exported)
    serve = next((o for o in options if o.command), None)
    mine = exported[best.name]
    record = {
        "name": best.name,
        "scores": str(block.relative_to(out)),
        "format": mine.format,
        "dir": str((out / "export" / best.name).absolute()),
        "k": row_k(best),
        "dtype": dtype,
        "speedup": best.speedup,
        "tau": best.tau,
        "command": mine.command,
        "beats_plain": best.speedup > 1.0,
        **({"refused": mine.refused} if mine.refused else {}),
        "options": [asdict(o) for o in options],
        "serve": asdict(serve) if serve else None,
    }
    if not record["beats_plain"]:
        record["advice"] = (
            f"no trained drafter beats plain decoding here: the fastest, {best.name}, ran at {best.speedup:.2f}x "
            f"(exported to {record['dir']} for inspection, not for serving)"
        )
        record["advice"] += (
            f"; {serve.name} ran at {serve.speedup:.2f}x: {serve.command}"
            if serve
            else "; nothing an engine serves beat plain decoding: serve the target without speculation"
        )
    record["verdict"] = verdict(record)
    (out / "export" / "best.json").write_text(json.dumps(record, indent=2))
    _print(record, options, serve, block.relative_to(out))
    return record


def verdict(record: dict) -> str:
    """The one sentence a newcomer acts on (the report's lead): what to serve, how much faster it made the target,
    and how that compares with the free n-gram baseline (prompt lookup, which needs no training)."""
    ngram = next((o for o in record["options"] if o["name"] == "ngram"), None)
    serve, trained = record["serve"], f"{record['name']} ({record['speedup']:.2f}× at K = {record['k']})"
    free = f"{ngram['speedup']:.2f}× for the free n-gram baseline (prompt lookup, no training)" if ngram else ""
    if serve is None:
        return (
            "Serve the target without speculation: nothing servable beat plain decoding here "
            f"(the best trained drafter: {trained}{'; ' + free if free else ''})."
        )
    head = (
        f"Serve {serve['name']}: it made the target {serve['speedup']:.2f}× faster than plain decoding "
        f"(K = {serve['k']}, τ {serve['tau']:.2f})"
    )
    if serve["name"] == "ngram":
        return f"{head} without any training; the best trained drafter, {trained}, did not beat it."
    return f"{head}, against {free}." if free else f"{head}."


def _export(src: Path, dest: Path, k: int) -> Exported:
    """``src`` exported in its serving format, drafting ``k`` tokens; natively when that format refuses it."""
    fmt = serving_format(json.loads((src / "config.json").read_text())["method"])
    try:
        return Exported(fmt, write_export(src, fmt, dest, overwrite=True, k=k))
    except DraftsmithError as e:  # e.g. an EAGLE-3 on a target too shallow for engines to feed it
        return Exported("native", write_export(src, "native", dest, overwrite=True), f"--to {fmt}: {e}")


def _print(record: dict, options: list[Option], serve: Option | None, block: Path) -> None:
    print(f"  {record['verdict']}")
    print(f"  by measured speed ({block}; each at its K, the target in {record['dtype']}):")
    for i, o in enumerate(options, 1):
        print(f"    {i}. {o.name}: {o.speedup:.2f}x at K={o.k} (τ {o.tau:.2f}): {o.served}")
    if serve:
        print(f"  serve {serve.name} (the fastest servable, {serve.speedup:.2f}x at K={serve.k}):\n  {serve.command}")
    if "refused" in record:
        print(f"  {record['name']}: {record['refused']}")
    if record["beats_plain"]:
        print(
            f"  {record['name']} ({record['speedup']:.2f}x at K={record['k']}) -> {record['dir']} ({record['format']})"
        )
        if serve is None or serve.name != record["name"]:
            print(f"  {record['command']}")
    else:
        print(f"  {record['advice']}")
