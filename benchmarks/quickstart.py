"""``draftsmith quickstart`` as a newcomer runs it (``make demo``), kept as a result: its stages' times and what it
measured (the verifier's table at the plan's K, τ per K, ``--k auto``'s choice, the drafter it exported).

Run: ``.venv/bin/python benchmarks/quickstart.py [--target default] [--out runs/bench-quickstart]``.

The quickstart runs in a subprocess with an empty ``$DRAFTSMITH_HOME`` under ``--out`` (so the target is built as on a
fresh machine, its time counted), unless ``--home`` names one. A run directory that already holds a finished run
(``timings.json``) is collected again without re-running it; ``--rerun`` starts it afresh. Nothing else should run on
the machine meanwhile: the table's speedups are ratios from one run, but the stage times are absolute.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import machine, write

from draftsmith.core.files import write_whole
from draftsmith.eval.report import markdown_table
from draftsmith.eval.rows import read_block, read_rows


def run(args) -> dict | None:
    """Run the quickstart unless ``args.out`` holds a finished run; its wall time and whether the home it built the
    target in was empty, or None when collected."""
    if (args.out / "timings.json").is_file() and not args.rerun:
        print(f"quickstart: {args.out} holds a finished run; collecting it (--rerun to run it again)")
        return None
    if args.rerun and args.out.exists():
        shutil.rmtree(args.out)
    home = args.home or args.out / "home"
    empty = not home.exists() or not any(home.iterdir())
    env = os.environ | {"DRAFTSMITH_HOME": str(home)}
    command = [str(Path(sys.executable).parent / "draftsmith"), "quickstart", "--target", args.target]
    command += ["--out", str(args.out)] + ["--fast"] * args.fast
    print(f"quickstart: {' '.join(command)} (DRAFTSMITH_HOME={home})")
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True)
    return {"wall_seconds": time.perf_counter() - start, "empty_home": empty}


def collect(out: Path) -> dict:
    """What the run measured, from the files it wrote."""
    blocks = {}
    for path in sorted(out.glob("score/*/report.json")):
        report = json.loads(path.read_text())
        blocks[path.parent.name] = {
            "config": report["config"],
            "plain": report["plain"],
            "drafters": report["drafters"],
        }
    best = out / "export" / "best.json"
    return {
        "timings": json.loads((out / "timings.json").read_text()),
        "manifest": json.loads((out / "manifest.json").read_text()),
        "blocks": blocks,
        "export": json.loads(best.read_text()) if best.is_file() else None,
    }


def markdown(result: dict) -> str:
    t = result["timings"]
    stages = ", ".join(f"{name} {secs:.0f} s" for name, secs in t["stages_seconds"].items())
    k = result["manifest"]["k"]
    main = result["blocks"][f"k{k}"]
    cfg = main["config"]
    ks = sorted((b for b in result["blocks"] if b.startswith("k")), key=lambda b: int(b[1:]))
    plain, main_rows = read_block(main)
    names = [d.name for d in main_rows]
    per_k = ["| drafter | " + " | ".join(f"K = {b[1:]}: τ (speedup)" for b in ks) + " |", "|---|" + "---|" * len(ks)]
    for n in names:
        rows = [next((d for d in read_rows(result["blocks"][b]["drafters"]) if d.name == n), None) for b in ks]
        per_k.append(f"| {n} | " + " | ".join(f"{r.tau:.2f} ({r.speedup:.2f}×)" if r else "–" for r in rows) + " |")
    auto = result["blocks"].get("auto")
    chosen = (
        ", ".join(f"{d.name} K = {d.auto_k.k} ({d.speedup:.2f}×)" for d in read_rows(auto["drafters"]) if d.auto_k)
        if auto
        else "not scored"
    )
    e = result["export"]
    exported = (
        "Nothing was trained, so nothing was exported."
        if e is None
        else f"Export: the fastest trained drafter, {e['name']} at K = {e['k']} ({e['speedup']:.2f}×, τ {e['tau']:.2f}), "
        f"in the {e['format']} layout"
        + (f"; {e['advice']}." if not e["beats_plain"] else ", with its serving command.")
    )
    wall, home = result["wall_seconds"], "an empty" if result["empty_home"] else "a used"
    return "\n".join(
        [
            f"# draftsmith quickstart --target {result['args']['target']}{' --fast' * result['args']['fast']}",
            "",
            *([f"**{e['verdict']}**", ""] if e and e.get("verdict") else []),
            f"Wall time {wall:.0f} s ($DRAFTSMITH_HOME: {home} one); the pipeline's stages {t['total_seconds']:.0f} s: {stages}.",
            "",
            f"Target in {cfg.get('dtype', 'float32')}, {cfg['num_prompts']} held-out prompts from `{cfg['prompts']}` × "
            f"{cfg['max_new_tokens']} new tokens, temperature {cfg['temperature']}, K = {k}; plain and speculative "
            "decoding interleaved in the same run:",
            "",
            markdown_table(main_rows, plain),
            "",
            "τ and speedup per draft length:",
            "",
            *per_k,
            "",
            f"`--k auto` chose: {chosen}.",
            "",
            exported,
            "",
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="demo", choices=["demo", "default", "smollm2"])
    p.add_argument("--out", type=Path, default=Path("runs/bench-quickstart"))
    p.add_argument("--home", type=Path, help="$DRAFTSMITH_HOME for the run (default: an empty one under --out)")
    p.add_argument("--fast", action="store_true", help="the quickstart's --fast budgets (a smoke run)")
    p.add_argument("--rerun", action="store_true", help="delete --out's run and run it again")
    args = p.parse_args()
    load = os.getloadavg()[0]
    ran = run(args)
    record = args.out / "benchmark.json"  # the run's machine, command and time, kept for a later collection
    if ran is not None:
        write_whole(record, json.dumps({"machine": machine(), **ran, "load": [load, os.getloadavg()[0]]}))
    if not record.is_file():
        raise SystemExit(f"quickstart: {args.out} holds a run this benchmark did not time; --rerun runs it afresh")
    result = {"args": {"target": args.target, "fast": args.fast, "out": str(args.out)}}
    result |= json.loads(record.read_text()) | collect(args.out)
    name = "quickstart" if args.target == "demo" else f"quickstart_{args.target}"
    write(name + "_fast" * args.fast, result, markdown(result))


if __name__ == "__main__":
    main()
