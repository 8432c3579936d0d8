"""Drafting across vocabularies: the default target's LM (4k-token BPE) drafting for SmolLM2 (49k), draftsmith against
HF's universal assisted generation with the same draft model, same prompts, same run.

    python benchmarks/xvocab.py [--num-prompts 10] [--max-new-tokens 64] [-k 4] [--steps 300]
        [--token-weight 1.0] [--data runs/multidraft/smollm2/data/train] [--dtype float32]

Rows, greedy, interleaved per prompt (the order rotating) after a warm-up prompt (``baselines.run``), each checked
token for token against draftsmith's plain decoding: draftsmith plain, HF ``generate``, and for each draft model
draftsmith's ``xvocab:`` drafter (``families/xvocab``) beside HF's ``generate(assistant_model=...,
tokenizer=..., assistant_tokenizer=...)`` with a constant K and no confidence threshold. Draft models: the default
target's LM as built, and the same model distilled across vocabularies on SmolLM2's own generated answers
(``families.xvocab.train.distill_across_vocab``, ``--steps``; data made by ``benchmarks/multidraft.py --target smollm2`` or
any ``draftsmith generate`` run on SmolLM2): sequence-level only ("distilled"), and OmniDraft's hybrid of sequence-
and token-level losses ("hybrid", ``--token-weight``; ``draftsmith xvocab``). Writes
``benchmarks/results/xvocab.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from baselines import ForwardCounter, hf_decoder, ours_decoder, rows_table, run
from common import HELDOUT, Load, machine, prompt_ids, write
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftsmith.core.sampling import Sampling
from draftsmith.data import shards
from draftsmith.decode.verifier import SpeculativeDecoder
from draftsmith.families.xvocab.drafter import XVocabDrafter
from draftsmith.families.xvocab.train import distill_across_vocab
from draftsmith.targets import load_target, resolve, resolve_target


def rows(target_dir: Path, dtype: str, drafts: dict[str, Path], k: int, max_new: int) -> dict:
    target = load_target(resolve_target(target_dir, dtype), batch_invariant=False)
    tokenizer = target.tokenizer
    hf_model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=getattr(torch, dtype)).eval()
    counters = {hf_model: ForwardCounter(hf_model)}
    eos = list(target.eos_token_ids)
    base = {"do_sample": False, "max_new_tokens": max_new, "eos_token_id": eos, "pad_token_id": eos[0]}
    decoders = {
        "draftsmith plain": ours_decoder(target, None, max_new),
        "HF generate": hf_decoder(hf_model, counters, base),
    }
    for name, path in drafts.items():
        drafter = XVocabDrafter.from_pretrained(path, tokenizer)
        assistant = AutoModelForCausalLM.from_pretrained(path).eval()
        assistant.generation_config.num_assistant_tokens = k
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = 0.0
        counters[assistant] = ForwardCounter(assistant)
        decoders[f"draftsmith xvocab, {name}"] = ours_decoder(
            target, SpeculativeDecoder(target, drafter, k, Sampling(0.0)), max_new
        )
        decoders[f"HF universal assisted, {name}"] = hf_decoder(
            hf_model, counters, base, assistant, tokenizer=tokenizer, assistant_tokenizer=drafter.tokenizer
        )
    return decoders


def hybrid_text(h: dict | None) -> str:
    if h is None:
        return ""
    s = h["settings"]
    return (
        f"; hybrid: the same steps with the token-level loss too (weight {s['token_weight']}; {h['shared_vocabulary']:,} "
        f"tokens share their text, {h['aligned_share']:.0%} of answer tokens align; {h['seconds']:.0f} s; sequence "
        f"loss {h['loss_first']:.2f} → {h['loss_last']:.2f}, token-level {h['token_loss_first']:.2f} → "
        f"{h['token_loss_last']:.2f})"
    )


def markdown(data: dict) -> str:
    m, rows_ = data["machine"], data["rows"]
    lines = [
        "# Drafting across vocabularies: the default target's LM drafting for SmolLM2",
        "",
        f"`{m['command']}` at `{m['git']}` on {m['date']} ({m['platform']}, {m['threads']} threads; target "
        f"{data['dtype']}; load average before / after {data['load'][0]} / {data['load'][1]}). {data['num_prompts']} "
        f"prompts from `{data['prompts']}` × {data['max_new_tokens']} new tokens, K = {data['k']}, greedy, "
        f"{data['repeats']} passes interleaved per prompt. Draft model: the default target's 4-layer LM (its own "
        f"4k-token BPE; SmolLM2's vocabulary is 49k), as built and distilled across vocabularies "
        f"({data['distill']['settings']['steps']} steps × {data['distill']['settings']['batch_size']} of SmolLM2's "
        f"answers in {data['distill']['rows']} rows, {data['distill']['seconds']:.0f} s; loss "
        f"{data['distill']['loss_first']:.2f} → {data['distill']['loss_last']:.2f})"
        + hybrid_text(data.get("hybrid"))
        + ". τ = tokens per target forward "
        "(prefill included); drafted / forward: draft-model forwards (HF) or drafted target tokens (draftsmith) per "
        "target forward; exact = outputs equal to draftsmith's plain decoding.",
        "",
        *rows_table(rows_, rows_["draftsmith plain"]["tokens_per_s"]),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300, help="cross-vocabulary distillation steps")
    parser.add_argument("--token-weight", type=float, default=1.0, help="hybrid distillation (0: no hybrid row)")
    parser.add_argument("--data", type=Path, default=Path("runs/multidraft/smollm2/data/train"))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--out", type=Path, default=Path("runs/xvocab"))
    args = parser.parse_args()
    load = Load()
    target_dir, draft_dir = resolve("smollm2"), resolve("default")
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    if shards.read_metadata(args.data) is None:
        parser.error(f"--data: {args.data} holds no generated data (run benchmarks/multidraft.py --target smollm2)")
    distilled = distill_across_vocab(draft_dir, target_dir, args.data, args.out / "distilled", steps=args.steps)
    drafts = {"as built": draft_dir, "distilled": distilled}
    if args.token_weight:
        drafts["hybrid"] = distill_across_vocab(draft_dir, target_dir, args.data, args.out / "hybrid", steps=args.steps,
                                                token_weight=args.token_weight)  # fmt: skip
    prompts = prompt_ids(HELDOUT["smollm2"], tokenizer, args.num_prompts)
    decoders = rows(target_dir, args.dtype, drafts, args.k, args.max_new_tokens)
    data = {
        "machine": machine(),
        "prompts": HELDOUT["smollm2"],
        "num_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "k": args.k,
        "repeats": args.repeats,
        "dtype": args.dtype,
        "distill": json.loads((distilled / "distill.json").read_text()),
        "hybrid": json.loads((drafts["hybrid"] / "distill.json").read_text()) if "hybrid" in drafts else None,
        "rows": run(decoders, prompts, args.repeats),
    }
    data["load"] = load.span()
    write("xvocab", data, markdown(data))


if __name__ == "__main__":
    main()
