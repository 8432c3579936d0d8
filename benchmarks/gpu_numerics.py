"""Row invariance on a CUDA GPU: does a verification row equal the decode step that computes it alone?

    python benchmarks/gpu_numerics.py [--sha GIT_SHA]

Greedy speculative decoding equals plain greedy decoding only if the target's logits for a token do not depend on
how many tokens share its forward. On the CPU, draftsmith's batch-invariant mode (``core.numerics``:
``invariant_attention``, a one-row Linear computed as two) makes bf16 rows invariant
(``benchmarks/results/bf16_target.md``).
This measures, on the GPU it runs on, the largest |row computed alone - row computed among m| for:

- one Linear of SmolLM2's shapes (576 -> 1,536, 1,536 -> 576, the 576 -> 49,152 LM head), float32 and bfloat16, as
  is ("raw"), with the two-row trick ("two_rows") and with every call of fewer than 16 rows padded to 16 ("pad16");
- a two-layer model of SmolLM2's widths (``tests/test_bf16.py``'s ``wide_bf16_llama``): the steps of 8 tokens after
  7 and 140 cached ones against their verification forward, for the fast kernels (SDPA), draftsmith's
  batch-invariant mode, and that mode with Linears padded to 16 rows and eager attention's queries padded to 16.

and what the batch-invariant mode costs there: the one-token decode step and r(m) (a forward of m new tokens over a
step) of a bf16 model of SmolLM2's shapes (30 layers, 49,152-token vocabulary, random weights: the speed does not
depend on them), with the fast kernels and batch-invariant, interleaved.

TF32 stays off (PyTorch's default for float32 matmuls). Writes ``benchmarks/results/gpu_numerics.{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from types import MethodType

import torch
from bf16_target import ratios
from common import machine, write

from draftsmith.core.numerics import make_batch_invariant
from draftsmith.core.target import Target
from draftsmith.eval.calibration import verify_ratios

TESTS = Path(__file__).resolve().parents[1] / "tests"

PAD = 16
ROWS = (2, 3, 5, 8, 9, 16, 17)
COST_COUNTS = [2, 5, 9, 17]
SHAPES = {"576->1536": (576, 1536), "1536->576": (1536, 576), "lm_head 576->49152": (576, 49152)}


def padded_linear(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``self(x)`` with fewer than ``PAD`` rows computed as ``PAD`` (zero rows added, then dropped)."""
    rows = x.numel() // x.shape[-1]
    if rows >= PAD:
        return torch.nn.functional.linear(x, self.weight, self.bias)
    flat = x.reshape(rows, x.shape[-1])
    out = torch.nn.functional.linear(
        torch.cat([flat, flat.new_zeros(PAD - rows, flat.shape[1])]), self.weight, self.bias
    )
    return out[:rows].reshape(*x.shape[:-1], out.shape[-1])


def padded_eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """HF's eager attention with fewer than ``PAD`` queries computed as ``PAD``."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    q = query.shape[2]
    if q < PAD:
        query = torch.cat([query, query.new_zeros(*query.shape[:2], PAD - q, query.shape[3])], dim=2)
        if attention_mask is not None:
            pad = attention_mask.new_zeros(*attention_mask.shape[:2], PAD - q, attention_mask.shape[3])
            attention_mask = torch.cat([attention_mask, pad], dim=2)
    out, weights = eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    return out[:, :q], weights[:, :, :q]


def linear_rows(dtype: torch.dtype) -> dict:
    """Per shape and scheme: the largest |alone - among m| over m in ROWS."""
    out = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, (n_in, n_out) in SHAPES.items():
        layer = torch.nn.Linear(n_in, n_out, bias=False, device="cuda", dtype=dtype)
        x = (torch.randn(max(ROWS), n_in, device="cuda", generator=g) * 0.5).to(dtype)
        row = {}
        two_rows, pad16 = copy.deepcopy(layer), copy.deepcopy(layer)
        make_batch_invariant(two_rows)
        pad16.forward = MethodType(padded_linear, pad16)
        for scheme, call in (("raw", layer), ("two_rows", two_rows), ("pad16", pad16)):
            with torch.no_grad():
                alone = torch.cat([call(x[i : i + 1]) for i in range(max(ROWS))])
                row[scheme] = max(float((call(x[:m]) - alone[:m]).abs().max()) for m in ROWS)
        out[name] = row
    return out


def model_rows() -> dict:
    """Per scheme: the largest |step - verification row| of 8 tokens after 7 and after 140 cached ones."""
    sys.path.insert(0, str(TESTS))
    from test_bf16 import WIDE_V, step_and_block_logits, wide_bf16_llama
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register("padded_eager", padded_eager)
    AttentionMaskInterface.register("padded_eager", eager_mask)  # eager's 4D additive causal mask
    ids = torch.randint(0, WIDE_V, (1, 160), generator=torch.Generator().manual_seed(0))
    out = {}
    for scheme in ("fast (sdpa)", "batch-invariant (draftsmith)", "pad16 linears + pad16 eager"):
        model = wide_bf16_llama().to("cuda")
        target = Target(model, name="wide-bf16-cuda", batch_invariant=scheme != "fast (sdpa)")
        if scheme.startswith("pad16"):
            model.set_attn_implementation("padded_eager")
            for module in model.modules():
                if isinstance(module, torch.nn.Linear):
                    module.forward = MethodType(padded_linear, module)
        diffs = []
        for past in (7, 140):
            steps, block = step_and_block_logits(target, ids, past, 8)
            diffs.append(float((steps - block).abs().max()))
        out[scheme] = {"max_abs_diff": max(diffs), "bit_exact": max(diffs) == 0.0}
    return out


def smollm2_shaped() -> torch.nn.Module:
    """A bf16 model of SmolLM2-135M's shapes (30 layers, 49,152-token vocabulary) with random weights: its speed does
    not depend on them."""
    sys.path.insert(0, str(TESTS))
    from test_bf16 import wide_bf16_llama
    from transformers import LlamaForCausalLM

    config = wide_bf16_llama().config
    config.num_hidden_layers, config.vocab_size = 30, 49_152  # SmolLM2-135M's depth and vocabulary
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def cost_prompt(vocab_size: int) -> list[int]:
    """The 200 seeded random tokens the costs are measured after."""
    return torch.randint(0, vocab_size, (200,), generator=torch.Generator().manual_seed(1)).tolist()


def measure_costs(targets: dict[str, Target], prompt: list[int], rounds: int) -> dict:
    """Per target: the median one-token step (ms) and r(m) over ``rounds`` interleaved runs after ``prompt``, each
    target warmed up first."""
    for t in targets.values():
        verify_ratios(t, prompt, COST_COUNTS, 2)  # warm-up: kernels chosen, memory allocated
    return ratios(targets, prompt, rounds, COST_COUNTS, repeats=7)


def costs_table(costs: dict) -> list[str]:
    """``measure_costs``' result as Markdown table lines."""
    counts = [k for k in next(iter(costs.values())) if k != "step_ms"]
    lines = ["| numerics | step ms | " + " | ".join(counts) + " |", "|---|---:|" + "---:|" * len(counts)]
    for name, row in costs.items():
        lines.append(f"| {name} | {row['step_ms']:.2f} | " + " | ".join(f"{row[k]:.2f}" for k in counts) + " |")
    return lines


def costs(rounds: int = 5) -> dict:
    """Fast kernels against batch-invariant on the GPU: ``measure_costs`` of a SmolLM2-shaped model."""
    model = smollm2_shaped()
    targets = {
        "fast (sdpa)": Target(copy.deepcopy(model).to("cuda"), name="smollm2-shaped", batch_invariant=False),
        "batch-invariant (draftsmith)": Target(model.to("cuda"), name="smollm2-shaped", batch_invariant=True),
    }
    return measure_costs(targets, cost_prompt(model.config.vocab_size), rounds)


def markdown(data: dict) -> str:
    m = data["machine"]
    lines = [
        "# Row invariance on a GPU",
        "",
        f"`{m['command']}` · git {m['git']} · {m['date']} · {data['gpu']} · torch {m['torch']} · "
        f"TF32 matmul {data['tf32']}",
        "",
        "Largest |row computed alone − the same row among m| (m in 2, 3, 5, 8, 9, 16, 17); 0 = bit for bit.",
        "",
        "| Linear | dtype | raw | two rows | padded to 16 |",
        "|---|---|---:|---:|---:|",
    ]
    for dtype, shapes in data["linear"].items():
        for name, row in shapes.items():
            lines.append(f"| {name} | {dtype} | {row['raw']:.3g} | {row['two_rows']:.3g} | {row['pad16']:.3g} |")
    lines += ["", "Two-layer bf16 model of SmolLM2's widths, 8 one-token steps against their verification forward:", ""]
    lines += ["| numerics | max abs logit difference | bit for bit |", "|---|---:|---|"]
    for scheme, row in data["model"].items():
        lines.append(f"| {scheme} | {row['max_abs_diff']:.3g} | {'yes' if row['bit_exact'] else 'no'} |")
    if data.get("costs"):
        lines += [
            "",
            "What it costs: a bf16 model of SmolLM2's shapes (30 layers, random weights), 200 cached tokens, ",
        ]
        lines[-1] += "medians of 5 interleaved runs; r(m) = forward of m new tokens / one-token step:"
        lines += ["", *costs_table(data["costs"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sha", default=None, help="the git SHA to record (a copied tree has no .git)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_numerics: needs a CUDA GPU")
    record = machine()
    if args.sha:
        record["git"] = args.sha
    data = {
        "machine": record,
        "gpu": torch.cuda.get_device_name(),
        "tf32": torch.backends.cuda.matmul.allow_tf32,
        "linear": {str(d).removeprefix("torch."): linear_rows(d) for d in (torch.float32, torch.bfloat16)},
        "model": model_rows(),
        "costs": costs(),
    }
    write("gpu_numerics", data, markdown(data))


if __name__ == "__main__":
    main()
