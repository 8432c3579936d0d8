"""Distilling a draft LM of another vocabulary to the target: OmniDraft's hybrid distillation on the target's text.

The target's generated data (``draftsmith generate``) is decoded to text with the target's tokenizer and encoded with
the draft's. Two losses (Ramakrishnan et al. 2025, OmniDraft):

- **sequence-level**: cross-entropy of the draft LM on its own tokens of the generated part (the prompt is context
  only): it learns the target's continuations whatever the two segmentations;
- **token-level** (``token_weight`` > 0): where a draft token starts at the same character as a target token (both
  models then predict the next token after the same text), a KL from the target's next-token distribution to the
  draft's, over the tokens both vocabularies hold with the same text (``shared_vocabulary``; each side renormalised
  over that set). The target's side is computed once per row (``TOP_K`` most likely shared tokens kept,
  renormalised) by running the target over the generated rows.

``draftsmith xvocab`` runs it; the result is a drafter for ``xvocab:OUT``.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from draftsmith.core.target import load_causal_lm, model_dir
from draftsmith.data.shards import load_generated
from draftsmith.errors import DraftsmithError

TOP_K = 16
"""Target probabilities kept per aligned position for the token-level loss (the most likely shared tokens)."""


@dataclass
class DraftRow:
    """One generated row in the draft's vocabulary."""

    ids: list[int]
    prompt_len: int
    aligned: list[tuple[int, list[int], list[float]]] = field(default_factory=list)
    """Token-level targets: (position in ``ids`` whose logits predict the aligned token, indices into the shared
    vocabulary, the target's renormalised probabilities of them)."""


def shared_vocabulary(target_tokenizer, draft_tokenizer) -> dict[int, int]:
    """Target token id -> draft token id, for the tokens whose text (each decoded alone) both vocabularies hold as
    one token (OmniDraft's directly mapped tokens); one target token per draft token."""
    draft: dict[str, int] = {}
    for i in range(len(draft_tokenizer)):
        text = draft_tokenizer.decode([i])
        if text and "\ufffd" not in text:
            draft.setdefault(text, i)
    out, used = {}, set()
    for j in range(len(target_tokenizer)):
        i = draft.get(target_tokenizer.decode([j]))
        if i is not None and i not in used:
            out[j] = i
            used.add(i)
    return out


def starts(tokenizer, ids: list[int], text: str) -> list[int | None]:
    """The character of ``text`` each token of ``ids`` starts at (None where its prefix does not decode to a prefix
    of ``text``, e.g. inside a multi-byte character)."""
    out = []
    for i in range(len(ids)):
        prefix = tokenizer.decode(ids[:i])
        out.append(len(prefix) if text.startswith(prefix) else None)
    return out


def draft_rows(data: str | Path, target_tokenizer, draft_tokenizer, max_length: int) -> tuple[list[DraftRow], list]:
    """Each generated row in the draft's tokens, cut to ``max_length`` (the prompt from the left), and per row the
    aligned pairs (target answer index, draft position predicting it) the token-level loss may use."""
    rows, pairs = [], []
    dataset, _ = load_generated(data)
    for row in dataset:
        ids, start = row["input_ids"], row["prompt_len"]
        answer_text = target_tokenizer.decode(ids[start:])
        prompt = draft_tokenizer.encode(target_tokenizer.decode(ids[:start]), add_special_tokens=False)
        answer = draft_tokenizer.encode(answer_text, add_special_tokens=False)
        prompt = prompt[-max(1, max_length - len(answer)) :] if len(prompt) + len(answer) > max_length else prompt
        rows.append(DraftRow((prompt + answer)[:max_length], len(prompt)))
        by_char = {c: i for i, c in enumerate(starts(target_tokenizer, ids[start:], answer_text)) if c is not None}
        aligned = []
        for j, c in enumerate(starts(draft_tokenizer, answer, answer_text)):
            position = len(prompt) + j - 1  # the draft's logits there predict its answer token j
            if c in by_char and 0 <= position < max_length - 1:
                aligned.append((start + by_char[c] - 1, position))  # the target's logits predicting its token
        pairs.append(aligned)
    return rows, pairs


@torch.no_grad()
def token_targets(target, data: str | Path, rows: list[DraftRow], pairs: list, shared: dict[int, int]) -> None:
    """Fill each row's ``aligned`` with the target's distribution over the shared tokens at its aligned positions."""
    target_ids = torch.tensor(list(shared))
    dataset, _ = load_generated(data)
    for row, aligned, generated in zip(
        rows, pairs, tqdm(dataset, desc="target distributions", unit="row"), strict=True
    ):
        if not aligned:
            continue
        logits = target(input_ids=torch.tensor([generated["input_ids"]])).logits[0].float()
        probs = torch.softmax(logits[[t for t, _ in aligned]], -1)[:, target_ids]
        top = probs.topk(min(TOP_K, len(target_ids)), dim=-1)
        kept = top.values / top.values.sum(-1, keepdim=True).clamp_min(1e-12)
        row.aligned = [(d, i.tolist(), p.tolist()) for (_, d), i, p in zip(aligned, top.indices, kept, strict=True)]


def token_loss(logits: torch.Tensor, batch: list[DraftRow], shared_draft: torch.Tensor) -> torch.Tensor | None:
    """Cross-entropy of the draft's distribution over the shared tokens against the target's, at the batch's aligned
    positions (the KL up to the target's entropy, a constant); None when the batch has none."""
    rows = [(b, d, i, p) for b, row in enumerate(batch) for d, i, p in row.aligned if d < logits.shape[1]]
    if not rows:
        return None
    picked = logits[[b for b, *_ in rows], [d for _, d, *_ in rows]][:, shared_draft]  # (A, S)
    log_q = torch.log_softmax(picked.float(), -1)
    index = torch.tensor([i for *_, i, _ in rows])
    p = torch.tensor([p for *_, p in rows])
    return -(p * log_q.gather(1, index)).sum(-1).mean()


def data_fingerprint(data: str | Path) -> str:
    """What identifies the generated data: its metadata file's hash (a regenerated dataset has another)."""
    meta = Path(data) / "draftsmith.json"
    return hashlib.sha256(meta.read_bytes()).hexdigest()[:16] if meta.is_file() else str(data)


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
    target: str | Path | None = None,
    token_weight: float = 0.0,
) -> Path:
    """Fine-tune the HF draft LM in ``draft`` (with its own tokenizer) on the target's generated ``data``; saves the
    model and its tokenizer to ``out`` (a drafter for ``xvocab:OUT``) and returns it. ``token_weight`` > 0 adds the
    token-level loss (needs ``target``, the target's model dir). Reused when ``out`` holds a finished run of the same
    settings."""
    settings = {"draft": str(draft), "data": str(data), "steps": steps, "batch_size": batch_size, "lr": lr,
                "max_length": max_length, "seed": seed}  # fmt: skip
    if token_weight:  # earlier sequence-level runs keep their settings (and stay reusable)
        if target is None:
            raise DraftsmithError("cross-vocabulary distillation: --token_weight > 0 needs the target (--target)")
        settings |= {"target": str(target), "token_weight": token_weight, "data_fingerprint": data_fingerprint(data)}
    done = out / "distill.json"
    if done.is_file() and json.loads(done.read_text()).get("settings") == settings:
        print(f"cross-vocabulary distillation: reusing {out}")
        return out
    path = model_dir(draft, "draft model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_causal_lm(path, "float32", "cpu", "draft model")
    rows, pairs = draft_rows(data, target_tokenizer, tokenizer, max_length)
    if not rows:
        raise DraftsmithError(f"cross-vocabulary distillation: {data} holds no generated rows")
    record: dict = {"settings": settings, "rows": len(rows)}
    shared_draft = None
    if token_weight:
        shared = shared_vocabulary(target_tokenizer, tokenizer)
        if not shared:
            raise DraftsmithError("cross-vocabulary distillation: the two vocabularies share no token text")
        token_targets(
            load_causal_lm(model_dir(target, "target"), "float32", "cpu", "target"), data, rows, pairs, shared
        )
        shared_draft = torch.tensor(list(shared.values()))
        answer_tokens = sum(len(r.ids) - r.prompt_len for r in rows)
        record |= {"shared_vocabulary": len(shared), "aligned_share": sum(map(len, pairs)) / max(1, answer_tokens)}
        print(f"shared vocabulary: {len(shared)} tokens; aligned positions: {record['aligned_share']:.0%} of answers")
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses, token_losses, start = [], [], time.perf_counter()
    bar = tqdm(range(steps), desc="distil across vocabularies", unit="step")
    for _ in bar:
        batch = [rows[int(i)] for i in torch.randint(len(rows), (batch_size,), generator=g)]
        width = max(len(r.ids) for r in batch)
        ids = torch.tensor([r.ids + [0] * (width - len(r.ids)) for r in batch])
        mask = torch.tensor([[1] * len(r.ids) + [0] * (width - len(r.ids)) for r in batch])
        labels = ids.masked_fill(mask == 0, -100)
        for row, r in enumerate(batch):
            labels[row, : r.prompt_len] = -100
        output = model(input_ids=ids, attention_mask=mask, labels=labels)
        loss = output.loss
        losses.append(loss.item())
        if shared_draft is not None:
            tl = token_loss(output.logits, batch, shared_draft)
            if tl is not None:
                loss = loss + token_weight * tl
                token_losses.append(tl.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    last = sum(losses[-10:]) / len(losses[-10:])
    record |= {"seconds": round(time.perf_counter() - start, 1), "loss_first": losses[0], "loss_last": last,
               "ppl_last": math.exp(min(20.0, last))}  # fmt: skip
    if token_losses:
        record |= {
            "token_loss_first": token_losses[0],
            "token_loss_last": sum(token_losses[-10:]) / len(token_losses[-10:]),
        }
    done.write_text(json.dumps(record, indent=2))
    return out


def xvocab(
    draft: str,
    target: str,
    data: str,
    out: Path = Path("runs/xvocab"),
    steps: int = 200,
    batch_size: int = 8,
    lr: float = 3e-4,
    max_length: int = 512,
    token_weight: float = 1.0,
    seed: int = 0,
) -> Path:
    """Distil a draft LM with its own tokenizer to the target (OmniDraft's hybrid distillation); score the result as
    ``xvocab:OUT``.

    Args:
        draft: the draft LM's Hugging Face directory (its own tokenizer inside), or ``default`` (the embedded LM).
        target: ``default``, ``smollm2`` or a local model dir: whose text and distributions the draft learns.
        data: the target's generated data (``draftsmith generate --target TARGET``).
        out: where the distilled draft LM and its tokenizer are saved.
        steps: optimizer steps.
        batch_size: rows per step.
        lr: AdamW learning rate.
        max_length: draft tokens per row (the prompt cut from the left).
        token_weight: weight of the token-level loss (0: sequence-level only).
        seed: seed of the batch order.
    """
    from draftsmith.targets import resolve

    target_dir = resolve(target)
    draft_dir = resolve(draft) if draft == "default" else Path(draft)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    path = distill_across_vocab(draft_dir, tokenizer, data, Path(out), steps, batch_size, lr, max_length, seed,
                                target_dir, token_weight)  # fmt: skip
    print(f"score it: draftsmith score --target {target} --drafter xvocab:{path}")
    return path
