"""``XVocabModule``: OmniDraft's hybrid distillation of a draft LM with its own tokenizer, trained through ``fit``.

The target's generated data, re-tokenized in the draft's vocabulary (``families.xvocab.train.XVocabDataModule``),
trains the draft LM with two losses (Ramakrishnan et al. 2025, OmniDraft):

- **sequence-level**: cross-entropy of the draft LM on its own tokens of the generated part (the prompt is context
  only): it learns the target's continuations whatever the two segmentations;
- **token-level** (``token_weight`` > 0): where a draft token starts at the same character as a target token (both
  models then predict the next token after the same text), a KL from the target's next-token distribution to the
  draft's over the tokens both vocabularies hold with the same text (``token_loss``).

The drafter is the HF draft LM itself (it drafts as ``xvocab:DIR``, ``families.xvocab.drafter``); checkpoints
hold its weights, and ``draftsmith xvocab`` saves the best one as a model dir with its tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoTokenizer

from draftsmith import targets
from draftsmith.core.target import load_causal_lm, model_dir
from draftsmith.errors import DraftsmithError
from draftsmith.layers.module import DrafterModule, OptimConfig

Aligned = list[tuple[int, list[int], list[float]]]
"""A row's token-level targets: (position whose draft logits predict the aligned token, indices into the shared
vocabulary, the target's renormalised probabilities of them)."""


@dataclass
class DraftRow:
    """One generated row in the draft's vocabulary."""

    ids: list[int]
    prompt_len: int
    aligned: Aligned = field(default_factory=list)
    """Token-level targets (``Aligned``), filled by ``families.xvocab.train.token_targets``."""


def collate_rows(rows: list[DraftRow]) -> dict:
    """Right-padded (B, T) ``input_ids``, ``attention_mask`` and ``labels`` (-100 on prompts and padding), and each
    row's ``aligned`` targets."""
    width = max(len(r.ids) for r in rows)
    ids = torch.tensor([r.ids + [0] * (width - len(r.ids)) for r in rows])
    mask = torch.tensor([[1] * len(r.ids) + [0] * (width - len(r.ids)) for r in rows])
    labels = ids.masked_fill(mask == 0, -100)
    for b, r in enumerate(rows):
        labels[b, : r.prompt_len] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "aligned": [r.aligned for r in rows]}


def token_loss(logits: torch.Tensor, aligned: list[Aligned], shared_draft: torch.Tensor) -> torch.Tensor | None:
    """Cross-entropy of the draft's distribution over the shared tokens against the target's, at the batch's aligned
    positions (the KL up to the target's entropy, a constant); None when the batch has none.

    Args:
        logits: (B, T, V) the draft LM's logits.
        aligned: per row, its token-level targets.
        shared_draft: (S,) the shared tokens' draft ids.
    """
    rows = [(b, d, i, p) for b, row in enumerate(aligned) for d, i, p in row if d < logits.shape[1]]
    if not rows:
        return None
    picked = logits[[b for b, *_ in rows], [d for _, d, *_ in rows]][:, shared_draft]  # (A, S)
    log_q = torch.log_softmax(picked.float(), -1)
    index = torch.tensor([i for *_, i, _ in rows], device=logits.device)  # (A, TOP_K)
    p = torch.tensor([p for *_, p in rows], device=logits.device)  # (A, TOP_K)
    return -(p * log_q.gather(1, index)).sum(-1).mean()


class XVocabModule(DrafterModule):
    """A draft LM with its own tokenizer distilled to a frozen target (``configs/xvocab.yaml``).

    Args:
        target: ``default``, ``smollm2`` or a local HF model dir: whose text the data holds and whose distributions
            the token-level loss reads.
        draft: the draft LM's HF directory (its own tokenizer inside), or ``default`` (the embedded LM).
        token_weight: weight of the token-level loss (0: sequence-level only).
        optim: optimizer and schedule.
    """

    def __init__(
        self, target: str, draft: str = "default", token_weight: float = 0.0, optim: OptimConfig | None = None
    ) -> None:
        if token_weight < 0:
            raise DraftsmithError(f"model.token_weight must be at least 0, got {token_weight}")
        self.draft_path = model_dir(targets.resolve(draft) if draft == "default" else Path(draft), "draft model")
        super().__init__(target, optim)
        self.save_hyperparameters()
        self.tokenizer = AutoTokenizer.from_pretrained(self.draft_path)
        self.token_weight = token_weight
        self.shared_draft: torch.Tensor | None = None
        self.record: dict = {}
        """What the data module reported (rows, shared vocabulary, aligned share), and the training losses."""
        self.history: dict[str, list[float]] = {"sequence": [], "token": []}

    def build_drafter(self) -> torch.nn.Module:
        return load_causal_lm(self.draft_path, "float32", "cpu", "draft model").train()  # loaded in eval mode

    def setup(self, stage: str) -> None:
        super().setup(stage)
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        if datamodule is not None and not self.record:  # the rows are made once
            self.record = datamodule.encode(self.target, self.tokenizer, self.token_weight > 0)
            shared = self.record.pop("shared_draft", None)
            self.shared_draft = torch.tensor(shared, device=self.device) if shared is not None else None

    def losses(self, batch: dict, out=None) -> dict[str, torch.Tensor]:
        output = self.drafter(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
        )
        losses = {"sequence": output.loss}
        tl = token_loss(output.logits, batch["aligned"], self.shared_draft) if self.shared_draft is not None else None
        if tl is not None:
            losses["token"] = tl
        losses["loss"] = output.loss + self.token_weight * tl if tl is not None else output.loss
        return losses

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        losses = self.losses(batch)
        for name in self.history:
            if name in losses:
                self.history[name].append(float(losses[name]))
        self.log_dict({f"train/{k}": v for k, v in losses.items()}, prog_bar=True, batch_size=len(batch["input_ids"]))
        return losses["loss"]

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        losses = self.losses(batch)
        self.log_dict({f"val/{k}": v for k, v in losses.items()}, batch_size=len(batch["input_ids"]), sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        """Validation logs the losses only (no τ estimate across vocabularies; the recipe keeps the best
        ``val/loss``)."""

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["draftsmith"] = {"method": "xvocab", "draft": str(self.draft_path), "data": self.record,
                                    "history": self.history}  # fmt: skip

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.history = checkpoint["draftsmith"]["history"]  # a resumed fit keeps its first losses
