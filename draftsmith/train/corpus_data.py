"""``CorpusDataModule``: plain-text pre-training data for a draft LM (FastDraft's first stage).

The default target's own corpus (the Python standard library's source, ``data/corpus.py``) tokenized
with the target's tokenizer and packed into fixed-length blocks, the way ``default_target`` trained
the target. Validation runs on a ``draftsmith generate`` dir when given (so ``val/tau_est`` measures
acceptance on the target's own text) or else on blocks of the held-out files.
"""

from __future__ import annotations

from functools import partial

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from draftsmith.errors import DraftsmithError
from draftsmith.train.data import ResumesMidEpoch


def _block_batch(rows: list[tuple[torch.Tensor]]) -> dict[str, torch.Tensor]:
    ids = torch.stack([r[0] for r in rows])  # (B, seq_len)
    ones = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": ones, "loss_mask": ones}


class CorpusDataModule(ResumesMidEpoch, L.LightningDataModule):
    """Blocks of corpus text for pre-training; every token is a training target (loss_mask = 1).

    Args:
        tokenizer: the target's model dir (``default``: the embedded default target), whose tokenizer
            encodes the corpus.
        val: a ``draftsmith generate`` dir to validate on (greedy held-out continuations); None: held-out
            corpus blocks.
        seq_len: tokens per block.
        max_tokens: training tokens to tokenize (the corpus is cut there; files in a seeded order).
        val_tokens: held-out tokens to validate on when ``val`` is None.
        heldout_percent: share of corpus files held out (the default target's split: 5).
        batch_size: blocks per batch (per process).
        max_length: ``val`` sequences are truncated to this many tokens.
        seed: seeds the file order and the shuffling (an interrupted fit resumes mid-epoch exactly).
    """

    def __init__(
        self,
        tokenizer: str = "default",
        val: str | None = None,
        seq_len: int = 128,
        max_tokens: int = 1_000_000,
        val_tokens: int = 16384,
        heldout_percent: int = 5,
        batch_size: int = 16,
        max_length: int = 512,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.train_ds = self.val_ds = None
        self.val_metadata: dict | None = None
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            from draftsmith import targets

            path = targets.resolve(self.hparams.tokenizer)
            if not (path / "tokenizer_config.json").is_file():
                raise DraftsmithError(f"data.tokenizer: {path} has no tokenizer (tokenizer_config.json)")
            self._tokenizer = AutoTokenizer.from_pretrained(path)
        return self._tokenizer

    def setup(self, stage: str | None = None) -> None:
        if self.train_ds is not None:
            return
        from draftsmith.targets import corpus
        from draftsmith.targets.default import token_blocks

        hp = self.hparams
        train_files, heldout_files = corpus.split(hp.heldout_percent)
        self.train_ds = TensorDataset(token_blocks(train_files, self.tokenizer, hp.seq_len, hp.max_tokens, hp.seed))
        if hp.val:
            from draftsmith.data.generate import load_generated

            self.val_ds, self.val_metadata = load_generated(hp.val)
        else:
            blocks = token_blocks(heldout_files, self.tokenizer, hp.seq_len, hp.val_tokens, hp.seed)
            self.val_ds = TensorDataset(blocks)

    def check_target(self, target) -> None:
        """Refuse a target whose tokenizer is not the one the corpus is encoded with (or another target's
        validation data)."""
        from draftsmith.core.fingerprint import tokenizer_hash
        from draftsmith.data.generate import check_dataset_target

        self.setup()
        mine, theirs = tokenizer_hash(self.tokenizer), target.fingerprint["tokenizer_hash"]
        if mine != theirs:
            raise DraftsmithError(
                f"data.tokenizer {self.hparams.tokenizer!r} (tokenizer {mine}) is not the tokenizer of target "
                f"{target.name!r} ({theirs})"
            )
        if self.val_metadata is not None:
            check_dataset_target(self.val_metadata, target)

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        sampler = self.train_sampler([hp.seq_len] * len(self.train_ds), hp.batch_size, hp.seed)
        return DataLoader(self.train_ds, batch_size=hp.batch_size, sampler=sampler, collate_fn=_block_batch)

    def val_dataloader(self) -> DataLoader:
        if self.val_metadata is None:
            return DataLoader(self.val_ds, batch_size=self.hparams.batch_size, collate_fn=_block_batch)
        from draftsmith.train.data import collate

        return DataLoader(
            self.val_ds,
            batch_size=self.hparams.batch_size,
            collate_fn=partial(collate, max_length=self.hparams.max_length),
        )
