"""Distilling a draft LM of another vocabulary to the target: OmniDraft's hybrid distillation on the target's text.

The target's generated data (``draftsmith generate``) is decoded to text with the target's tokenizer and encoded with
the draft's (``draft_rows``); ``XVocabDataModule`` serves those rows to ``families.xvocab.module``'s
``XVocabModule`` (its losses: sequence-level cross-entropy, and token-level where both tokenizations start a
token at the same character, over the tokens both vocabularies hold with the same text, ``shared_vocabulary``). The
target's side of the token-level loss is computed once per row (``TOP_K`` most likely shared tokens kept,
renormalised) by running the target over the generated rows.

``draftsmith xvocab`` trains it through ``fit`` (``configs/xvocab.yaml``: resume, schedule, checkpoints) and saves the
best checkpoint's draft LM with its tokenizer: a drafter for ``xvocab:OUT``.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from draftsmith.data.shards import check_dataset_target, load_generated
from draftsmith.errors import DraftsmithError
from draftsmith.families.xvocab.module import DraftRow, collate_rows
from draftsmith.train.data import ResumesMidEpoch
from draftsmith.train.fit import FitRun, fit

TOP_K = 16
"""Target probabilities kept per aligned position for the token-level loss (the most likely shared tokens)."""


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
        ids = torch.tensor([generated["input_ids"]], device=target.device)
        logits = target(input_ids=ids).logits[0].float().cpu()
        probs = torch.softmax(logits[[t for t, _ in aligned]], -1)[:, target_ids]
        top = probs.topk(min(TOP_K, len(target_ids)), dim=-1)
        kept = top.values / top.values.sum(-1, keepdim=True).clamp_min(1e-12)
        row.aligned = [(d, i.tolist(), p.tolist()) for (_, d), i, p in zip(aligned, top.indices, kept, strict=True)]


def data_fingerprint(data: str | Path) -> str:
    """What identifies the generated data: its metadata file's hash (a regenerated dataset has another)."""
    meta = Path(data) / "draftsmith.json"
    return hashlib.sha256(meta.read_bytes()).hexdigest()[:16] if meta.is_file() else str(data)


class XVocabDataModule(ResumesMidEpoch, L.LightningDataModule):
    """The target's generated data in a draft LM's own tokens, for ``XVocabModule``, which hands over the two
    tokenizers and the target when it is set up (``encode``).

    Args:
        train: generated data dir (``draftsmith generate --target TARGET``).
        val: generated data dir for validation; None: hold out ``val_fraction`` of train's rows (at least one).
        val_fraction: share of train rows held out when ``val`` is None.
        batch_size: rows per batch.
        max_length: draft tokens per row (the prompt cut from the left).
        seed: seed of the split and the shuffling.
    """

    def __init__(
        self,
        train: str,
        val: str | None = None,
        val_fraction: float = 0.05,
        batch_size: int = 8,
        max_length: int = 512,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.train_rows: list[DraftRow] = []
        self.val_rows: list[DraftRow] = []

    def check_target(self, target) -> None:
        """Refuse data generated by another target, naming both fingerprints."""
        for path in filter(None, (self.hparams.train, self.hparams.val)):
            if not Path(path).exists():
                raise DraftsmithError(f"data: {path} does not exist (make it with `draftsmith generate`)")
            check_dataset_target(load_generated(path)[1], target)

    def _rows(self, path: str, target, tokenizer, shared: dict[int, int] | None) -> tuple[list[DraftRow], float]:
        """``path``'s rows in the draft's tokens (with the target's side where ``shared``), and the share of their
        answer tokens aligned."""
        rows, pairs = draft_rows(path, target.tokenizer, tokenizer, self.hparams.max_length)
        if shared:
            token_targets(target.model, path, rows, pairs, shared)
        answers = sum(len(r.ids) - r.prompt_len for r in rows)
        return rows, sum(map(len, pairs)) / max(1, answers)

    def encode(self, target, tokenizer, token_level: bool) -> dict:
        """Make the rows in ``tokenizer``'s vocabulary (once); the token-level targets too when ``token_level``.
        Returns what was made: rows, and with ``token_level`` the shared vocabulary's size, its draft ids
        (``shared_draft``) and the aligned share of the answers."""
        shared = shared_vocabulary(target.tokenizer, tokenizer) if token_level else None
        if token_level and not shared:
            raise DraftsmithError("cross-vocabulary distillation: the two vocabularies share no token text")
        rows, aligned = self._rows(self.hparams.train, target, tokenizer, shared)
        if self.hparams.val:
            self.train_rows, (self.val_rows, _) = rows, self._rows(self.hparams.val, target, tokenizer, shared)
        else:
            if len(rows) < 2:
                raise DraftsmithError(f"data.train: {self.hparams.train} holds {len(rows)} rows; hold-out needs 2")
            order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(self.hparams.seed)).tolist()
            held = max(1, round(self.hparams.val_fraction * len(rows)))
            self.val_rows, self.train_rows = [rows[i] for i in order[:held]], [rows[i] for i in order[held:]]
        record = {"rows": len(rows)}
        if shared:
            record |= {
                "shared_vocabulary": len(shared),
                "aligned_share": aligned,
                "shared_draft": list(shared.values()),
            }
            print(f"shared vocabulary: {len(shared)} tokens; aligned positions: {aligned:.0%} of answers")
        return record

    def train_dataloader(self) -> DataLoader:
        sampler = self.train_sampler([len(r.ids) for r in self.train_rows], self.hparams.batch_size, self.hparams.seed)
        return DataLoader(self.train_rows, self.hparams.batch_size, sampler=sampler, collate_fn=collate_rows)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_rows, self.hparams.batch_size, collate_fn=collate_rows)


RECIPE = "xvocab"
"""The shipped recipe ``draftsmith xvocab`` trains through (``configs/xvocab.yaml``)."""


def distill_across_vocab(
    draft: str | Path,
    target: str | Path,
    data: str | Path,
    out: Path,
    steps: int = 200,
    batch_size: int = 8,
    lr: float = 3e-4,
    max_length: int = 512,
    seed: int = 0,
    token_weight: float = 0.0,
) -> Path:
    """Fine-tune the HF draft LM in ``draft`` (with its own tokenizer) on ``target``'s generated ``data`` through
    ``fit`` (its run in ``out/fit``); saves the best checkpoint's model and its tokenizer to ``out`` (a drafter for
    ``xvocab:OUT``) and returns it. ``token_weight`` > 0 adds the token-level loss. Reused when ``out`` holds a
    finished run of the same settings; an interrupted run of the same settings resumes from its last checkpoint."""
    if token_weight < 0:  # before any data is made (the module refuses it too, for `draftsmith fit`)
        raise DraftsmithError(f"--token_weight must be at least 0, got {token_weight}")
    settings = {"draft": str(draft), "target": str(target), "data": str(data), "data_fingerprint": data_fingerprint(data),
                "steps": steps, "batch_size": batch_size, "lr": lr, "max_length": max_length, "seed": seed,
                "token_weight": token_weight}  # fmt: skip
    out = Path(out)
    done, started = out / "distill.json", out / "started.json"
    if done.is_file() and json.loads(done.read_text()).get("settings") == settings:
        print(f"cross-vocabulary distillation: reusing {out}")
        return out
    resume = started.is_file() and json.loads(started.read_text()) == settings  # an interrupted run of these
    out.mkdir(parents=True, exist_ok=True)
    started.write_text(json.dumps(settings))
    start = time.perf_counter()
    result = fit(RECIPE, FitRun(
        target=str(target), train=str(data), out=out / "fit", steps=steps, batch_size=batch_size, lr=lr,
        model={"draft": str(draft), "token_weight": token_weight}, data={"max_length": max_length, "seed": seed},
        trainer={"enable_progress_bar": False}, resume=resume,
    ))  # fmt: skip
    return export(result.best, out, settings | {"seconds": round(time.perf_counter() - start, 1)})


def export(checkpoint: Path, out: Path, settings: dict) -> Path:
    """The draft LM of a ``XVocabModule`` checkpoint saved with its tokenizer to ``out``, and ``distill.json``:
    the settings, what the data made (rows, shared vocabulary, aligned share) and the training losses up to it."""
    from transformers import AutoTokenizer

    from draftsmith.core.target import load_causal_lm

    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    info = state["draftsmith"]
    model = load_causal_lm(Path(info["draft"]), "float32", "cpu", "draft model")
    weights = state["state_dict"]
    model.load_state_dict({k.removeprefix("drafter."): v for k, v in weights.items() if k.startswith("drafter.")})
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(info["draft"]).save_pretrained(out)
    seconds = settings.pop("seconds")
    losses, token = info["history"]["sequence"], info["history"]["token"]
    last = sum(losses[-10:]) / len(losses[-10:])
    record = {"settings": settings, **info["data"], "checkpoint": str(checkpoint), "step": state["global_step"],
              "seconds": seconds, "loss_first": losses[0], "loss_last": last, "ppl_last": math.exp(min(20.0, last))}  # fmt: skip
    if token:
        record |= {"token_loss_first": token[0], "token_loss_last": sum(token[-10:]) / len(token[-10:])}
    (out / "distill.json").write_text(json.dumps(record, indent=2))
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
    """Distil a draft LM with its own tokenizer to the target (OmniDraft's hybrid distillation, trained through
    ``fit`` with ``configs/xvocab.yaml``; run again after an interruption, it resumes); score the result as
    ``xvocab:OUT``.

    Args:
        draft: the draft LM's Hugging Face directory (its own tokenizer inside), or ``default`` (the embedded LM).
        target: ``default``, ``smollm2`` or a local model dir: whose text and distributions the draft learns.
        data: the target's generated data (``draftsmith generate --target TARGET``).
        out: where the distilled draft LM and its tokenizer are saved (the fit's run in ``OUT/fit``).
        steps: optimizer steps.
        batch_size: rows per step.
        lr: AdamW peak learning rate.
        max_length: draft tokens per row (the prompt cut from the left).
        token_weight: weight of the token-level loss (0: sequence-level only).
        seed: seed of the held-out split and the batch order.
    """
    from draftsmith.targets import resolve

    draft_dir = resolve(draft) if draft == "default" else Path(draft)
    path = distill_across_vocab(
        draft_dir, target, data, Path(out), steps, batch_size, lr, max_length, seed, token_weight
    )
    print(f"score it: draftsmith score --target {target} --drafter xvocab:{path}")
    return path
