"""Instructions a chat target writes itself (Magpie, Xu et al. 2024, arXiv 2406.08464).

Given only its chat template's prefix of a user turn, an aligned chat model completes it with the kind of
instruction it was tuned on; its own answers to those instructions are then on-policy data from the
distribution it serves. ``python -m draftsmith.data.magpie --target smollm2 --out FILE`` writes them as chat
JSONL (the built-in ``chat`` prompt sets ship SmolLM2's, made by that command).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.decode import decode_batch, row_seed
from draftsmith.errors import DraftsmithError
from draftsmith.targets import ResolvedTarget, load_target, resolve_target

SENTINEL = "\x00MAGPIE\x00"


def user_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to where a user turn's text begins (system prompt included)."""
    if not getattr(tokenizer, "chat_template", None):
        raise DraftsmithError("magpie: the target's tokenizer has no chat template")
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False)
    prefix = text.split(SENTINEL)[0]
    return tokenizer(prefix, add_special_tokens=False)["input_ids"]


def clean(text: str, min_words: int = 4) -> str | None:
    """A generated instruction, stripped; None for one too short or left unfinished."""
    text = text.strip()
    return text if len(text.split()) >= min_words else None


def stop_tokens(tokenizer, eos_token_ids) -> set[int]:
    """Where a user turn ends: the target's stop tokens, and ChatML's <|im_end|> also when its config omits it."""
    im_end = [tokenizer.convert_tokens_to_ids("<|im_end|>")] if "<|im_end|>" in tokenizer.get_vocab() else []
    return {*eos_token_ids, *im_end}


def finished_instruction(tokens: list[int], stop: set[int], tokenizer, seen: set[str]) -> str | None:
    """The instruction in a sampled user turn, or None for one unfinished (no stop token at its end), too short or
    already ``seen`` (case-insensitive; a kept one is added to ``seen``)."""
    if not tokens or tokens[-1] not in stop:
        return None
    text = clean(tokenizer.decode(tokens[:-1]))
    if text is None or text.lower() in seen:
        return None
    seen.add(text.lower())
    return text


@torch.no_grad()
def write_instructions(
    target: Target,
    n: int,
    out: Path,
    seed: int = 0,
    temperature: float = 1.0,
    top_p: float = 0.95,
    max_new_tokens: int = 64,
    batch_size: int = 32,
) -> int:
    """Sample up to ``n`` distinct instructions from ``target`` and write them to ``out`` (chat JSONL).

    Rows that do not end their turn within ``max_new_tokens`` are dropped (unfinished), as are duplicates.
    Each batch's instructions are appended as it finishes (``out.partial``, renamed to ``out`` at the end), and
    a rerun resumes after the last finished batch: rows are seeded per index, so a resumed file is the file an
    uninterrupted run writes. Returns the number written.
    """
    tok = target.tokenizer
    prefix = user_prefix(tok)
    stop = stop_tokens(tok, target.eos_token_ids)
    sampling = Sampling(temperature, top_p)
    partial = out.with_name(out.name + ".partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, i = _finished_batches(partial)
    seen = {r["messages"][0]["content"].lower() for r in rows}
    bar = tqdm(total=n, initial=len(rows), desc="magpie", unit="instruction")
    while len(rows) < n and i < 4 * n:
        new = []
        seeds = [row_seed(seed, i + j, 0) for j in range(batch_size)]
        for j, d in enumerate(
            decode_batch(target.model, [prefix] * batch_size, seeds, sampling, max_new_tokens, sorted(stop))
        ):
            text = finished_instruction(d.tokens, stop, tok, seen)
            if text is None:
                continue
            new.append({"messages": [{"role": "user", "content": text}], "source": f"magpie:{seed}:{i + j}"})
            bar.update(1)
        i += batch_size
        rows += new
        with open(partial, "a", encoding="utf-8") as f:  # the batch's rows, then the mark that it is done
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in [*new, {"batch_end": i}]))
    bar.close()
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows[:n]))
    partial.unlink()
    return min(n, len(rows))


def write_instructions_generated(
    target: ResolvedTarget,
    n: int,
    out: Path,
    work: Path,
    seed: int = 0,
    temperature: float = 1.0,
    top_p: float = 0.95,
    max_new_tokens: int = 64,
    oversample: float = 2.0,
    **generate_args,
) -> int:
    """``write_instructions`` decoded by ``draftsmith generate`` (``generate_args``: e.g. ``engine="vllm"``):
    ``n * oversample`` copies of the user-turn prefix, one sample each (rows are seeded per index), kept when the
    turn ended and the text is new. ``work`` holds the prefixes and the generated run (resumable by its shards).
    Returns the number written (up to ``n``; fewer when the target repeats itself more than ``oversample`` allows).
    """
    from transformers import AutoTokenizer

    from draftsmith.data.generate import generate, load_generated

    tok = AutoTokenizer.from_pretrained(target.path)
    ids = user_prefix(tok)
    prefix = tok.decode(ids)
    if tok(prefix, add_special_tokens=False)["input_ids"] != ids:
        raise DraftsmithError("magpie: the user-turn prefix does not survive decoding and re-encoding as text")
    work.mkdir(parents=True, exist_ok=True)
    prompts = work / "prefixes.jsonl"
    rows = round(n * oversample)
    prompts.write_text((json.dumps({"prompt": prefix}) + "\n") * rows)
    data = work / "generated"
    resume = (data / "draftsmith.json").is_file()
    generate(target, str(prompts), data, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
             seed=seed, chat_template=False, shard_size=256, resume=resume, **generate_args)  # fmt: skip
    ds, _ = load_generated(data)
    stop = stop_tokens(tok, Target.from_config(target.path).eos_token_ids)
    seen, kept = set(), []
    for row in ds.select_columns(["input_ids", "prompt_len", "prompt_index"]):
        text = finished_instruction(row["input_ids"][row["prompt_len"] :], stop, tok, seen)
        if text is None:
            continue
        kept.append({"messages": [{"role": "user", "content": text}], "source": f"magpie:{seed}:{row['prompt_index']}"})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept[:n]))
    return min(n, len(kept))


def _finished_batches(partial: Path) -> tuple[list[dict], int]:
    """The rows of the batches a killed run finished (those before its last ``batch_end`` mark) and the
    index the next batch starts at."""
    rows, kept, start = [], [], 0
    lines = partial.read_text(encoding="utf-8").splitlines() if partial.is_file() else []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by the kill
            break
        if "batch_end" in record:
            kept, start = list(rows), record["batch_end"]
        else:
            rows.append(record)
    return kept, start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("-n", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    target = load_target(resolve_target(args.target))  # this script's entry: the target named once
    count = write_instructions(target, args.n, args.out, seed=args.seed, batch_size=args.batch_size)
    print(f"wrote {count} instructions to {args.out}")


if __name__ == "__main__":
    main()
