"""draftsmith's decode loop against what transformers already ships, on the same target, prompts, K and budget.

    python benchmarks/baselines.py [--target default|smollm2] [--num-prompts 20] [--max-new-tokens 64] [-k 4]

Pairs, each row greedy and checked token for token against draftsmith's plain decoding:
- draftsmith plain decoding vs HF ``generate``;
- draftsmith + a draft LM vs HF assisted generation with the same draft LM (``assistant_model``), once with K
  constant and no confidence threshold (the same drafting as draftsmith's) and once with HF's defaults (up to 20
  tokens, drafting stops below its assistant confidence threshold, 0.4 to start);
- draftsmith's n-gram drafter vs HF prompt lookup (``prompt_lookup_num_tokens`` = K, same longest n-gram).
Every prompt runs every row in turn (the order rotates from prompt to prompt), ``--repeats`` times, after one
warm-up prompt, so machine load hits every row alike. τ here is tokens per target forward, prefill included, the
one definition both loops share (HF's first assisted round drafts on the prompt's own forward). Target forwards are
counted by a hook on the target model. Writes ``benchmarks/results/baselines[_<target>].{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import machine, write
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target, compiled_forward
from draftsmith.data.prompts import encode, load_prompts
from draftsmith.eval.verifier import SpeculativeDecoder, plain_decode
from draftsmith.families.draft_lm.network import DraftLM
from draftsmith.families.ngram.drafter import NGramDrafter
from draftsmith.targets import resolve

PROMPTS = {"default": "builtin:heldout", "smollm2": "builtin:chat-heldout"}
PAIRS = [
    ("draftsmith plain", "HF generate"),
    ("draftsmith draft LM", "HF assisted, constant K"),
    ("draftsmith draft LM", "HF assisted, HF defaults"),
    ("draftsmith n-gram", "HF prompt lookup"),
]


class ForwardCounter:
    """Counts the forwards of a model (a forward hook), to measure HF's target calls as draftsmith counts its own."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        model.register_forward_hook(self._count)

    def _count(self, module, args, output) -> None:
        self.calls += 1


def default_assistant(target: str) -> Path:
    if target == "default":
        return resolve("default") / "sibling"
    return Path("runs/real_target/export/draft_lm-hf")


def rows(
    target_dir: Path, assistant_dir: Path, k: int, ngram: int, max_new: int, compiled: bool
) -> dict[str, Callable[[list[int]], tuple[list[int], int, float]]]:
    """Each row: prompt -> (generated tokens, target forwards, seconds). Every row has its own model instances
    (assisted generation keeps its schedule and threshold in the assistant's generation config from call to call);
    ``compiled`` rows run the same loops with ``torch.compile``d forwards (``core.target.compiled_forward``), the
    HF ones with the compiled forward set on the model, where ``generate`` calls it."""
    greedy = Sampling(0.0)
    suffix = ", compiled" if compiled else ""
    target = Target.from_pretrained(target_dir)
    draft_lm, lookup = DraftLM.from_pretrained(assistant_dir), NGramDrafter(max_ngram=ngram)
    hf_model = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    constant, defaults = (AutoModelForCausalLM.from_pretrained(assistant_dir).eval() for _ in range(2))
    if compiled:
        target.compile()
        draft_lm.compile()
        for model in (hf_model, constant, defaults):
            model.forward = compiled_forward(model)
    counter = ForwardCounter(hf_model)
    eos = list(target.eos_token_ids)
    base = {"do_sample": False, "max_new_tokens": max_new, "eos_token_id": eos, "pad_token_id": eos[0]}
    hf_kwargs = {
        "HF generate": {},
        "HF assisted, constant K": {
            "assistant_model": constant,
            "num_assistant_tokens": k,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0,
        },
        "HF assisted, HF defaults": {"assistant_model": defaults},
        "HF prompt lookup": {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": ngram},
    }

    def ours(decode_one: Callable) -> Callable:
        def decode(prompt: list[int]) -> tuple[list[int], int, float]:
            r = decode_one(prompt)
            return r.tokens, r.target_calls, r.seconds

        return decode

    def hf(kwargs: dict) -> Callable:
        @torch.no_grad()
        def decode(prompt: list[int]) -> tuple[list[int], int, float]:
            ids = torch.tensor([prompt])
            calls = counter.calls
            start = time.perf_counter()
            out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), **base, **kwargs)
            seconds = time.perf_counter() - start
            return out[0, len(prompt) :].tolist(), counter.calls - calls, seconds

        return decode

    with_lm = SpeculativeDecoder(target, draft_lm, k, greedy)
    with_lookup = SpeculativeDecoder(target, lookup, k, greedy)
    decoders = {
        "draftsmith plain": ours(lambda p: plain_decode(target, p, max_new, greedy)),
        "draftsmith draft LM": ours(lambda p: with_lm.generate(p, max_new)),
        "draftsmith n-gram": ours(lambda p: with_lookup.generate(p, max_new)),
    } | {name: hf(kwargs) for name, kwargs in hf_kwargs.items()}
    return {name + suffix: decode for name, decode in decoders.items()}


def run(decoders: dict, prompts: list[list[int]], repeats: int) -> dict:
    """Interleave every row on every prompt (rotating the order), after a warm-up prompt; aggregate per row."""
    names = list(decoders)
    for decode in decoders.values():  # warm-up
        decode(prompts[0])
    total = {n: {"tokens": 0, "target_calls": 0, "seconds": 0.0, "greedy_exact": 0} for n in names}
    for rep in range(repeats):
        for i, prompt in enumerate(prompts):
            shift = (rep * len(prompts) + i) % len(names)
            outs = {n: decoders[n](prompt) for n in names[shift:] + names[:shift]}
            reference = outs[names[0]][0]  # draftsmith's plain decoding, eager
            for n, (tokens, calls, seconds) in outs.items():
                row = total[n]
                row["tokens"] += len(tokens)
                row["target_calls"] += calls
                row["seconds"] += seconds
                row["greedy_exact"] += int(tokens == reference)
    for row in total.values():
        row["tokens_per_s"] = row["tokens"] / row["seconds"]
        row["tau"] = row["tokens"] / row["target_calls"]
        row["decodes"] = repeats * len(prompts)
    return total


def markdown(data: dict) -> str:
    m, rows_ = data["machine"], data["rows"]
    lines = [
        f"# draftsmith vs HF transformers' decoding: {data['target']}",
        "",
        f"`{m['command']}` at `{m['git']}` on {m['date']} ({m['platform']}, {m['threads']} threads; load average "
        f"before / after {data['load'][0]} / {data['load'][1]}). {data['num_prompts']} prompts from "
        f"`{data['prompts']}` × {data['max_new_tokens']} new tokens, K = {data['k']}, n-gram N = {data['ngram']}, "
        f"greedy, {data['repeats']} passes interleaved per prompt; draft LM `{data['assistant']}`. τ = tokens per "
        "target forward (prefill included); exact = outputs equal to draftsmith's plain decoding.",
        "",
        "| row | tokens/s | τ | target forwards | exact |",
        "|---|---|---|---|---|",
    ]
    for name, r in rows_.items():
        lines.append(
            f"| {name} | {r['tokens_per_s']:.1f} | {r['tau']:.2f} | {r['target_calls']} | "
            f"{r['greedy_exact']}/{r['decodes']} |"
        )
    lines += ["", "| draftsmith | HF | speed ratio | τ ratio |", "|---|---|---|---|"]
    for suffix in ("", ", compiled"):
        for ours, theirs in PAIRS:
            ours, theirs = ours + suffix, theirs + suffix
            if ours in rows_ and theirs in rows_:
                a, b = rows_[ours], rows_[theirs]
                ratio = a["tokens_per_s"] / b["tokens_per_s"]
                lines.append(f"| {ours} | {theirs} | {ratio:.2f}× | {a['tau'] / b['tau']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="default", choices=list(PROMPTS))
    parser.add_argument("--assistant", type=Path, help="HF draft LM dir (default: the sibling / SmolLM2's export)")
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--ngram", type=int, default=3, help="longest n-gram both lookups match")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--compiled", action="store_true", help="also every row with torch.compile'd forwards")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    target_dir = resolve(args.target)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    assistant = args.assistant or default_assistant(args.target)
    if not (assistant / "config.json").is_file():
        parser.error(f"--assistant: {assistant} is not a model directory (run benchmarks/real_target.py first)")
    prompts = [encode(p, tokenizer) for p in load_prompts(PROMPTS[args.target], limit=args.num_prompts)]
    decoders = rows(target_dir, assistant, args.k, args.ngram, args.max_new_tokens, compiled=False)
    if args.compiled:
        decoders |= rows(target_dir, assistant, args.k, args.ngram, args.max_new_tokens, compiled=True)
    data = {
        "machine": machine(),
        "target": args.target,
        "prompts": PROMPTS[args.target],
        "num_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "k": args.k,
        "ngram": args.ngram,
        "repeats": args.repeats,
        "compiled": args.compiled,
        "assistant": str(assistant),
        "rows": run(decoders, prompts, args.repeats),
    }
    data["load"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    write("baselines" if args.target == "default" else f"baselines_{args.target}", data, markdown(data))


if __name__ == "__main__":
    main()
