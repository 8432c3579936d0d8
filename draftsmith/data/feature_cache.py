"""An optional offline cache of the target's hidden states over a generated dataset.

Training online runs the frozen target in every step, so training several families (or several epochs) on
one dataset repeats the same target forward each time; on a 30-layer target that forward is most of a
one-layer drafter's training step. ``cache_features`` runs it once and keeps the chosen layers' hidden
states plus the final normed one (the target's logits are its LM head on that state, recomputed in the
step) in fp16 / bf16 safetensors shards beside the data. ``fit --data.features DIR`` then trains from it.

Layout of a cache dir::

    features.json          target fingerprint, data identity, layers, dtype, max_length, rows, status
    shard-00000.safetensors
                           ``hidden_<layer>`` (tokens, H) per layer, ``lengths`` (rows,): rows in data order,
                           each truncated to ``max_length``

Shards are written under a temporary name and renamed, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from draftsmith.core.dtypes import canonical_dtype
from draftsmith.core.files import write_whole
from draftsmith.errors import DraftsmithError
from draftsmith.targets import AUTO, ResolvedTarget, load_target

FORMAT = "draftsmith.features/1"
META = "features.json"
DTYPES = ("float16", "bfloat16")


def data_identity(metadata: dict) -> str:
    """A hash of what decides a generated dataset's rows (its settings, counts and target)."""
    keys = {k: metadata.get(k) for k in ("settings", "target", "counts")}
    if "snapshot" in metadata:  # the leading shards of an unfinished run (shards.snapshot): other rows
        keys["snapshot"] = metadata["snapshot"]
    return hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_features(
    target: ResolvedTarget,
    data: str | Path,
    layers: list[int],
    out: str | Path | None = None,
    dtype: str | None = None,
    max_length: int = 512,
    batch_size: int = 8,
    shard_rows: int = 64,
    overwrite: bool = False,
    rows: int | None = None,
    device: str = "cpu",
) -> Path:
    """Cache the target's hidden states ``layers`` (HF ``hidden_states`` indices; the final normed state is always
    added) over every row of the generated dataset ``data`` (or its first ``rows``); resumes an unfinished cache at
    ``out``, and grows a prefix cache of the same settings to a longer prefix without recomputing its shards.

    Args:
        target: the target that generated ``data`` (a local dir, ``default`` or ``smollm2``), in the dtype the data
            was generated in unless a ``:DTYPE`` suffix says otherwise (from Python a ``targets.ResolvedTarget``:
            ``draftsmith.cli`` resolves it once).
        data: a ``draftsmith generate`` output dir.
        layers: hidden-state indices the drafters to train need (EAGLE-3: its three; EAGLE-1/Medusa/Hydra: the last).
        out: the cache dir (default: ``<data>-features``).
        dtype: storage dtype, float16 or bfloat16 (default: the target's when it computes in one of them, else
            bfloat16, which holds float32's range: the residual stream of LLMs has massive activations, SmolLM2's
            22,280, a third of float16's largest number; a float16 cache refuses values beyond it).
        max_length: rows are truncated to this many tokens (train with ``--data.max_length`` at most this).
        batch_size: rows per target forward.
        shard_rows: rows per shard file.
        overwrite: replace a cache of other settings at ``out`` instead of refusing it.
        rows: cache the first ``rows`` rows only, rounded up to whole shards (fits on the first rows of a corpus,
            ``data.train_rows``, read no others); None: every row. A cache that already holds at least as many rows
            of the same data and settings is kept as it is.
        device: where the target runs: ``cpu``, ``cuda``, ``cuda:N`` (the cache is stored on the CPU either way).
    """
    from draftsmith.data.shards import check_dataset_target, generated_dir, load_generated

    dtype = canonical_dtype(dtype, "features: dtype", DTYPES) if dtype is not None else None
    ds, metadata = load_generated(data)
    if target.spec.dtype == AUTO:  # named with no dtype: the one the data was generated in
        target = replace(target, dtype=metadata["target"].get("dtype", "float32"))
    t = load_target(target, device=device, batch_invariant=False)  # whole sequences: the fastest kernels
    dtype = dtype or (t.dtype if t.dtype in DTYPES else "bfloat16")
    check_dataset_target(metadata, t, f"generated dataset {data}")
    resolved = sorted({*t._check_layers(tuple(layers)), t.num_layers})
    out = Path(out or f"{str(generated_dir(data)).rstrip('/')}-features")  # a packed corpus: beside its unpacking
    if rows is not None and rows < 1:
        raise DraftsmithError(f"features: rows must be positive, got {rows}")
    cached = len(ds) if rows is None else min(len(ds), -(-rows // shard_rows) * shard_rows)
    record = {
        "format": FORMAT,
        "target": t.fingerprint,
        "data": str(data),
        "data_identity": data_identity(metadata),
        "layers": resolved,
        "dtype": dtype,
        "max_length": max_length,
        "rows": cached,
        "shard_rows": shard_rows,
    }
    old = _read_meta(out)
    # the rows are told by data_identity, not by the path the data was reached by (moved, copied, a symlink)
    unsettled = ("status", "seconds", "rows", "data")
    settings = {k: v for k, v in (old or {}).items() if k not in unsettled}
    if old is not None and settings != {k: v for k, v in record.items() if k not in unsettled}:
        if not overwrite:
            raise DraftsmithError(f"features: {out} holds a cache of other settings; pass --overwrite or another --out")
        shutil.rmtree(out)
        old = None
    if old is not None and old.get("status") == "complete" and old["rows"] >= cached:
        return out  # the same rows or a longer prefix of them
    # its shards are of the same rows (shards of shard_rows from row 0): a longer prefix keeps them, a shorter
    # unfinished one drops those past its end (a complete cache is read shard by shard, every shard on disk)
    out.mkdir(parents=True, exist_ok=True)
    kept = {_shard_name(s // shard_rows) for s in range(0, cached, shard_rows)}
    for path in out.glob("shard-*.safetensors"):
        if path.name not in kept:
            path.unlink()
    ds = ds.select(range(cached)) if cached < len(ds) else ds
    tokens = sum(min(n, max_length) for n in map(len, ds["input_ids"]))
    need = tokens * len(resolved) * t.config.get_text_config(decoder=True).hidden_size * getattr(torch, dtype).itemsize
    free = shutil.disk_usage(out).free
    print(
        f"features: {tokens:,} tokens x {len(resolved)} layers in {dtype} = {need / 1e9:.2f} GB in {out} "
        f"({free / 1e9:.0f} GB free)"
    )
    if need > free + sum(p.stat().st_size for p in out.glob("shard-*.safetensors")):
        raise DraftsmithError(f"features: {out} needs {need / 1e9:.1f} GB, its disk has {free / 1e9:.1f} GB free")
    _write_meta(out, {**record, "status": "running"})
    started = time.perf_counter()
    store = getattr(torch, dtype)
    shards = range(0, len(ds), shard_rows)
    for s in tqdm(shards, desc="features", unit="shard"):
        path = out / _shard_name(s // shard_rows)
        if path.is_file():
            continue
        rows = [ids[:max_length] for ids in ds[s : s + shard_rows]["input_ids"]]
        hidden = {layer: [None] * len(rows) for layer in resolved}
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))  # batches of similar lengths: less padding
        for b in range(0, len(rows), batch_size):
            index = order[b : b + batch_size]
            batch = [rows[i] for i in index]
            width = max(len(r) for r in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            for i, r in enumerate(batch):
                ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
            res = t(ids, attention_mask=mask, feature_layers=tuple(resolved), last_logits_only=True)
            for layer, f in zip(resolved, res.features, strict=True):
                if store == torch.float16 and f.abs().max() > torch.finfo(torch.float16).max:
                    raise DraftsmithError(
                        f"features: layer {layer} holds values up to {f.abs().max().item():,.0f}, beyond float16's "
                        "range; cache in bfloat16"
                    )
                for j, i in enumerate(index):
                    hidden[layer][i] = f[j, : len(rows[i])].to("cpu", store)
        tensors = {f"hidden_{layer}": torch.cat(hs).contiguous() for layer, hs in hidden.items()}
        tensors["lengths"] = torch.tensor([len(r) for r in rows])
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp))
        os.replace(tmp, path)
    _write_meta(out, {**record, "status": "complete", "seconds": round(time.perf_counter() - started, 1)})
    return out


def eagle3_features(
    target: ResolvedTarget, data: str | Path, max_length: int = 512, rows: int | None = None, device: str = "cpu"
) -> Path:
    """The feature cache the feature drafters train from, at ``<data>-features`` (a cache of other settings there
    replaced): EAGLE-3's three feature layers (``layers.features.default_feature_layers``) and the final normed state
    (EAGLE-1, Medusa, Hydra and Kangaroo's exit read among them) over ``data``, or its first ``rows``. The one
    call the pipeline (``train.suite.train_all``), the studies and the benchmarks make."""
    from draftsmith.layers.features import default_feature_layers

    layers = json.loads((target.path / "config.json").read_text())["num_hidden_layers"]
    chosen = list(default_feature_layers(layers, 3))
    return cache_features(target, data, chosen, max_length=max_length, overwrite=True, rows=rows, device=device)


def _shard_name(index: int) -> str:
    """The file of the cache's ``index``-th shard (rows ``index * shard_rows`` on)."""
    return f"shard-{index:05d}.safetensors"


def _read_meta(out: Path) -> dict | None:
    path = out / META
    return json.loads(path.read_text()) if path.is_file() else None


def _write_meta(out: Path, data: dict) -> None:
    write_whole(out / META, json.dumps(data, indent=2) + "\n")


class FeatureCache:
    """A complete cache, loaded into memory: ``row(i)`` gives row ``i``'s hidden states per cached layer,
    ``rows(indices)`` a batch's."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        meta = _read_meta(path)
        if meta is None:
            raise DraftsmithError(f"features: {path} is not a feature cache (no {META}); make one with cache_features")
        if meta.get("status") != "complete":
            raise DraftsmithError(f"features: {path} is unfinished; run cache_features again to resume it")
        self.path, self.meta, self.layers = path, meta, tuple(meta["layers"])
        # shards stay separate tensors (concatenating them would need the cache's size twice in memory)
        self.parts = [load_file(str(p)) for p in sorted(path.glob("shard-*.safetensors"))]
        rows = sum(len(p["lengths"]) for p in self.parts)
        if rows != meta["rows"]:
            raise DraftsmithError(f"features: {path} has {rows} rows, its {META} says {meta['rows']}")
        self.where = [(s, int(a), int(b)) for s, p in enumerate(self.parts) for a, b in _spans(p["lengths"])]
        """Row i -> (shard, start, end) of its tokens in that shard's tensors."""

    def check(self, target, metadata: dict, layers: tuple[int, ...], max_length: int, rows: int | None = None) -> None:
        """Refuse a cache made for another target, other data, without ``layers``, shorter than ``max_length``, or
        holding fewer than the first ``rows`` rows of the data (a prefix cache)."""
        from draftsmith.core.fingerprint import check_fingerprint

        check_fingerprint(self.meta["target"], target.fingerprint, f"feature cache {self.path}")
        if self.meta["data_identity"] != data_identity(metadata):
            raise DraftsmithError(f"features: {self.path} was made from other data than {self.meta['data']}")
        missing = sorted(set(layers) - set(self.layers))
        if missing:
            raise DraftsmithError(f"features: {self.path} holds layers {list(self.layers)}, not {missing}")
        if max_length > self.meta["max_length"]:
            raise DraftsmithError(
                f"features: {self.path} holds rows truncated to {self.meta['max_length']} tokens; "
                f"train with --data.max_length {self.meta['max_length']} or less"
            )
        if rows is not None and rows > self.meta["rows"]:
            raise DraftsmithError(
                f"features: {self.path} holds the first {self.meta['rows']} rows of {self.meta['data']}, the fit "
                f"reads {rows}; cache more rows (cache_features rows=) or train on fewer (--data.train_rows)"
            )

    def row(self, i: int) -> dict[int, torch.Tensor]:
        """Row ``i``'s hidden states, layer -> (n, H)."""
        return self.rows([i])[0]

    def rows(self, indices: list[int]) -> list[dict[int, torch.Tensor]]:
        """Rows ``indices``' hidden states, each layer -> (n, H): views into the shards, nothing copied (a batch's one
        copy is its collate's padding)."""
        names = [(layer, f"hidden_{layer}") for layer in self.layers]
        out = []
        for i in indices:
            shard, a, b = self.where[int(i)]
            part = self.parts[shard]
            out.append({layer: part[name][a:b] for layer, name in names})
        return out


def _spans(lengths: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each row in a shard whose rows have ``lengths``."""
    ends = lengths.cumsum(0).tolist()
    return list(zip([0, *ends[:-1]], ends, strict=True))
