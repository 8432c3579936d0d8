"""Batch-invariant numerics: a target whose every row comes out bit for bit the same whether it is computed alone
(a plain decode step) or beside others (the verification forward of a draft).

In float32 the kernels' results hardly depend on the number of rows. In bfloat16 they do, by a rounding step: on
an AVX-512-BF16 CPU (torch 2.13, oneDNN), a Linear of 1,536 inputs computes one row on another path than two or
more (two to 32 rows agree bit for bit), and ``scaled_dot_product_attention`` splits keys differently for one
query than for several. Each difference is one bf16 rounding, but it grows through 30 layers into logit changes
of up to one nat, and SmolLM2's 49k-token vocabulary has enough near-ties that greedy speculative decoding then
leaves plain greedy decoding on most prompts (``benchmarks/results/bf16_target.md``).

``make_batch_invariant`` removes both sources: every one-row Linear call runs as two rows (the row twice; the
first result is kept), and attention runs as HF's eager implementation, matmuls and a float32 softmax, whose
rows do not depend on the query count. Plain decoding pays for it (measured on SmolLM2 bf16: a decode step
25.5 ms against 24.0 ms), verification forwards do not; the report of ``benchmarks/bf16_target.py`` gives
both. Serving engines make the same trade: vLLM and SGLang are not batch-invariant in bf16 by default and offer a
slower batch-invariant mode.
"""

from __future__ import annotations

from types import MethodType

import torch


def _two_row_linear(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``self(x)``, computing a single row as two (the many-row kernel's numerics)."""
    if x.numel() != x.shape[-1]:
        return torch.nn.functional.linear(x, self.weight, self.bias)
    row = x.reshape(1, -1)
    out = torch.nn.functional.linear(torch.cat([row, row]), self.weight, self.bias)[:1]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def make_batch_invariant(model: torch.nn.Module) -> None:
    """Make ``model``'s rows independent of how many rows share a forward (in place): eager attention and
    two-row Linear calls. Weights are untouched; only how its Linears and attention compute changes."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.forward = MethodType(_two_row_linear, module)


def is_batch_invariant(model: torch.nn.Module) -> bool:
    """Whether ``make_batch_invariant`` was applied to ``model``."""
    return any(
        isinstance(m, torch.nn.Linear) and getattr(m.forward, "__func__", None) is _two_row_linear
        for m in model.modules()
    )
