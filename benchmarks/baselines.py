"""draftsmith's decode loop against what transformers already ships, on the same target, prompts, K and budget.

    python benchmarks/baselines.py [--target default|smollm2] [--num-prompts 20] [--max-new-tokens 64] [-k 4]
        [--compiled]

Pairs, each row greedy and checked token for token against draftsmith's plain decoding:
- draftsmith plain decoding vs HF ``generate``;
- draftsmith + a draft LM vs HF assisted generation with the same draft LM (``assistant_model``), K constant and
  no confidence threshold on both sides;
- draftsmith + the draft LM with confidence stopping (``confidence:0.4:DRAFT_LM``, up to 20 tokens) vs HF's
  default assisted generation (up to 20 tokens, drafting stops below a confidence threshold, 0.4 to start);
- draftsmith's n-gram drafter vs HF prompt lookup (``prompt_lookup_num_tokens`` = K, same longest n-gram).
Every prompt runs every row in turn (the order rotates from prompt to prompt), ``--repeats`` times, after one
warm-up prompt, so machine load hits every row alike. τ here is tokens per target forward, prefill included, the
one definition both loops share (HF's first assisted round drafts on the prompt's own forward). Target forwards are
counted by a hook on the target model. ``--compiled`` adds every row again with ``torch.compile``d forwards on both
sides (``score --compile``). Writes ``benchmarks/results/baselines[_<target>].{json,md}``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import HELDOUT, Load, machine, prompt_ids, write
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target, compiled_forward
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.export.registry import write_export
from draftsmith.families.ngram.drafter import NGramDrafter
from draftsmith.layers.causal_lm import DraftLM
from draftsmith.targets import resolve

MAX_DRAFT = 20
"""The longest draft of the confidence-stopping rows, as HF's default assisted generation (20 tokens)."""


class ForwardCounter:
    """Counts the forwards of a model (a forward hook), to measure HF's target calls as draftsmith counts its own."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        model.register_forward_hook(self._count)

    def _count(self, module, args, output) -> None:
        self.calls += 1


def default_assistant(target: str) -> Path:
    """The default target's sibling LM; for SmolLM2, the distilled draft LM of ``benchmarks/real_target.py``
    exported as a HF model dir (exported here the first time)."""
    if target == "default":
        return resolve("default") / "sibling"
    run = Path("runs/real_target")
    exported = run / "export" / "draft_lm-hf"
    if not (exported / "config.json").is_file() and (run / "drafters" / "draft_lm").is_dir():
        write_export(run / "drafters" / "draft_lm", "hf", exported, target=str(resolve(target)), overwrite=True)
    return exported


Decoder = Callable[[list[int]], tuple[list[int], int, int | None, float]]
"""A row: prompt -> (generated tokens, target forwards, draft-model forwards or drafted tokens, seconds)."""


def ours_decoder(target: Target, decoder: SpeculativeDecoder | None, max_new: int) -> Decoder:
    """draftsmith's plain decoding (``decoder`` None) or speculative decoding, greedy, as a row."""

    def decode(prompt: list[int]) -> tuple[list[int], int, int | None, float]:
        if decoder is None:
            r = plain_decode(target, prompt, max_new, Sampling(0.0))
        else:
            r = decoder.generate(prompt, max_new)
        return r.tokens, r.target_calls, sum(r.drafted), r.seconds

    return decode


def hf_decoder(
    hf_model: torch.nn.Module, counters: dict, base: dict, assistant: torch.nn.Module | None = None, **kwargs
) -> Decoder:
    """HF ``generate`` as a row (``assistant``: assisted generation with it; ``kwargs``: further ``generate``
    arguments). ``counters``: a ``ForwardCounter`` per model, the target's and the assistant's among them."""
    if assistant is not None:
        kwargs["assistant_model"] = assistant

    @torch.no_grad()
    def decode(prompt: list[int]) -> tuple[list[int], int, int | None, float]:
        ids = torch.tensor([prompt])
        before = {m: c.calls for m, c in counters.items()}
        start = time.perf_counter()
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), **base, **kwargs)
        seconds = time.perf_counter() - start
        drafted = None if assistant is None else counters[assistant].calls - before[assistant]
        calls = counters[hf_model].calls - before[hf_model]
        return (
            out[0, len(prompt) :].tolist(),
            calls,
            drafted if "prompt_lookup_num_tokens" not in kwargs else None,
            seconds,
        )

    return decode


def rows(
    target_dir: Path, assistant_dir: Path, k: int, ngram: int, max_new: int, threshold: float, compiled: bool
) -> dict[str, Callable[[list[int]], tuple[list[int], int, int | None, float]]]:
    """Each row: prompt -> (generated tokens, target forwards, draft-model forwards or drafted tokens, seconds).

    Every row has its own model instances. HF assisted generation reads its schedule and confidence threshold from
    the assistant's generation config (in transformers 5, not from ``generate``'s arguments) and updates them there
    from call to call, so each assisted row has its own assistant, configured there. ``compiled`` rows run the same
    loops with ``torch.compile``d forwards (``core.target.compiled_forward``), the HF ones with the compiled forward
    set on the model, where ``generate`` calls it.
    """
    greedy = Sampling(0.0)
    target = Target.from_pretrained(target_dir)
    draft_lm = DraftLM.from_pretrained(assistant_dir)
    stopping = DraftLM.from_pretrained(assistant_dir, stop_below=threshold)
    hf_model = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    constant, defaults = (AutoModelForCausalLM.from_pretrained(assistant_dir).eval() for _ in range(2))
    constant.generation_config.num_assistant_tokens = k
    constant.generation_config.num_assistant_tokens_schedule = "constant"
    constant.generation_config.assistant_confidence_threshold = 0.0
    if compiled:
        # eight instances of one model class share one compiled forward: room for all their graphs
        torch._dynamo.config.recompile_limit = 1024
        for drafter in (target, draft_lm, stopping):
            drafter.compile()
        for model in (hf_model, constant, defaults):
            model.forward = compiled_forward(model)
    counters = {m: ForwardCounter(m) for m in (hf_model, constant, defaults)}
    eos = list(target.eos_token_ids)
    base = {"do_sample": False, "max_new_tokens": max_new, "eos_token_id": eos, "pad_token_id": eos[0]}

    def ours(decoder: SpeculativeDecoder | None) -> Callable:
        return ours_decoder(target, decoder, max_new)

    def hf(assistant: torch.nn.Module | None = None, **kwargs) -> Callable:
        return hf_decoder(hf_model, counters, base, assistant, **kwargs)

    decoders = {
        "draftsmith plain": ours(None),
        "draftsmith draft LM": ours(SpeculativeDecoder(target, draft_lm, k, greedy)),
        f"draftsmith draft LM, confidence {threshold}": ours(SpeculativeDecoder(target, stopping, MAX_DRAFT, greedy)),
        "draftsmith n-gram": ours(SpeculativeDecoder(target, NGramDrafter(max_ngram=ngram), k, greedy)),
        "HF generate": hf(),
        "HF assisted, constant K": hf(constant),
        "HF assisted, HF defaults": hf(defaults),
        "HF prompt lookup": hf(prompt_lookup_num_tokens=k, max_matching_ngram_size=ngram),
    }
    return {name + (", compiled" if compiled else ""): decode for name, decode in decoders.items()}


def run(decoders: dict, prompts: list[list[int]], repeats: int) -> dict:
    """Interleave every row on every prompt (rotating the order), after a warm-up prompt; aggregate per row."""
    names = list(decoders)
    for decode in decoders.values():  # warm-up (and compilation, for compiled rows)
        decode(prompts[0])
    total = {n: {"tokens": 0, "target_calls": 0, "drafted": 0, "seconds": 0.0, "greedy_exact": 0} for n in names}
    for rep in range(repeats):
        for i, prompt in enumerate(prompts):
            shift = (rep * len(prompts) + i) % len(names)
            outs = {n: decoders[n](prompt) for n in names[shift:] + names[:shift]}
            reference = outs[names[0]][0]  # draftsmith's plain decoding, eager
            for n, (tokens, calls, drafted, seconds) in outs.items():
                row = total[n]
                row["tokens"] += len(tokens)
                row["target_calls"] += calls
                row["drafted"] = None if drafted is None else row["drafted"] + drafted
                row["seconds"] += seconds
                row["greedy_exact"] += int(tokens == reference)
    for row in total.values():
        row["tokens_per_s"] = row["tokens"] / row["seconds"]
        row["tau"] = row["tokens"] / row["target_calls"]
        row["decodes"] = repeats * len(prompts)
    return total


def pairs(threshold: float) -> list[tuple[str, str]]:
    return [
        ("draftsmith plain", "HF generate"),
        ("draftsmith draft LM", "HF assisted, constant K"),
        (f"draftsmith draft LM, confidence {threshold}", "HF assisted, HF defaults"),
        ("draftsmith n-gram", "HF prompt lookup"),
    ]


def rows_table(rows: dict, plain: float | None = None) -> list[str]:
    """The decoders' table (``run``'s rows): tokens/s (over ``plain``'s where given), τ, drafted tokens or draft-model
    forwards per target forward, target forwards, outputs equal to plain decoding's."""
    lines = ["| row | tokens/s | τ | drafted / forward | target forwards | exact |", "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        drafted = "–" if r["drafted"] is None else f"{r['drafted'] / r['target_calls']:.2f}"
        speed = f"{r['tokens_per_s']:.1f}" + (f" ({r['tokens_per_s'] / plain:.2f}×)" if plain is not None else "")
        lines.append(
            f"| {name} | {speed} | {r['tau']:.2f} | {drafted} | {r['target_calls']} | {r['greedy_exact']}/{r['decodes']} |"
        )
    return lines


def markdown(data: dict) -> str:
    m, rows_ = data["machine"], data["rows"]
    lines = [
        f"# draftsmith vs HF transformers' decoding: {data['target']} target",
        "",
        f"`{m['command']}` at `{m['git']}` on {m['date']} ({m['platform']}, {m['threads']} threads; load average "
        f"before / after {data['load'][0]} / {data['load'][1]}). {data['num_prompts']} prompts from "
        f"`{data['prompts']}` × {data['max_new_tokens']} new tokens, K = {data['k']}, n-gram N = {data['ngram']}, "
        f"greedy, {data['repeats']} passes interleaved per prompt; draft LM `{data['assistant']}`. τ = tokens per "
        "target forward (prefill included); drafted / forward = the draft model's forwards (HF) or drafted tokens "
        "(draftsmith, one draft-model forward each) per target forward; exact = outputs equal to draftsmith's "
        "plain decoding. The confidence rows draft up to "
        f"{MAX_DRAFT} tokens and stop after one the draft model gives less than the threshold (HF's default "
        "assisted generation: up to 20, threshold 0.4 to start, then tuned from call to call).",
        "",
        *rows_table(rows_),
        "",
        "| draftsmith | HF | speed ratio | τ ratio |",
        "|---|---|---|---|",
    ]
    for suffix in ("", ", compiled"):
        for ours, theirs in pairs(data["threshold"]):
            a, b = rows_.get(ours + suffix), rows_.get(theirs + suffix)
            if a and b:
                ratio = a["tokens_per_s"] / b["tokens_per_s"]
                lines.append(f"| {ours + suffix} | {theirs + suffix} | {ratio:.2f}× | {a['tau'] / b['tau']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="default", choices=list(HELDOUT))
    parser.add_argument("--assistant", type=Path, help="HF draft LM dir (default: the sibling / SmolLM2's export)")
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--ngram", type=int, default=3, help="longest n-gram both lookups match")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threshold", type=float, default=0.4, help="the confidence rows' threshold")
    parser.add_argument("--compiled", action="store_true", help="also every row with torch.compile'd forwards")
    args = parser.parse_args()
    load = Load()
    target_dir = resolve(args.target)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    assistant = args.assistant or default_assistant(args.target)
    if not (assistant / "config.json").is_file():
        parser.error(f"--assistant: {assistant} is not a model directory (run benchmarks/real_target.py first)")
    prompts = prompt_ids(HELDOUT[args.target], tokenizer, args.num_prompts)
    settings = (target_dir, assistant, args.k, args.ngram, args.max_new_tokens, args.threshold)
    decoders = rows(*settings, compiled=False)
    if args.compiled:
        decoders |= rows(*settings, compiled=True)
    data = {
        "machine": machine(),
        "target": args.target,
        "prompts": HELDOUT[args.target],
        "num_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "k": args.k,
        "ngram": args.ngram,
        "repeats": args.repeats,
        "compiled": args.compiled,
        "threshold": args.threshold,
        "assistant": str(assistant),
        "rows": run(decoders, prompts, args.repeats),
    }
    data["load"] = load.span()
    write("baselines" if args.target == "default" else f"baselines_{args.target}", data, markdown(data))


if __name__ == "__main__":
    main()
