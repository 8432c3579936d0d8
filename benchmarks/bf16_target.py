"""SmolLM2-135M-Instruct in bfloat16 against float32: decode speed, verification cost r(m), greedy exactness.

    python benchmarks/bf16_target.py [--out runs/bf16_target] [--num-prompts 32] [--max-new-tokens 128]
        [--drafters [NAME=]SPEC ...]

Three targets from the same weights, decoded side by side, interleaved prompt by prompt (one run, so ratios survive
load): float32; bfloat16 with batch-invariant numerics (draftsmith's default for bf16: eager attention and one-row
Linears computed as two, so a verification row equals the plain decode step bit for bit); bfloat16 with the fastest
kernels (SDPA, as HF and serving engines run it). On each: plain decoding and the n-gram drafter (prompt lookup) at
K = 4, plus K = 2 and ``--k auto`` on the batch-invariant one, ``--drafters`` (trained ones) at K = 4 on it too, and
HF ``generate`` on the fast bf16 model. Every decoder's speed is also given over the fastest plain decoding of its
block, whichever target that is (float32 on a CPU whose bf16 decode step is slower). Greedy rows report the prompts
whose output equals plain greedy decoding of the same target, and for each divergence the target's logit gap there
(a near-tie, or a bug). Prompt sets: the first N chat-heldout prompts and N MT-bench first turns (N / 8 per
category). r(m) = t(forward of m new tokens) / t(decode step) on a 200-token cached context, for each of the three
targets, interleaved.

Each prompt set is one saved block (``--out``/<set>.json): an interrupted run resumes at the next set.
Writes ``benchmarks/results/bf16_target.{json,md}`` (``--results NAME``: ``NAME.{json,md}``, e.g. for another machine).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from common import Load, machine, measured_on, mtbench_subset, write
from tqdm.auto import tqdm

from draftsmith.core.files import write_whole
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.prompts import encode, load_prompts
from draftsmith.decode.metrics import drafter_metrics, plain_metrics
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.eval.calibration import choose_shapes, verify_ratios
from draftsmith.eval.score import divergences
from draftsmith.families.specs import Named, Trained, build_drafter, parse_spec
from draftsmith.targets import resolve

COUNTS = [2, 3, 5, 9, 17]


def load(target_dir: Path) -> dict[str, Target]:
    return {
        "float32": Target.from_pretrained(target_dir, dtype="float32"),
        "bf16 batch-invariant": Target.from_pretrained(target_dir, dtype="bfloat16", batch_invariant=True),
        "bf16 fast kernels": Target.from_pretrained(target_dir, dtype="bfloat16", batch_invariant=False),
    }


def ratios(
    targets: dict[str, Target], prompt: list[int], rounds: int = 5, counts: list[int] = COUNTS, repeats: int = 5
) -> dict:
    """r(m) per target on a 200-token context, the targets interleaved ``rounds`` times (each run the median of
    ``repeats`` forwards); the median over rounds of each run's step and r."""
    context = (prompt * (200 // len(prompt) + 1))[:200]
    runs = {name: [] for name in targets}
    for _ in range(rounds):
        for name, t in targets.items():
            runs[name].append(verify_ratios(t, context, counts, repeats))
    out = {}
    for name, measured in runs.items():
        step = sorted(s for _, s in measured)[len(measured) // 2]
        r = {m: sorted(x[m] for x, _ in measured)[len(measured) // 2] for m in counts}
        out[name] = {"step_ms": round(1e3 * step, 2)} | {f"r({m})": round(v, 3) for m, v in r.items()}
    return out


def hf_generate(t: Target, prompt: list[int], n: int) -> tuple[list[int], float]:
    start = time.perf_counter()
    out = t.model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist(), time.perf_counter() - start


def run_set(
    targets: dict[str, Target], prompts: list[list[int]], n: int, categories: list | None, trained: list[Named] = ()
) -> dict:
    greedy = Sampling()
    inv, fast, fp32 = targets["bf16 batch-invariant"], targets["bf16 fast kernels"], targets["float32"]
    ngram = parse_spec("ngram").spec
    rows = {  # label: (target, K, the target's name)
        "ngram, float32": (fp32, 4, "float32"),
        "ngram, bf16 batch-invariant": (inv, 4, "bf16 batch-invariant"),
        "ngram K=2, bf16 batch-invariant": (inv, 2, "bf16 batch-invariant"),
        "ngram, bf16 fast kernels": (fast, 4, "bf16 fast kernels"),
    }
    drafters = {name: build_drafter(ngram, t) for name, (t, _, _) in rows.items()}
    for named in trained:  # trained drafters, on the target draftsmith runs bf16 as
        label = f"{named.name}, bf16 batch-invariant"
        rows[label] = (inv, 4, "bf16 batch-invariant")
        drafters[label] = build_drafter(named.spec, inv)
    auto = build_drafter(ngram, inv)
    shape = choose_shapes({"auto": inv}, {"auto": auto}, prompts[0], greedy, 0)["auto"]
    rows["ngram --k auto, bf16 batch-invariant"] = (inv, shape.k, "bf16 batch-invariant")
    drafters["ngram --k auto, bf16 batch-invariant"] = auto
    decoders = {name: SpeculativeDecoder(t, drafters[name], k, greedy) for name, (t, k, _) in rows.items()}
    for t in targets.values():  # warm-up
        plain_decode(t, prompts[0], 8, greedy)
    for dec in decoders.values():
        dec.generate(prompts[0], 8)
    hf_generate(fast, prompts[0], 8)
    plain = {name: [] for name in targets}
    spec = {name: [] for name in rows}
    hf = []
    machine_load = Load()
    for prompt in tqdm(prompts, desc="prompts", unit="prompt"):
        for name, t in targets.items():
            plain[name].append(plain_decode(t, prompt, n, greedy))
        for name, dec in decoders.items():
            spec[name].append(dec.generate(prompt, n))
        hf.append(hf_generate(fast, prompt, n))
    block = {"load": machine_load.span(), "plain": {}, "drafters": [], "hf": {}}
    for name in targets:
        block["plain"][name] = plain_metrics(plain[name]).to_dict()
    for name, (t, k, tname) in rows.items():
        m = drafter_metrics(name, k, spec[name], plain[tname], True).to_dict()
        m["target"] = tname
        if m["greedy_exact"] < len(prompts):
            m["divergences"] = divergences(t, prompts, spec[name], plain[tname])
        if "auto" in name:
            m["auto_k"] = shape.to_dict()
        block["drafters"].append(m)
    for name in targets:
        if name == "float32":
            continue
        same = sum(a.tokens == b.tokens for a, b in zip(plain[name], plain["float32"], strict=True))
        block["plain"][name]["same_as_float32"] = same
    tokens = sum(len(x) for x, _ in hf)
    seconds = sum(s for _, s in hf)
    block["hf"] = {
        "tokens_per_s": tokens / seconds,
        "same_as_fast_plain": sum(x == p.tokens for (x, _), p in zip(hf, plain["bf16 fast kernels"], strict=True)),
    }
    block["prompts"] = len(prompts)
    block["categories"] = categories
    return block


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        "# SmolLM2-135M-Instruct in bfloat16 and float32",
        "",
        f"{measured_on(m)}. Greedy, {result['max_new_tokens']} new tokens per prompt; every "
        "decoder of a block interleaved prompt by prompt in one run.",
        "",
        "## Verification cost r(m) = t(forward of m new tokens) / t(decode step), 200-token context",
        "",
        "| target | decode step | " + " | ".join(f"r({c})" for c in COUNTS) + " |",
        "|---|---|" + "---|" * len(COUNTS),
    ]
    for name, r in result["r"].items():
        lines.append(f"| {name} | {r['step_ms']} ms | " + " | ".join(f"{r[f'r({c})']:.2f}" for c in COUNTS) + " |")
    for title, b in result["sets"].items():
        fastest = max(p["tokens_per_s"] for p in b["plain"].values())
        lines += [
            "",
            f"## {title}: {b['prompts']} prompts (load before / after {b['load'][0]} / {b['load'][1]})",
            "",
            "| decoder | target | K | τ | tokens/s | × own plain | × fastest plain | greedy exact | divergences "
            "(position: logit gap) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, p in b["plain"].items():
            same = f"{p['same_as_float32']}/{b['prompts']} = float32" if "same_as_float32" in p else "–"
            lines.append(
                f"| plain decoding | {name} | – | 1.00 | {p['tokens_per_s']:.1f} | 1.00× | "
                f"{p['tokens_per_s'] / fastest:.2f}× | {same} | – |"
            )
        lines.append(
            f"| HF generate | bf16 fast kernels | – | 1.00 | {b['hf']['tokens_per_s']:.1f} | – | "
            f"{b['hf']['tokens_per_s'] / fastest:.2f}× | {b['hf']['same_as_fast_plain']}/{b['prompts']} = plain | – |"
        )
        for d in b["drafters"]:
            div = ", ".join(f"{x['position']}: {x['gap']}" for x in d.get("divergences", [])) or "–"
            k = f"auto → {d['k']}" if d.get("auto_k") else d["k"]
            lines.append(
                f"| {d['name']} | {d['target']} | {k} | {d['tau']:.2f} | {d['tokens_per_s']:.1f} | "
                f"{d['speedup']:.2f}× | {d['tokens_per_s'] / fastest:.2f}× | {d['greedy_exact']}/{b['prompts']} | "
                f"{div} |"
            )
    lines += [
        "",
        "× own plain: over plain decoding of the same target (same dtype and numerics). × fastest plain: over the "
        "fastest plain decoding of the block, whichever dtype and kernels gave it, the honest baseline for a speed "
        "claim on this machine. "
        "Divergences: the first differing position of each prompt whose output left plain greedy decoding, and the "
        "target's logit gap there between the plain token and the speculative one.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bf16_target"))
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--sets", nargs="+", default=["chat-heldout", "mt-bench"], choices=["chat-heldout", "mt-bench"])
    parser.add_argument(
        "--results",
        default="bf16_target",
        help="the report's name in benchmarks/results (another machine: another name)",
    )
    parser.add_argument(
        "--drafters",
        nargs="*",
        default=[],
        metavar="[NAME=]SPEC",
        help="trained drafters to add, K = 4 on the bf16 batch-invariant target (e.g. "
        "eagle3-1M=runs/scaling300/drafters/eagle3-1M); give them their own --out",
    )
    args = parser.parse_args()
    trained = [parse_spec(text) for text in args.drafters]
    for named in trained:
        if not isinstance(named.spec, Trained):
            parser.error(f"--drafters {named.name}: not a trained drafter (a .ckpt or an exported drafter's dir)")
    targets = load(resolve("smollm2"))
    tok = targets["float32"].tokenizer
    args.out.mkdir(parents=True, exist_ok=True)
    r_path = args.out / "r.json"
    if not r_path.is_file():
        chat = encode(load_prompts("builtin:chat-heldout", limit=1)[0], tok)
        write_whole(r_path, json.dumps(ratios(targets, chat)))
    result = {
        "machine": machine(),
        "max_new_tokens": args.max_new_tokens,
        "r": json.loads(r_path.read_text()),
        "sets": {},
    }
    for name in args.sets:
        path = args.out / f"{name}.json"
        if not path.is_file():
            loaded = (
                mtbench_subset(args.num_prompts)
                if name == "mt-bench"
                else load_prompts("builtin:chat-heldout", limit=args.num_prompts)
            )
            ids = [encode(p, tok) for p in loaded]
            block = run_set(targets, ids, args.max_new_tokens, [p.category for p in loaded], trained)
            write_whole(path, json.dumps(block, indent=2))
        result["sets"][name] = json.loads(path.read_text())
    write(args.results, result, markdown(result))


if __name__ == "__main__":
    main()
