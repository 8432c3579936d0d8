"""Issue 86 on one GPU: draftsmith's trainer and the peers' (speculators, SpecForge) on the same GPU and the same rows
of the packed corpus, each with draftsmith's recipe where its flags reach, and their drafters scored by draftsmith's
verifier on that GPU in one interleaved block per set (``benchmarks/peers.py``, the CPU comparison's script).

Here, once (the weights and the wheels travel: the device reaches no network and takes 64 MiB a call):

    bash benchmarks/gpu_weights.sh split && bash engines/peers/gpu_wheels.sh

There, three calls on a warm machine (each within ~30 s of the last; each call's carry in brackets; the tree itself
is ~9 MB of the 64 MiB a call takes, so the wheels cannot ride with a part of the weights):

    # 1 [".whl-peers"]: the peers' packages, and whether they import there (the cheap check first)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /root/keep/peers .whl-peers/*.whl \
        && PYTHONPATH=/root/keep/peers python3 -c "import speculators, specforge"
    # 2 [".gpu/part-a", ".whl"]
    bash benchmarks/gpu_weights.sh a
    # 3 [".gpu/part-b", ".gpu/smollm2"]; timeout_s 570
    bash benchmarks/gpu_weights.sh b /root/smol && PYTHONPATH=/root/keep/peers:. PYTHONUNBUFFERED=1 \
        python3 benchmarks/peers_gpu.py --target /root/smol --out $OUT --sha SHA

Stages, in ``--work`` (kept on a warm machine, so a second call reuses what the first finished), each recorded in
``OUT/peers_gpu.json`` as it ends (a run stopped at the device's limit keeps what it measured):

1. ``rows``: the corpus as the peers read it (``engines/peers/prepare.py``);
2. the three fits on the corpus's first ``--tokens`` generated tokens, ``--epochs`` passes, with the recipe of the CPU
   comparison (``peers_smollm2_250k``: 4,096-token draft vocabulary, TTT 3, lr 2e-3, AdamW, batches of 8 rows or
   4,096 packed tokens): draftsmith's ``smollm2/eagle3_31`` by Lightning as ``gpu_check.py --corpus`` fits it
   (online, bf16-mixed; ``--fit-minutes`` at most), speculators' and SpecForge's by their own trainers
   (``engines/peers/*_train.py --device cuda``: their GPU kernels, only the target's capture replaced);
3. ``import``: each peer's checkpoint with ``draftsmith import``, as a user brings it;
4. ``score``: ``benchmarks/peers.py --device cuda`` on ``--sets``, ``--prompts`` x ``--new-tokens``, greedy K = 4:
   τ, first-token acceptance, Δτ with its interval, speedup over plain decoding (bf16 batch-invariant) and over the
   fast kernels, exactness; its report ``OUT/peers_smollm2_gpu.{json,md}`` holds each trainer's wall-clock and
   tokens/s beside them. The fits are compared at equal data (the same rows and passes), each with its wall-clock;
   where draftsmith's fit took longer than the fastest peer's, draftsmith is fitted again for that peer's seconds
   at most (``draftsmith.equal-time``: τ at equal wall-clock); where it did not, the peers had more time than it.

Sized for 8 minutes on an H100 at the defaults (250k tokens, 2 passes; 8 chat-heldout prompts x 128 tokens): each
fit 1-2 minutes (draftsmith's online fit ran at 6.7k tokens/s on an H200, 2026-11-29, before its cuDNN fix; the peers
at GPU speed), the block ~3 minutes (plain decoding ran at 23-25 tokens/s there: the verifier's step is Python-bound
at 135M parameters). ``--device cpu`` runs the same stages on a CPU (the mechanics: each peer in its venv,
``--speculators-python`` / ``--specforge-python``), e.g. ``--tokens 2000 --epochs 1 --val-rows 2 --prompts 1
--new-tokens 8`` (9 minutes on the AVX2 EPYC; SpecForge's batch of 8 rows needs 8 rows, ~1,600 tokens, at least).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from gpu_fit import fit_on_corpus
from peers import fit_record

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
RECIPE = {  # draftsmith's recipe where each peer's flags reach (docs/results.md, the peers' current result)
    "speculators": ["--lr", "2e-3", "--ttt-step-loss-decay", "0.8", "--draft-vocab-size", "4096"]
    + ["--optimizer", "adamw", "--total-seq-len", "4096"],
    "specforge": ["--draft-vocab", "4096", "--ttt-length", "3", "--lr", "2e-3", "--batch-size", "8"],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, required=True, help="SmolLM2's dir (gpu_weights.sh b writes it there)")
    p.add_argument("--out", type=Path, required=True, help="the report and the stages' record ($OUT)")
    p.add_argument("--work", type=Path, default=Path("/root/keep/peers_gpu"), help="the runs (kept while warm)")
    p.add_argument("--sha", default=None, help="the git SHA measured (the device's copy has no .git)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tokens", type=int, default=250_000, help="generated tokens of the corpus's first rows")
    p.add_argument("--epochs", type=int, default=2, help="passes over them")
    p.add_argument("--fit-minutes", type=float, default=2.5, help="draftsmith's fit stops there at the latest")
    p.add_argument("--val-rows", type=int, default=None, help="speculators' validation rows (default: all 64)")
    p.add_argument("--trainers", nargs="+", default=["draftsmith", "speculators", "specforge"])
    p.add_argument("--sets", nargs="+", default=["chat-heldout"], choices=["mt-bench", "chat-heldout"])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--speculators-python", default=sys.executable, help="speculators' Python (here: its venv)")
    p.add_argument("--specforge-python", default=sys.executable, help="SpecForge's Python (here: its venv)")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU here (--device cpu runs the mechanics)")
    if not (a.target / "config.json").is_file():
        p.error(f"--target {a.target}: no config.json there (a SmolLM2 dir: benchmarks/gpu_weights.sh b DIR)")
    for name in ("speculators_python", "specforge_python"):  # a path given from here: the stages run from the root
        if "/" in getattr(a, name):
            setattr(a, name, str(Path(getattr(a, name)).absolute()))
    for name in a.trainers:
        if name not in ("draftsmith", "speculators", "specforge"):
            p.error(f"--trainers {name}: not draftsmith, speculators or specforge")
        python = {"speculators": a.speculators_python, "specforge": a.specforge_python}.get(name)
        if python and subprocess.run([python, "-c", f"import {name}"], capture_output=True).returncode:
            p.error(f"{name}: not importable by {python} (install .whl-peers: see the top of this file)")
    return a


def run(cmd: list[str], log: Path, what: str) -> None:
    """``cmd`` (``what``) from the repository's root, its output in ``log``; its last lines in one error where it
    fails."""
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise SystemExit(f"peers_gpu: {what} failed ({rc}); {log}:\n{tail}")


def fit_draftsmith(a: argparse.Namespace, dtype: str, name: str = "draftsmith", minutes: float | None = None) -> Path:
    """The recipe's fit as ``gpu_check.py --corpus`` makes it (``minutes`` at most: ``--fit-minutes``);
    ``WORK/NAME/fit.json`` beside the drafter."""
    out = a.work / name
    if (out / "fit.json").is_file():
        return out / "drafter"
    args = argparse.Namespace(
        corpus=DATA / "smollm2-1m.tar.xz", val_corpus=DATA / "smollm2-val.tar.xz", tokens=a.tokens,
        epochs=float(a.epochs), recipe="smollm2/eagle3_31", fit_batch=8, max_length=640,
        fit_minutes=minutes or a.fit_minutes,
        precision="bf16-mixed" if a.device == "cuda" else "32-true", log_every=10,
    )  # fmt: skip
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    record = fit_on_corpus(f"{a.target}:{dtype}", a.device, args, out / "drafter")
    record["passes"] = round(a.epochs * record["steps_done"] / record["steps"], 3)  # a fit stopped early: fewer
    if a.device == "cuda":
        record["peak_gpu_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        torch.cuda.empty_cache()
    (out / "fit.json").write_text(json.dumps({"trainer": "draftsmith", "device": a.device} | record, indent=1))
    return out / "drafter"


def equal_time(drafters: dict[str, Path]) -> float | None:
    """The fastest peer's fit seconds (its record's, the report's "fit s") where draftsmith's fit took longer: the
    cap of draftsmith's equal-time fit. None where draftsmith's was the fastest (the peers had more time) or no peer
    ran."""
    seconds = {name: (fit_record(path) or {}).get("seconds") for name, path in drafters.items()}
    own = seconds.pop("draftsmith", None)
    peers = [s for s in seconds.values() if s]
    return min(peers) if own and peers and own > min(peers) else None


def fit_peer(a: argparse.Namespace, name: str, rows: dict, dtype: str) -> Path:
    """A peer's fit by its own trainer (``engines/peers/NAME_train.py``); its checkpoint brought in by ``draftsmith
    import`` to ``WORK/NAME/imported``."""
    out = a.work / name
    imported = out / "imported"
    if (imported / "config.json").is_file():
        return imported
    common = ["--tokens", str(a.tokens), "--epochs", str(a.epochs), "--out", str(out), "--device", a.device]
    if name == "speculators":
        cmd = [a.speculators_python, "engines/peers/speculators_train.py", *common, "--target", str(a.target)]
        cmd += ["--draftsmith-python", sys.executable, *RECIPE[name]]
        cmd += [] if a.val_rows is None else ["--val-rows", str(a.val_rows)]
        cmd += [] if a.device == "cuda" else ["--target-dtype", "float32"]  # a CPU without bf16 emulates it slowly
    else:
        cmd = [a.specforge_python, "engines/peers/specforge_train.py", *common, "--target", str(a.target)]
        cmd += ["--data", rows["train"], *RECIPE[name]]
    out.mkdir(parents=True, exist_ok=True)
    run(cmd, a.work / f"{name}.log", f"{name}'s trainer")
    fit = json.loads((out / "fit.json").read_text())
    src = fit["checkpoint"] if name == "speculators" else fit["draft"]
    cmd = [sys.executable, "-m", "draftsmith.cli", "import", "--src", src, "--target", f"{a.target}:{dtype}"]
    cmd += ["--out", str(imported), "--overwrite"]
    run(cmd, a.work / f"{name}.log", f"draftsmith import of {name}'s checkpoint")
    return imported


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    a.work, a.out, a.target = a.work.resolve(), a.out.resolve(), a.target.resolve()
    settings = {"target": str(a.target), "device": a.device, "tokens": a.tokens, "epochs": a.epochs}
    held = a.work / "settings.json"  # the fits in --work are reused: only by a run of the same settings
    if held.is_file() and json.loads(held.read_text()) != settings:
        raise SystemExit(f"peers_gpu: --work {a.work} holds the fits of {held.read_text()}: give another --work")
    a.work.mkdir(parents=True, exist_ok=True)
    held.write_text(json.dumps(settings))
    a.out.mkdir(parents=True, exist_ok=True)
    dtype = "bfloat16" if a.device == "cuda" else "float32"
    record = {"args": {k: str(v) for k, v in vars(a).items()}, "seconds": {}}
    started = time.perf_counter()

    def done(stage: str, t0: float) -> None:
        record["seconds"][stage] = round(time.perf_counter() - t0, 1)
        record["seconds"]["total"] = round(time.perf_counter() - started, 1)
        (a.out / "peers_gpu.json").write_text(json.dumps(record, indent=1))
        print(f"peers_gpu: {stage} in {record['seconds'][stage]} s", flush=True)

    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "engines/peers/prepare.py", "--target", str(a.target)], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode:
        raise SystemExit(f"peers_gpu: prepare.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = json.loads(proc.stdout.splitlines()[-1])
    done("rows", t0)
    drafters = {}
    for name in a.trainers:
        t0 = time.perf_counter()
        if name == "draftsmith":
            drafters[name] = fit_draftsmith(a, dtype)
        else:
            drafters[f"{name}.ds-recipe"] = fit_peer(a, name, rows, dtype)
        done(name, t0)
    if (cap := equal_time(drafters)) is not None:  # τ at equal wall-clock: draftsmith for the fastest peer's time
        t0 = time.perf_counter()
        drafters["draftsmith.equal-time"] = fit_draftsmith(a, dtype, "draftsmith-equal-time", cap / 60)
        done("draftsmith.equal-time", t0)
    t0 = time.perf_counter()
    cmd = [sys.executable, "benchmarks/peers.py", "--target", str(a.target), "--device", a.device]
    cmd += [arg for name, path in drafters.items() for arg in ("--drafter", f"{name}={path}")]
    cmd += ["--base", next(iter(drafters)), "--num-prompts", str(a.prompts), "--max-new-tokens", str(a.new_tokens)]
    cmd += ["--modes", "greedy", "--sets", *a.sets, "--out", str(a.work / "blocks"), "--results", "peers_smollm2_gpu"]
    cmd += ["--results-dir", str(a.out)] + (["--sha", a.sha] if a.sha else [])
    run(cmd, a.work / "score.log", "peers.py")
    done("score", t0)
    print((a.out / "peers_smollm2_gpu.md").read_text())


if __name__ == "__main__":
    main()
