"""Where a decode step's time goes, part by part: SmolLM2 in bf16 batch-invariant, bf16 fastest kernels, float32.

    python benchmarks/step_profile.py [--steps 48] [--context 200] [--rounds 5]

One-token decode steps on a ``--context``-token prompt (chat-heldout's first prompt repeated), each mode's model
timed with forward hooks on its modules (CPU work is synchronous, so a module's wall time is its cost): the
attention projections (q, k, v, o), the attention core (the attention module less its projections: rotary
embedding, the cache update, the scores, softmax and weighted sum; ``invariant_attention`` in batch-invariant
mode), the MLP's Linears (gate, up, down) and the rest of the MLP (activation and product), the RMSNorms, the LM
head, and the rest of the step (embedding, masks, HF's Python between modules). The hooks cost time of their own,
so the step is also timed with one hook on the whole model only (``bare``); the modes are interleaved ``--rounds``
times (medians). The prefill is not counted. Writes ``benchmarks/results/step_profile.{json,md}`` (``--results``).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from common import Load, machine, measured_on, write

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.prompts import encode, load_prompts
from draftsmith.decode.verifier import plain_decode
from draftsmith.targets import resolve

PARTS = ("attention projections", "attention core", "MLP Linears", "MLP rest", "norms", "LM head", "rest of the step")
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


class PartTimer:
    """Forward hooks that add each module's wall time to its part, during one-token steps only."""

    def __init__(self, model, parts: bool = True) -> None:
        self.totals, self.steps, self.active, self.handles = defaultdict(float), 0, False, []
        self._start: dict[int, float] = {}
        self._hook(model, "step")
        for name, module in model.named_modules() if parts else ():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "self_attn":
                self._hook(module, "attention")
            elif leaf in PROJ:
                self._hook(module, "attention projections")
            elif leaf == "mlp":
                self._hook(module, "mlp")
            elif leaf in MLP:
                self._hook(module, "MLP Linears")
            elif leaf.endswith("norm"):
                self._hook(module, "norms")
            elif leaf == "lm_head":
                self._hook(module, "LM head")

    def _hook(self, module, part: str) -> None:
        def pre(mod, args, kwargs):
            if part == "step":
                ids = kwargs.get("input_ids", args[0] if args else None)
                self.active = ids is not None and ids.shape[-1] == 1
                self.steps += self.active
            if self.active:
                self._start[id(mod)] = time.perf_counter()

        def post(mod, args, kwargs, output):
            if self.active:
                self.totals[part] += time.perf_counter() - self._start.pop(id(mod))

        self.handles += [
            module.register_forward_pre_hook(pre, with_kwargs=True),
            module.register_forward_hook(post, with_kwargs=True),
        ]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def parts_ms(self) -> dict[str, float]:
        t, n = self.totals, max(1, self.steps)
        parts = {
            "attention projections": t["attention projections"],
            "attention core": t["attention"] - t["attention projections"],
            "MLP Linears": t["MLP Linears"],
            "MLP rest": t["mlp"] - t["MLP Linears"],
            "norms": t["norms"],
            "LM head": t["LM head"],
        }
        parts["rest of the step"] = t["step"] - sum(parts.values())
        return {k: round(1e3 * v / n, 3) for k, v in parts.items()}


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=48, help="decode steps per timed run")
    parser.add_argument("--context", type=int, default=200, help="prompt tokens before the timed steps")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--results", default="step_profile")
    args = parser.parse_args()
    path = resolve("smollm2")
    targets = {
        "bf16 batch-invariant": Target.from_pretrained(path, dtype="bfloat16", batch_invariant=True),
        "bf16 fast kernels": Target.from_pretrained(path, dtype="bfloat16", batch_invariant=False),
        "float32": Target.from_pretrained(path, dtype="float32"),
    }
    first = encode(load_prompts("builtin:chat-heldout", limit=1)[0], targets["float32"].tokenizer)
    prompt = (first * (args.context // len(first) + 1))[: args.context]
    greedy = Sampling()
    for t in targets.values():  # warm-up
        plain_decode(t, prompt, 8, greedy)
    bare = {name: [] for name in targets}
    parts = {name: [] for name in targets}
    load = Load()
    for _ in range(args.rounds):
        for name, t in targets.items():
            timer = PartTimer(t.model, parts=False)  # the whole step alone: one hook pair per step, no prefill
            plain_decode(t, prompt, args.steps + 1, greedy)
            timer.remove()
            bare[name].append(timer.totals["step"] / timer.steps)
            timer = PartTimer(t.model)
            plain_decode(t, prompt, args.steps + 1, greedy)
            timer.remove()
            parts[name].append(timer.parts_ms() | {"hooked step": round(1e3 * timer.totals["step"] / timer.steps, 3)})
    modes = {
        name: {"step_ms": round(1e3 * median(bare[name]), 2)}
        | {k: round(median([p[k] for p in parts[name]]), 3) for k in (*PARTS, "hooked step")}
        for name in targets
    }
    result = {
        "machine": machine(),
        "target": "smollm2",
        "context": args.context,
        "steps": args.steps,
        "rounds": args.rounds,
        "load": load.span(),
        "modes": modes,
    }
    write(args.results, result, markdown(result))


def markdown(result: dict) -> str:
    modes = result["modes"]
    names = list(modes)
    inv, fast = modes.get("bf16 batch-invariant"), modes.get("bf16 fast kernels")
    lines = [
        "# Where a decode step's time goes: SmolLM2-135M-Instruct, bf16 batch-invariant, bf16 fast kernels, float32",
        "",
        f"{measured_on(result['machine'])}. One-token decode steps after a {result['context']}-token prompt, "
        f"{result['steps']} steps per run, medians of {result['rounds']} interleaved rounds; load "
        f"{result['load']}. Milliseconds per step, from forward hooks on the model's modules (the hooked step is "
        "slower than the bare one, timed by one hook on the whole model only, by the module hooks' own cost, which "
        "falls on the parts in proportion to their calls).",
        "",
        "| part | " + " | ".join(names) + (" | batch-invariant − fast |" if inv and fast else " |"),
        "|---|" + "---|" * len(names) + ("---|" if inv and fast else ""),
    ]
    for part in (*PARTS, "hooked step", "step_ms"):
        label = {"step_ms": "**step without module hooks**", "hooked step": "step with module hooks"}.get(part, part)
        cells = " | ".join(f"{modes[n][part]:.2f}" for n in names)
        diff = f" | {inv[part] - fast[part]:+.2f}" if inv and fast else ""
        lines.append(f"| {label} | {cells}{diff} |")
    if inv and fast:
        gap = inv["step_ms"] - fast["step_ms"]
        ranked = sorted(PARTS, key=lambda p: inv[p] - fast[p], reverse=True)
        lines += [
            "",
            f"The batch-invariant step costs {inv['step_ms'] / fast['step_ms']:.2f}× the fast-kernel step "
            f"({gap:+.2f} ms); by part (hooked): " + ", ".join(f"{p} {inv[p] - fast[p]:+.2f} ms" for p in ranked) + ".",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
