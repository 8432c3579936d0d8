"""Training Judge decoding's judge: labels made from the target's own alternatives, and a logistic head fitted on them.

Labels (the method, stated in every judge dir): for each training prompt with a check (``data/checks.py``), the
target answers greedily; at every position j of that answer, each of the target's ``alternatives`` next most likely
tokens x (other than its own) is forced, the target continues greedily from it to the same answer length, and x is
labelled *correct* when that answer passes the prompt's check, else *incorrect*. The feature of x is the target's
final hidden state at x's position (where it reads x), which is what the verifier shows the judge for a draft token.
So the judge learns which deviations from the target's own choice leave the answer right: in prose most do, inside
code or a fact few do. Only the target's deviations are labelled (its own tokens are kept by the lossless rule anyway).

The head (``families.judge.JudgeHead``) is fitted by class-balanced logistic regression on the labels of most
prompts, its L2 penalty the one of best AUC on the other prompts' labels; its threshold is the lowest at which at most ``max_false_accept`` of the other prompts' incorrect tokens
are accepted.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.core.fingerprint import check_fingerprint
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.checks import passes
from draftsmith.data.decode import decode_batch
from draftsmith.data.prompts import encode
from draftsmith.data.records import Prompt
from draftsmith.errors import DraftsmithError
from draftsmith.families.judge import JudgeHead, save_judge
from draftsmith.targets import ResolvedTarget

LABELS = "labels.pt"
L2_GRID = (1e-2, 1e-1, 1.0, 10.0)
"""L2 penalties of the logistic fit (on standardised features) tried; the one of best held-out AUC is kept."""


@dataclass(frozen=True)
class JudgeConfig:
    """How a judge is made (``draftsmith judge``'s flags)."""

    alternatives: int = 2
    """The target's next most likely tokens labelled at each position of its answer."""
    max_new_tokens: int = 48
    """Answer length: the positions labelled, and how far each forced continuation runs."""
    batch_size: int = 16
    """Forced continuations generated together."""
    val_share: float = 0.25
    """Share of the prompts whose labels choose the threshold (not fitted on)."""
    max_false_accept: float = 0.05
    """The threshold accepts at most this share of the held-out prompts' incorrect tokens."""
    steps: int = 500
    """Full-batch optimiser steps of the logistic regression."""
    seed: int = 0


def _continuations(
    target: Target, rows: list[list[int]], new_tokens: list[int]
) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy continuations of ``rows`` (each up to its ``new_tokens``, stopping at EOS) and the final hidden state
    at each row's last token, in one batch (``data.decode.decode_batch``)."""
    out = decode_batch(
        target.model, rows, [0] * len(rows), Sampling(0.0), [max(n, 1) for n in new_tokens], target.eos_token_ids,
        last_hidden=True,
    )  # fmt: skip
    return [d.tokens[:n] for d, n in zip(out, new_tokens, strict=True)], torch.stack([d.last_hidden for d in out])


@torch.inference_mode()
def make_labels(target: Target, prompts: list[Prompt], cfg: JudgeConfig, progress: bool = True) -> dict:
    """The labelled alternatives of ``prompts`` (see the module doc): features (N, H), labels (N,), the prompt each
    came from (N,), per prompt whether the target's own answer passes, and per label (prompt, the answer up to and
    with the forced token, how many tokens the target continued with)."""
    tok = target.tokenizer
    jobs, own_pass = [], []
    for i, prompt in enumerate(tqdm(prompts, desc="judge: answers", unit="prompt", disable=not progress)):
        ids = encode(prompt, tok)
        answer, _ = _continuations(target, [ids], [cfg.max_new_tokens])
        answer = answer[0]
        own_pass.append(passes(prompt.check, tok.decode(answer, skip_special_tokens=True)))
        logits = target(torch.tensor([ids + answer]), with_features=False).logits[
            0, len(ids) - 1 : len(ids) - 1 + len(answer)
        ]
        top = logits.topk(cfg.alternatives + 1, dim=-1).indices.tolist()
        for j, (own, ranked) in enumerate(zip(answer, top, strict=True)):
            for x in [t for t in ranked if t != own][: cfg.alternatives]:
                jobs.append((i, ids + answer[:j] + [x], answer[:j] + [x], len(answer) - j - 1))
    features, labels, where, forced = [], [], [], []
    bar = tqdm(total=len(jobs), desc="judge: forced continuations", unit="cont", disable=not progress)
    for start in range(0, len(jobs), cfg.batch_size):
        batch = jobs[start : start + cfg.batch_size]
        rest, hidden = _continuations(target, [row for _, row, _, _ in batch], [n for *_, n in batch])
        for (i, _, head, n), tail in zip(batch, rest, strict=True):
            text = tok.decode(head + (tail if n > 0 else []), skip_special_tokens=True)
            labels.append(passes(prompts[i].check, text))
            where.append(i)
            forced.append((i, head, n))
        features.append(hidden)
        bar.update(len(batch))
    bar.close()
    return {
        "features": torch.cat(features) if features else torch.empty(0, target.hidden_size),
        "labels": torch.tensor(labels, dtype=torch.bool),
        "prompt": torch.tensor(where, dtype=torch.long),
        "own_pass": own_pass,
        "forced": forced,
    }


def fit_head(labels: dict, cfg: JudgeConfig, num_prompts: int) -> tuple[JudgeHead, dict]:
    """The logistic head on the labels of most prompts and its threshold from the rest; returns (head, report)."""
    x, y, where = labels["features"], labels["labels"].float(), labels["prompt"]
    g = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(num_prompts, generator=g)
    held = set(order[: max(1, round(cfg.val_share * num_prompts))].tolist())
    val = torch.tensor([int(i) in held for i in where], dtype=torch.bool)
    fit_x, fit_y = x[~val], y[~val]
    if fit_y.numel() == 0 or fit_y.min() == fit_y.max() or y[val].numel() == 0 or not (y[val] == 0).any():
        raise DraftsmithError(
            "judge: the labels hold only one class (or no held-out incorrect token); give more prompts with checks, "
            "or more --alternatives"
        )
    mean, std = fit_x.mean(0), fit_x.std(0).clamp_min(1e-6)
    weight = (1 - fit_y.mean()) / fit_y.mean()  # balance the classes
    fits = []
    for l2 in L2_GRID:  # a few thousand labels in hundreds of dimensions overfit: the L2 of best held-out AUC
        head = JudgeHead(x.shape[1])
        opt = torch.optim.Adam(head.parameters(), lr=1e-2)
        torch.manual_seed(cfg.seed)
        for _ in range(cfg.steps):
            logits = head((fit_x - mean) / std)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, fit_y, pos_weight=weight)
            loss = loss + l2 * head.linear.weight.square().sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():  # fold the standardisation into the weights: the head reads raw hidden states
            head.linear.weight.div_(std)
            head.linear.bias.sub_((head.linear.weight * mean).sum())
            p = torch.sigmoid(head(x[val]))
        fits.append((_auc(p[y[val] == 1], p[y[val] == 0]), l2, head, p, float(loss.detach())))
    auc, l2, head, p, loss = max(fits, key=lambda f: f[0])
    neg, pos = p[y[val] == 0].sort().values, p[y[val] == 1]
    # the lowest threshold accepting at most max_false_accept of the held-out incorrect tokens
    allowed = int(cfg.max_false_accept * neg.numel())
    head.threshold = float(neg[neg.numel() - allowed - 1]) + 1e-6 if allowed < neg.numel() else 0.0
    report = {
        "labels": int(y.numel()),
        "correct_share": round(float(y.mean()), 4),
        "fit_loss": round(loss, 4),
        "l2": l2,
        "val_auc_by_l2": {str(f[1]): round(f[0], 4) for f in fits},
        "val_labels": int(val.sum()),
        "threshold": round(head.threshold, 6),
        "val_false_accept": round(float((neg >= head.threshold).float().mean()), 4),
        "val_true_accept": round(float((pos >= head.threshold).float().mean()), 4) if pos.numel() else None,
        "val_auc": round(auc, 4),
    }
    return head, report


def _auc(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """P(a correct token scores above an incorrect one), ties half."""
    if not pos.numel() or not neg.numel():
        return float("nan")
    diff = pos[:, None] - neg[None, :]
    return float((diff > 0).float().mean() + 0.5 * (diff == 0).float().mean())


def train_judge(target: Target, prompts: list[Prompt], out: Path, cfg: JudgeConfig, progress: bool = True) -> dict:
    """Labels (reused from ``out`` when made for the same target, prompts and settings) and the fitted judge in
    ``out``; returns the judge's record."""
    if not prompts or any(p.check is None for p in prompts):
        missing = sum(p.check is None for p in prompts)
        raise DraftsmithError(
            f"judge: {missing} of {len(prompts)} prompts have no 'check' to label answers by: use "
            "builtin:checkable-train or prompts with a check field (data/checks.py)"
        )
    out.mkdir(parents=True, exist_ok=True)
    key = {"prompts": [asdict(p) for p in prompts], "alternatives": cfg.alternatives,
           "max_new_tokens": cfg.max_new_tokens}  # fmt: skip
    stored = out / LABELS
    labels = torch.load(stored, weights_only=False) if stored.is_file() else None
    if labels is not None and labels.get("key") == key:
        check_fingerprint(labels["target"], target.fingerprint, f"judge labels {stored}")
        print(f"judge: reusing {len(labels['labels'])} labels in {stored}")
    else:
        start = time.perf_counter()
        labels = make_labels(target, prompts, cfg, progress) | {"key": key, "target": target.fingerprint}
        labels["seconds"] = round(time.perf_counter() - start, 1)
        torch.save(labels, stored)
    head, report = fit_head(labels, cfg, len(prompts))
    record = {
        "method": "labels: the target's top alternatives to its own greedy tokens, each forced and continued "
        "greedily by the target; correct = the continued answer passes the prompt's check",
        "config": asdict(cfg),
        "prompts": len(prompts),
        "target_answers_pass": sum(labels["own_pass"]),
        "label_seconds": labels.get("seconds"),
        **report,
    }
    save_judge(head, target, out, {"training": record})
    (out / "judge.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return record


def judge(
    target: ResolvedTarget,
    prompts: str = "builtin:checkable-train",
    out: Path = Path("runs/judge"),
    num_prompts: int | None = None,
    prompt_field: str = "prompt",
    alternatives: int = 2,
    max_new_tokens: int = 48,
    batch_size: int = 16,
    max_false_accept: float = 0.05,
    seed: int = 0,
) -> dict:
    """Train a judge for Judge decoding (lossy: ``score --judge OUT`` scores drafters with and without it).

    Args:
        target: ``default``, ``smollm2`` or a local model dir, optionally ``:DTYPE`` (score in the same dtype); the
            judge is for it alone (from Python a ``targets.ResolvedTarget``: ``draftsmith.cli`` resolves it once).
        prompts: prompts with checkable answers: ``builtin:checkable-train`` or a JSONL / dataset with a ``check``
            field per record (``data/checks.py``).
        out: the judge dir (its labels are kept there and reused).
        num_prompts: use the first N prompts (all by default).
        prompt_field: the prompt's field name in JSONL / dataset sources.
        alternatives: the target's next most likely tokens labelled at each answer position.
        max_new_tokens: answer length labelled.
        batch_size: forced continuations generated together.
        max_false_accept: the threshold accepts at most this share of held-out incorrect tokens.
        seed: seed of the held-out split and the fit.
    """
    from draftsmith.data.prompts import load_prompts
    from draftsmith.targets import load_target

    t = load_target(target)
    cfg = JudgeConfig(alternatives, max_new_tokens, batch_size, max_false_accept=max_false_accept, seed=seed)
    return train_judge(t, load_prompts(prompts, prompt_field, num_prompts), Path(out), cfg)
