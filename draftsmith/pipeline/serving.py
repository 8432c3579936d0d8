"""The pipeline's serving advice, as measured: every drafter the verifier scored, ranked by its measured speedup, each
with how an engine serves it or why none does, and the command of the fastest servable one first.

Each drafter is taken at its best measured shape: the row of the run's score blocks (each fixed K and ``--k auto``)
it ran fastest in, and set as it was measured there: at that block's K (``--k auto``'s choice for it in that block)
and with the target in the dtype it was scored in (``export.serve``). Two speedups closer than the noise of one run
(how much plain decoding of the same prompts varied between the run's blocks) are said to be within it. The
untrained options count too: prompt lookup (vLLM's ``ngram``) and a draft-model directory (vLLM's
``draft_model``). RASD's fused drafter and an acceptance head's adaptive drafter are ranked but not servable: no
engine runs them (an engine user gets their model drafter, ranked on its own).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.eval.rows import PlainRow, ScoreRow, read_block
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
    scores: str | None = None
    """The score block it was measured in (its fastest of the run's)."""


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


def best_measured(blocks: dict[str, list[ScoreRow]]) -> tuple[list[ScoreRow], dict[str, str]]:
    """Each drafter's fastest row over the run's score ``blocks`` (block -> rows; ties: τ, then the first block), and
    per drafter the block it came from."""
    best: dict[str, tuple[ScoreRow, str]] = {}
    for block, rows in blocks.items():
        for row in rows:
            if row.name not in best or (row.speedup, row.tau) > (best[row.name][0].speedup, best[row.name][0].tau):
                best[row.name] = (row, block)
    return [r for r, _ in best.values()], {name: block for name, (_, block) in best.items()}


def run_noise(plains: list[PlainRow]) -> float | None:
    """The noise of one run's speedups: how much plain decoding of the same tokens varied between its score blocks
    (fastest / slowest - 1); None with fewer than two blocks of the same tokens."""
    same = [p.tokens_per_s for p in plains if p.tokens == plains[0].tokens]
    return max(same) / min(same) - 1 if len(same) >= 2 else None


def serving_options(
    rows: list[ScoreRow],
    specs: list[Named],
    target_dir: Path,
    dtype: str,
    exported: dict[str, Exported],
    measured_in: dict[str, str] | None = None,
) -> list[Option]:
    """Every row as an ``Option``, fastest first (ties: τ). ``exported``: the trained drafters exported for serving
    (a trained drafter not in it is not served: slower than plain decoding); ``measured_in``: per drafter, the score
    block its row comes from."""
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
        block = (measured_in or {}).get(row.name)
        options.append(Option(row.name, row.speedup, row.tau, k, served, servable, command, block))
    return options


def did_not_learn(path: str | Path) -> str | None:
    """Why the fit of a trained drafter's native dir did not learn (its export records it), or None."""
    return json.loads((Path(path) / "config.json").read_text()).get("did_not_learn")


def _trained(path: str, exported: Exported | None) -> tuple[str, str | None, bool]:
    """(how it is served, the command, whether an engine serves it) for a trained drafter; never one whose fit did
    not learn (its export records why: ``train.fit.FitResult.did_not_learn``)."""
    record = json.loads((Path(path) / "config.json").read_text())
    if record.get("did_not_learn"):
        return f"not servable: did not learn ({record['did_not_learn']})", None, False
    method = record["method"]
    fmt = serving_format(method)
    if fmt == "native":
        return f"not servable: {WHY_NOT.get(method, f'no engine loads a {method} drafter')}", None, False
    if exported is not None and exported.refused:
        return f"not servable: {exported.refused}", None, False
    how = f"vLLM {method} drafter" if fmt == "vllm" else f"vLLM draft model (method draft_model; {fmt} export)"
    if exported is None:
        return f"{how} (not exported: slower than plain decoding)", None, True
    return how, exported.command, True


def export_best(out: Path, specs: list[Named], target_dir: Path, dtype: str, blocks: list[Path] | None = None) -> dict:
    """Rank every drafter at its best measured shape over the run's score ``blocks`` (their ``report.json``; default:
    every ``out/score/*/report.json``) by measured speed (``best_measured``, ``serving_options``), export the fastest
    trained drafter, and every other trained one faster than plain decoding, in its serving format at the K it ran
    fastest at to ``out/export/<name>``, record it all in ``out/export/best.json`` (returned; its top level names the
    fastest trained drafter, ``options`` the ranking, ``serve`` the fastest servable option, ``noise`` the noise of
    one run, ``run_noise``), print the fastest servable option's command first, and say plainly when no trained
    drafter beats plain decoding. Exporting takes a second, so it is redone every run and can never be stale."""
    paths = blocks if blocks is not None else sorted(out.glob("score/*/report.json"), key=_block_order)
    saved = {str(p.relative_to(out)): read_block(json.loads(p.read_text())) for p in paths}
    rows, measured_in = best_measured({block: rows for block, (_, rows) in saved.items()})
    noise = run_noise([plain for plain, _ in saved.values()])
    trained = {s.name: Path(s.spec.path) for s in specs if isinstance(s.spec, Trained)}
    dead = {name: why for name, path in trained.items() if (why := did_not_learn(path))}
    best = max((r for r in rows if r.name in trained), key=lambda r: (r.name not in dead, r.speedup, r.tau))
    shutil.rmtree(out / "export", ignore_errors=True)
    exported = {
        r.name: _export(trained[r.name], out / "export" / r.name, row_k(r))
        for r in rows
        if r.name in trained and (r is best or (r.speedup > 1.0 and r.name not in dead))
    }
    options = serving_options(rows, specs, target_dir, dtype, exported, measured_in)
    serve = next((o for o in options if o.command), None)
    mine = exported[best.name]
    record = {
        "name": best.name,
        "scores": list(saved),
        "noise": None if noise is None else round(noise, 4),
        "format": mine.format,
        "dir": str((out / "export" / best.name).absolute()),
        "k": row_k(best),
        "dtype": dtype,
        "speedup": best.speedup,
        "tau": best.tau,
        "command": mine.command,
        "beats_plain": best.speedup > 1.0 and best.name not in dead,
        **({"refused": mine.refused} if mine.refused else {}),
        "options": [asdict(o) for o in options],
        "serve": asdict(serve) if serve else None,
    }
    if not record["beats_plain"]:
        record["advice"] = (
            f"no trained drafter learned here: the fastest, {best.name}, did not learn ({dead[best.name]}; "
            f"exported to {record['dir']} for inspection, not for serving)"
            if best.name in dead
            else f"no trained drafter beats plain decoding here: the fastest, {best.name}, ran at "
            f"{best.speedup:.2f}x (exported to {record['dir']} for inspection, not for serving)"
        )
        record["advice"] += (
            f"; {serve.name} ran at {serve.speedup:.2f}x: {serve.command}"
            if serve
            else "; nothing an engine serves beat plain decoding: serve the target without speculation"
        )
    record["verdict"] = verdict(record)
    (out / "export" / "best.json").write_text(json.dumps(record, indent=2))
    _print(record, options, serve)
    return record


def _block_order(path: Path) -> tuple[int, int]:
    """Score blocks in the order the pipeline makes them: each fixed K by K, then ``--k auto``."""
    name = path.parent.name
    return (0, int(name[1:])) if name[1:].isdigit() else (1, 0)


def verdict(record: dict) -> str:
    """The one sentence a newcomer acts on (the report's lead): what to serve, how much faster it made the target,
    and how that compares with the free n-gram baseline (prompt lookup, which needs no training); each at its best
    measured shape, and when the two compared are within the noise of one run (``record["noise"]``), said so."""
    noise, blocks = record.get("noise"), len(record.get("scores") or [])
    why = f"plain decoding of the same prompts varied {noise or 0:.0%} between its {blocks} blocks"

    def close(a: float, b: float) -> bool:
        return noise is not None and abs(a - b) < noise * max(a, b)

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
        if close(serve["speedup"], record["speedup"]):
            within = f"is within the noise of one run of it ({why})"
            return f"{head} without any training; the best trained drafter, {trained}, {within}."
        return f"{head} without any training; the best trained drafter, {trained}, did not beat it."
    if not free:
        return f"{head}."
    if close(serve["speedup"], ngram["speedup"]):
        return f"{head}, against {free}: the two are within the noise of one run ({why})."
    return f"{head}, against {free}."


def _export(src: Path, dest: Path, k: int) -> Exported:
    """``src`` exported in its serving format, drafting ``k`` tokens; natively when that format refuses it."""
    fmt = serving_format(json.loads((src / "config.json").read_text())["method"])
    try:
        return Exported(fmt, write_export(src, fmt, dest, overwrite=True, k=k))
    except DraftsmithError as e:  # e.g. an EAGLE-3 on a target too shallow for engines to feed it
        return Exported("native", write_export(src, "native", dest, overwrite=True), f"--to {fmt}: {e}")


def _print(record: dict, options: list[Option], serve: Option | None) -> None:
    print(f"  {record['verdict']}")
    print(
        f"  by measured speed (each at its fastest of {', '.join(record['scores'])}; the target in {record['dtype']}):"
    )
    for i, o in enumerate(options, 1):
        print(f"    {i}. {o.name}: {o.speedup:.2f}x at K={o.k} (τ {o.tau:.2f}; {o.scores}): {o.served}")
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
