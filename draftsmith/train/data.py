"""LightningDataModule over the datasets written by ``draftsmith generate``."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, DistributedSampler

from draftsmith.errors import DraftsmithError


class LengthBucketSampler(DistributedSampler):
    """Shuffled order in which each run of ``batch_size`` indices has similar lengths (less padding).

    It is its own distributed sampler (rank r takes every world-th batch), so Lightning keeps it
    under DDP and calls ``set_epoch``; and it can resume in the middle of an epoch (``resume_at``).
    """

    def __init__(
        self,
        lengths: list[int],
        batch_size: int,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        bucket_batches: int = 16,
    ) -> None:
        super().__init__(lengths, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.lengths, self.batch_size, self.bucket = lengths, batch_size, bucket_batches
        self.resume_at: tuple[int, int] | None = None
        """(epoch, batches already trained in it): the next iteration of that epoch skips them."""

    def batches(self) -> list[list[int]]:
        """This rank's batches of the current epoch."""
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=g).tolist()
        chunk = self.batch_size * self.bucket
        full, partial = [], []
        for i in range(0, len(order), chunk):
            part = sorted(order[i : i + chunk], key=lambda j: self.lengths[j])
            for b in range(0, len(part), self.batch_size):
                (full if len(part[b:]) >= self.batch_size else partial).append(part[b : b + self.batch_size])
        batches = [full[b] for b in torch.randperm(len(full), generator=g).tolist()] + partial
        return self.this_rank(batches)

    def this_rank(self, batches: list) -> list:
        """This rank's share of the epoch's ``batches``: every rank gets as many (as DistributedSampler pads)."""
        if len(batches) % self.num_replicas:
            batches += batches[: self.num_replicas - len(batches) % self.num_replicas]
        return batches[self.rank :: self.num_replicas]

    def remaining(self) -> list:
        """This epoch's batches still to train: after ``resume_at``'s when resuming that epoch (then cleared)."""
        batches = self.batches()
        if self.resume_at is not None and self.resume_at[0] == self.epoch:
            batches = batches[self.resume_at[1] :]
            self.resume_at = None
        return batches

    def __len__(self) -> int:
        return sum(len(b) for b in self.batches())

    def __iter__(self):
        for batch in self.remaining():
            yield from batch


def pack_first_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: the indices of ``lengths`` laid into rows of at most ``capacity`` tokens (the longest
    first, each into the first row with room; SpecForge's and speculators' packing). Each length must be at most
    ``capacity``."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        n = lengths[i]
        for r, free in enumerate(room):
            if n <= free:
                rows[r].append(i)
                room[r] -= n
                break
        else:
            rows.append([i])
            room.append(capacity - n)
    return rows


class PackedBatchSampler(LengthBucketSampler):
    """Packed batches: each element is one batch, a tuple of ``rows_per_batch`` rows, each a tuple of the dataset
    indices of the documents laid end to end in it (at most ``capacity`` tokens a row).

    Per epoch: a seeded shuffle, then first-fit decreasing (``pack_first_fit``) over chunks of
    ``bucket_batches`` batches' worth of documents, then the rows shuffled and grouped. Distributed and resumable as
    ``LengthBucketSampler`` (whose ``resume_at`` counts batches here as there).
    """

    def __init__(
        self,
        lengths: list[int],
        capacity: int,
        rows_per_batch: int,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        bucket_batches: int = 16,
    ) -> None:
        super().__init__(lengths, rows_per_batch, seed, num_replicas, rank, bucket_batches)
        self.capacity = capacity
        self.lengths = [min(n, capacity) for n in lengths]  # rows are truncated to the capacity (max_length)

    def batches(self) -> list[tuple[tuple[int, ...], ...]]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=g).tolist()
        mean = max(1, sum(self.lengths) // max(1, len(self.lengths)))
        chunk = max(1, self.bucket * self.batch_size * self.capacity // mean)  # documents of ~bucket batches
        rows = []
        for i in range(0, len(order), chunk):
            part = order[i : i + chunk]
            rows += [
                tuple(part[j] for j in row) for row in pack_first_fit([self.lengths[j] for j in part], self.capacity)
            ]
        rows = [rows[r] for r in torch.randperm(len(rows), generator=g).tolist()]
        batches = [tuple(rows[b : b + self.batch_size]) for b in range(0, len(rows), self.batch_size)]
        return self.this_rank(batches)

    def __len__(self) -> int:
        return len(self.batches())

    def __iter__(self):
        yield from self.remaining()


class PackedRows(torch.utils.data.Dataset):
    """``ds`` read a packed batch at a time: ``PackedRows(ds)[rows]`` is, per row of ``rows`` (a
    ``PackedBatchSampler`` batch), the list of its documents' dataset rows."""

    def __init__(self, ds) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, rows) -> list[list[dict]]:
        docs = [int(i) for row in rows for i in row]
        batched = getattr(self.ds, "__getitems__", None)  # datasets.Dataset's, CachedRows': the batch in one read
        read = iter(batched(docs) if batched else [self.ds[i] for i in docs])
        return [[next(read) for _ in row] for row in rows]


class ResumesMidEpoch:
    """A LightningDataModule whose checkpoints record how far into the epoch training got, and whose next train
    sampler (``train_sampler``) skips those batches: a fit resumed from a mid-epoch checkpoint trains on the batches
    an uninterrupted one would (Lightning alone restarts the epoch's order, repeating the batches already seen)."""

    _resume_at: tuple[int, int] | None = None

    def train_sampler(
        self, lengths: list[int], batch_size: int, seed: int, pack_to: int | None = None
    ) -> LengthBucketSampler:
        """``pack_to``: a ``PackedBatchSampler`` of ``batch_size`` rows of at most ``pack_to`` tokens."""
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)
        if pack_to is not None:
            sampler = PackedBatchSampler(lengths, pack_to, batch_size, seed, world, rank)
        else:
            sampler = LengthBucketSampler(lengths, batch_size, seed, world, rank)
        sampler.resume_at = self._resume_at
        return sampler

    def state_dict(self) -> dict:
        if not self.trainer:
            return {}
        progress = self.trainer.fit_loop.epoch_loop.batch_progress.current
        return {"epoch": self.trainer.current_epoch, "batches": progress.processed}

    def load_state_dict(self, state: dict) -> None:
        if state:
            self._resume_at = (state["epoch"], state["batches"])


def collate(rows: list[dict], max_length: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of dataset rows to (B, T) tensors.

    Rows with stored target top-k log-probabilities (``generate --store-topk K``) also give
    ``topk_ids`` / ``topk_logprobs`` (B, T, K), set on the positions whose logits predict each
    generated token (position prompt_len + i - 1 for generated token i), zero elsewhere.
    """
    topk = _collate_topk(rows, max_length) if rows and all(r.get("topk_ids") for r in rows) else {}
    hidden = _collate_hidden(rows, max_length) if rows and "hidden" in rows[0] else {}
    rows = [{k: r[k][:max_length] for k in ("input_ids", "loss_mask")} for r in rows]
    t = max(len(r["input_ids"]) for r in rows)
    out = {
        "input_ids": torch.zeros(len(rows), t, dtype=torch.long),
        "loss_mask": torch.zeros(len(rows), t, dtype=torch.long),
        "attention_mask": torch.zeros(len(rows), t, dtype=torch.long),
    }
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        out["input_ids"][i, :n] = torch.tensor(r["input_ids"])
        out["loss_mask"][i, :n] = torch.tensor(r["loss_mask"])
        out["attention_mask"][i, :n] = 1
    if topk:
        t = out["input_ids"].shape[1]
        out.update({name: v[:, :t] for name, v in topk.items()})
    if hidden:
        out["hidden"] = hidden
    return out


def collate_packed(rows: list[list[dict]], max_length: int) -> dict[str, torch.Tensor]:
    """Packed rows to (R, T) tensors: each row's documents (dataset rows, each truncated to ``max_length``) end to end,
    right-padded to the longest row.

    Beside ``collate``'s keys: ``doc_ids`` (R, T), the document of each token within its row (1, 2, ...; 0 on
    padding), and ``position_ids`` (R, T), each document's positions from 0 (padding continues from its row's last).
    Nothing attends across documents and no label crosses one: the families that train on packed batches read both
    (``layers.attention.document_mask``, EAGLE's ``ttt_mask`` and ``unroll``). ``hidden`` (cached features) and the
    stored top-k are each document's own, laid out the same way.
    """
    # each document's tokens collated alone; its cached hidden states (views into the cache) are copied once, below
    docs = [[collate([{k: v for k, v in d.items() if k != "hidden"}], max_length) for d in row] for row in rows]
    t = max(sum(d["input_ids"].shape[1] for d in row) for row in docs)
    r = len(docs)
    out = {k: torch.zeros(r, t, dtype=torch.long) for k in ("input_ids", "loss_mask", "attention_mask", "doc_ids")}
    out["position_ids"] = torch.zeros(r, t, dtype=torch.long)
    first = docs[0][0]
    topk = {
        k: torch.zeros((r, t, *first[k].shape[2:]), dtype=first[k].dtype)
        for k in ("topk_ids", "topk_logprobs")
        if k in first
    }
    states = rows[0][0].get("hidden", {})
    hidden = {layer: torch.zeros(r, t, h.shape[-1], dtype=h.dtype) for layer, h in states.items()}
    for i, row in enumerate(docs):
        at = 0
        for doc, (d, raw) in enumerate(zip(row, rows[i], strict=True), start=1):
            n = d["input_ids"].shape[1]
            span = slice(at, at + n)
            for k in ("input_ids", "loss_mask", "attention_mask"):
                out[k][i, span] = d[k][0]
            out["doc_ids"][i, span] = doc
            out["position_ids"][i, span] = torch.arange(n)
            for k, v in topk.items():
                v[i, span] = d[k][0, :n]
            for layer, v in hidden.items():
                v[i, span] = raw["hidden"][layer][:n]
            at += n
        out["position_ids"][i, at:] = torch.arange(t - at) + (out["position_ids"][i, at - 1] + 1 if at else 0)
    out.update(topk)
    if hidden:
        out["hidden"] = hidden
    return out


def _collate_hidden(rows: list[dict], max_length: int) -> dict[int, torch.Tensor]:
    """Cached target hidden states (``FeatureCache``), layer -> (B, T, H) right-padded with zeros."""
    out = {}
    for layer in rows[0]["hidden"]:
        states = [r["hidden"][layer][:max_length] for r in rows]
        out[layer] = torch.nn.utils.rnn.pad_sequence(states, batch_first=True)
    return out


def generated_token_counts(ds, vocab_size: int) -> torch.Tensor:
    """(V,) int64: how often each token appears on the generated (``loss_mask`` = 1) positions of a generated dataset's
    rows (exact integers: float32 counts stop counting at 2**24 occurrences of a frequent token)."""
    rows = ds.select_columns(["input_ids", "loss_mask"])
    return count_generated(((row["input_ids"], row["loss_mask"]) for row in rows), vocab_size)


def count_generated(rows, vocab_size: int) -> torch.Tensor:
    """(V,) int64 counts of the tokens on the ``loss_mask`` = 1 positions of ``rows``, pairs (input_ids, loss_mask)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in rows:
        ids, mask = torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(mask).bool()
        counts += torch.bincount(ids[mask], minlength=vocab_size)
    return counts


def generated_prefix(loss_masks, size: int) -> tuple[int, int]:
    """(rows, generated tokens) of the shortest prefix of rows whose ``loss_mask`` columns hold ``size`` generated
    tokens (all the rows when they hold fewer): the data of a fit at a data budget, one rule for every caller."""
    rows = total = 0
    for mask in loss_masks:
        rows, total = rows + 1, total + int(torch.as_tensor(mask).sum())
        if total >= size:
            break
    return rows, total


class CachedRows(torch.utils.data.Dataset):
    """Dataset rows with their cached target hidden states (``hidden``: layer -> (n, H))."""

    def __init__(self, ds, cache) -> None:
        self.ds, self.cache = ds, cache

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict:
        return {**self.ds[int(i)], "hidden": self.cache.row(int(i))}

    def __getitems__(self, indices: list[int]) -> list[dict]:
        """The rows ``indices``, as ``__getitem__`` gives each, read in one call to the dataset and one to the cache
        (torch's DataLoader calls it for a batch; a datasets.Dataset reads a batch's rows from arrow at once)."""
        indices = [int(i) for i in indices]
        columns = self.ds[indices]  # column -> its values over the rows
        hidden = self.cache.rows(indices)
        return [{**{k: v[j] for k, v in columns.items()}, "hidden": h} for j, h in enumerate(hidden)]


def _collate_topk(rows: list[dict], max_length: int) -> dict[str, torch.Tensor]:
    k = len(rows[0]["topk_ids"][0])
    ids = torch.zeros(len(rows), max_length, k, dtype=torch.long)
    logprobs = torch.zeros(len(rows), max_length, k)
    for i, r in enumerate(rows):
        start = r["prompt_len"] - 1  # the position whose logits predict the first generated token
        n = max(0, min(len(r["topk_ids"]), max_length - 1 - start))
        ids[i, start : start + n] = torch.tensor(r["topk_ids"][:n], dtype=torch.long)
        logprobs[i, start : start + n] = torch.tensor(r["topk_logprobs"][:n])
    return {"topk_ids": ids, "topk_logprobs": logprobs}


class GeneratedDataModule(ResumesMidEpoch, L.LightningDataModule):
    """Train / validation data from ``draftsmith generate`` output directories.

    Args:
        train: generated data dir for training.
        val: generated data dir for validation (greedy generations on held-out prompts make
            ``val/tau_est`` comparable to the verifier's τ); None to hold out ``val_fraction`` of train.
        val_fraction: share of train rows held out when ``val`` is None.
        batch_size: sequences per batch (per process).
        max_length: sequences are truncated to this many tokens.
        num_workers: DataLoader workers.
        seed: seed of the bucketed shuffling and the split.
        features: a feature cache of ``train`` (``draftsmith.data.feature_cache``): training steps read the
            target's hidden states from it instead of running the target (validation still runs it).
        train_rows: train on the first N rows of ``train`` only (nested subsets of one dataset, which its feature
            cache still serves); None: all.
        pack: training batches of packed rows (``collate_packed``): documents laid end to end in rows of
            ``max_length`` tokens by first-fit decreasing, attending and predicting within their own document only,
            instead of one right-padded document a row. Validation stays one document a row (``val/tau_est``
            replays whole sequences). Families that train on packed batches: EAGLE-1 / EAGLE-3
            (``DrafterModule.packs``); others refuse it in one line.
        tokens_per_batch: with ``pack``, the token budget of a step: ``tokens_per_batch // max_length`` rows of
            ``max_length`` (None: ``batch_size`` rows).
    """

    def __init__(
        self,
        train: str,
        val: str | None = None,
        val_fraction: float = 0.05,
        batch_size: int = 8,
        max_length: int = 512,
        num_workers: int = 0,
        seed: int = 0,
        features: str | None = None,
        train_rows: int | None = None,
        pack: bool = False,
        tokens_per_batch: int | None = None,
    ) -> None:
        super().__init__()
        if tokens_per_batch is not None and tokens_per_batch < max_length:
            raise DraftsmithError(
                f"data.tokens_per_batch: {tokens_per_batch} is less than one row of max_length {max_length}"
            )
        self.save_hyperparameters()
        self.train_ds = self.val_ds = None
        self.cache = None
        self.metadata: dict = {}

    def _load(self, path: str):
        from draftsmith.data.generate import load_generated

        if not Path(path).exists():
            raise DraftsmithError(f"data: {path} does not exist (make it with `draftsmith generate`)")
        return load_generated(path)

    def setup(self, stage: str | None = None) -> None:
        if self.train_ds is not None:
            return
        train, self.metadata = self._load(self.hparams.train)
        if self.hparams.train_rows is not None:
            if not 0 < self.hparams.train_rows <= len(train):
                raise DraftsmithError(
                    f"data.train_rows: {self.hparams.train_rows} is not in 1..{len(train)} (the rows of {self.hparams.train})"
                )
            train = train.select(range(self.hparams.train_rows))
        if self.hparams.val:
            self.val_ds, self.val_metadata = self._load(self.hparams.val)
            self.train_ds = train
        else:
            if self.hparams.features:
                raise DraftsmithError("data.features needs data.val (the cache covers every row of data.train)")
            split = train.train_test_split(test_size=self.hparams.val_fraction, seed=self.hparams.seed)
            self.train_ds, self.val_ds, self.val_metadata = split["train"], split["test"], self.metadata
        if self.hparams.features:
            from draftsmith.data.feature_cache import FeatureCache

            self.cache = FeatureCache(self.hparams.features)

    def check_target(self, target) -> None:
        """Refuse data generated by another target, naming both fingerprints (and a feature cache made for
        another target or data, or lacking the target's feature layers)."""
        from draftsmith.data.generate import check_dataset_target

        self.setup()
        check_dataset_target(self.metadata, target)
        check_dataset_target(self.val_metadata, target)
        if self.cache is not None:
            layers = (*target.feature_layers, target.num_layers)
            self.cache.check(target, self.metadata, layers, self.hparams.max_length, len(self.train_ds))

    def token_counts(self, vocab_size: int) -> torch.Tensor:
        """How often each token appears on generated (loss_mask = 1) positions of the training data."""
        self.setup()
        return generated_token_counts(self.train_ds, vocab_size)

    @property
    def packed_rows(self) -> int | None:
        """Rows of a packed training batch; None when training batches are not packed."""
        hp = self.hparams
        if not hp.pack:
            return None
        return hp.batch_size if hp.tokens_per_batch is None else hp.tokens_per_batch // hp.max_length

    def _loader(self, ds, shuffle: bool) -> DataLoader:
        hp = self.hparams
        loading = {
            "num_workers": hp.num_workers,
            "persistent_workers": hp.num_workers > 0,
            "pin_memory": self._to_cuda(),  # page-locked host batches copy to a GPU asynchronously
        }
        lengths = [len(x) for x in ds["input_ids"]] if shuffle else None
        if shuffle and self.cache is not None:
            ds = CachedRows(ds, self.cache)
        if shuffle and hp.pack:
            sampler = self.train_sampler(lengths, self.packed_rows, hp.seed, pack_to=hp.max_length)
            collate_fn = partial(collate_packed, max_length=hp.max_length)
            return DataLoader(PackedRows(ds), batch_size=None, sampler=sampler, collate_fn=collate_fn, **loading)
        sampler = self.train_sampler(lengths, hp.batch_size, hp.seed) if shuffle else None
        collate_fn = partial(collate, max_length=hp.max_length)
        return DataLoader(ds, batch_size=hp.batch_size, sampler=sampler, collate_fn=collate_fn, **loading)

    def _to_cuda(self) -> bool:
        """Whether the batches go to a CUDA device (pinned memory helps there only)."""
        return self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_ds, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_ds, shuffle=False)
