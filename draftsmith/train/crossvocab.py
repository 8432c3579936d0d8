"""Distilling a draft LM of another vocabulary to the target: sequence-level distillation on the target's own text.

The target's generated data (``draftsmith generate``) is decoded to text with the target's tokenizer and encoded with
the draft's; the draft LM learns the target's continuations by cross-entropy on its own tokens of the generated part
(the prompt is context only). This is the sequence-level half of OmniDraft's hybrid distillation; its token-level
half (a KL on the tokens both vocabularies share) is not built.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from draftsmith.core.target import load_causal_lm, model_dir
from draftsmith.data.shards import load_generated
from draftsmith.errors import DraftsmithError


def draft_rows(data: str | Path, target_tokenizer, draft_tokenizer, max_length: int) -> list[tuple[list[int], int]]:
    """(draft-vocabulary tokens, how many of them are prompt) per generated row, cut to ``max_length``."""
    rows = []
    dataset, _ = load_generated(data)
    for row in dataset:
        ids, start = row["input_ids"], row["prompt_len"]
        prompt = draft_tokenizer.encode(target_tokenizer.decode(ids[:start]), add_special_tokens=False)
        answer = draft_tokenizer.encode(target_tokenizer.decode(ids[start:]), add_special_tokens=False)
        prompt = prompt[-max(1, max_length - len(answer)) :] if len(prompt) + len(answer) > max_length else prompt
        rows.append(((prompt + answer)[:max_length], len(prompt)))
    return rows


def distill_across_vocab(
    draft: str | Path,
    target_tokenizer,
    data: str | Path,
    out: Path,
    steps: int = 200,
    batch_size: int = 8,
    lr: float = 3e-4,
    max_length: int = 512,
    seed: int = 0,
) -> Path:
    """Fine-tune the HF draft LM in ``draft`` (with its own tokenizer) on the target's generated ``data``; saves the
    model and its tokenizer to ``out`` (a drafter for ``xvocab:OUT``) and returns it. Reused when ``out`` holds a
    finished run of the same settings."""
    settings = {"draft": str(draft), "data": str(data), "steps": steps, "batch_size": batch_size, "lr": lr,
                "max_length": max_length, "seed": seed}  # fmt: skip
    done = out / "distill.json"
    if done.is_file() and json.loads(done.read_text()).get("settings") == settings:
        print(f"cross-vocabulary distillation: reusing {out}")
        return out
    path = model_dir(draft, "draft model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_causal_lm(path, "float32", "cpu", "draft model")
    rows = draft_rows(data, target_tokenizer, tokenizer, max_length)
    if not rows:
        raise DraftsmithError(f"cross-vocabulary distillation: {data} holds no generated rows")
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses, start = [], time.perf_counter()
    bar = tqdm(range(steps), desc="distil across vocabularies", unit="step")
    for _ in bar:
        batch = [rows[int(i)] for i in torch.randint(len(rows), (batch_size,), generator=g)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([r + [0] * (width - len(r)) for r, _ in batch])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r, _ in batch])
        labels = ids.masked_fill(mask == 0, -100)
        for row, (_, prompt_len) in enumerate(batch):
            labels[row, :prompt_len] = -100
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record = {"settings": settings, "rows": len(rows), "seconds": round(time.perf_counter() - start, 1),
              "loss_first": losses[0], "loss_last": sum(losses[-10:]) / len(losses[-10:]),
              "ppl_last": math.exp(min(20.0, sum(losses[-10:]) / len(losses[-10:])))}  # fmt: skip
    done.write_text(json.dumps(record, indent=2))
    return out
