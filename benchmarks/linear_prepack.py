"""SmolLM2-135M's Linears at decoding widths: float32, bfloat16 as PyTorch runs it, bfloat16 with a pre-packed weight.

    python benchmarks/linear_prepack.py [--results linear_prepack]

Why a bf16 decode step can cost more than a float32 one on a CPU with native bf16 (the AMX Xeon's
``bf16_target_amx``): each Linear of SmolLM2's shapes (per layer q/o 576→576, k/v 576→192, gate/up 576→1536, down
1536→576; the LM head 576→49,152) is timed at M = 1, 2 and 5 rows, interleaved, as ``F.linear`` in float32, as
``F.linear`` in bf16, and in bf16 through oneDNN with the weight reordered once beforehand
(``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``, what inductor's freezing emits). Also checked:
whether the pre-packed output equals ``F.linear``'s bit for bit, and whether its first row is the same computed
alone or with a second row (what draftsmith's batch-invariant bf16 target needs). The per-step sums (30 layers and
the head) say how much of a decode step the Linears are, and what pre-packing would save of it. Median of 5 runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
from common import machine, measured_on, write

LAYERS = 30
SHAPES = {"q, o": (576, 576, 2), "k, v": (576, 192, 2), "gate, up": (576, 1536, 2), "down": (1536, 576, 1)}
HEAD = (576, 49152, 1)
ROWS = [1, 2, 5]
KINDS = ["float32", "bf16", "bf16 pre-packed"]


def timed(fn, n: int) -> float:
    """Median over 5 runs of ``n`` calls, in microseconds a call."""
    for _ in range(10):
        fn()
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(runs)


def packed_linear(w: torch.Tensor, rows: int):
    packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def measure(n_in: int, n_out: int) -> dict:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(n_out, n_in, generator=g) / n_in**0.5
    wb = w.bfloat16()
    calls = 30 if n_out > 10_000 else 300
    out = {}
    for m in ROWS:
        x = torch.randn(m, n_in, generator=g)
        xb = x.bfloat16()
        packed = packed_linear(wb, m)
        out[m] = {
            "float32": timed(lambda x=x: F.linear(x, w), calls),
            "bf16": timed(lambda xb=xb: F.linear(xb, wb), calls),
            "bf16 pre-packed": timed(lambda xb=xb, packed=packed: packed(xb), calls),
            "packed_equals_f_linear": torch.equal(packed(xb), F.linear(xb, wb)),
        }
    one, two = packed_linear(wb, 1), packed_linear(wb, 2)
    xb = torch.randn(2, n_in, generator=g).bfloat16()
    out["packed_row_invariant"] = torch.equal(one(xb[:1])[0], two(xb)[0])
    out["f_linear_row_invariant"] = torch.equal(F.linear(xb[:1], wb)[0], F.linear(xb, wb)[0])
    return out


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        "# SmolLM2-135M's Linears at decoding widths: float32, bf16, bf16 with a pre-packed weight",
        "",
        f"{measured_on(m)}, load {result['load'][0]} → {result['load'][1]}. Microseconds a call, median of 5 runs.",
        "",
        "| Linear (in→out) × per layer | rows | " + " | ".join(KINDS) + " | pre-packed = F.linear |",
        "|---|---|" + "---|" * (len(KINDS) + 1),
    ]
    for name, r in result["shapes"].items():
        for rows in ROWS:
            c = r["rows"][str(rows)]
            lines.append(
                f"| {name} ({r['in']}→{r['out']}) × {r['per_layer']} | {rows} | "
                + " | ".join(f"{c[k]:.0f}" for k in KINDS)
                + f" | {'yes' if c['packed_equals_f_linear'] else 'no'} |"
            )
    lines += [
        "",
        "Row invariance (row 0 computed alone = computed with a second row): "
        + ", ".join(
            f"{name}: F.linear {'yes' if r['f_linear_row_invariant'] else 'no'}, "
            f"pre-packed {'yes' if r['packed_row_invariant'] else 'no'}"
            for name, r in result["shapes"].items()
        )
        + ".",
        "",
        f"A decode step's Linears ({LAYERS} layers and the LM head), milliseconds:",
        "",
        "| rows | " + " | ".join(KINDS) + " |",
        "|---|" + "---|" * len(KINDS),
    ]
    for rows in ROWS:
        lines.append(f"| {rows} | " + " | ".join(f"{result['step_ms'][str(rows)][k]:.1f}" for k in KINDS) + " |")
    return "\n".join([*lines, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="linear_prepack", help="the report's name in benchmarks/results")
    args = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    load = os.getloadavg()[0]
    shapes = {}
    for name, (n_in, n_out, per_layer) in {**SHAPES, "LM head": HEAD}.items():
        r = measure(n_in, n_out)
        shapes[name] = {"in": n_in, "out": n_out, "per_layer": per_layer} | {
            "rows": {str(m): r[m] for m in ROWS},
            "packed_row_invariant": r["packed_row_invariant"],
            "f_linear_row_invariant": r["f_linear_row_invariant"],
        }
        print(name, {m: {k: round(r[m][k]) for k in KINDS} for m in ROWS}, flush=True)
    step = {
        str(m): {
            k: sum(
                s["rows"][str(m)][k] * s["per_layer"] * (1 if name == "LM head" else LAYERS)
                for name, s in shapes.items()
            )
            / 1e3
            for k in KINDS
        }
        for m in ROWS
    }
    result = {"machine": machine(), "load": [round(load, 2), round(os.getloadavg()[0], 2)], "shapes": shapes}
    result["step_ms"] = step
    write(args.results, result, markdown(result))


if __name__ == "__main__":
    main()
