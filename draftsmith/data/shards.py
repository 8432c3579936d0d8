"""The on-disk side of ``draftsmith generate``: the out dir, its shards, ``draftsmith.json``, and reading it back.

Layout of an out dir::

    draftsmith.json          metadata: target fingerprint, settings, counts ("status": "running" | "complete")
    shards/shard-00000/      while running: one ``save_to_disk`` dataset per ``shard_size`` prompts
    data-*.arrow, state.json, dataset_info.json
                             when complete: the whole dataset (``datasets.load_from_disk(out)``); shards removed

A shard is written under a temporary name and renamed, so a shard dir that
exists is complete; ``--resume`` skips those and regenerates the rest.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from draftsmith.core.fingerprint import check_fingerprint
from draftsmith.core.target import Target
from draftsmith.data.dataset_dir import META, features, load_dir, quiet_datasets, read_metadata, write_metadata
from draftsmith.data.packed import is_packed, unpack
from draftsmith.errors import DraftsmithError

__all__ = ["META", "features", "load_generated", "quiet_datasets", "read_metadata", "write_metadata"]

SHARDS = "shards"
"""Sub-directory holding completed shards while a run is in progress."""
RANKS = "ranks"
"""Sub-directory holding one run dir per rank while ranks generate in parallel (``--world-size``)."""
SHARD_STATS = "draftsmith-shard.json"
"""Per-shard counts (rows, tokens, seconds) saved inside each shard dir."""
_DATASET_FILES = ("state.json", "dataset_info.json")


def prepare_out(out: Path, resume: bool, overwrite: bool) -> dict | None:
    """Make ``out`` ready for a run; returns the metadata of the run being resumed, if any.

    A non-empty ``out`` needs ``--resume`` (continue it) or ``--overwrite`` (delete it
    first; only a dir that ``generate`` wrote, recognised by its ``draftsmith.json``).
    """
    out = Path(out)
    if resume and overwrite:
        raise DraftsmithError("--resume and --overwrite exclude each other: continue the run or replace it")
    if out.exists() and not out.is_dir():
        raise DraftsmithError(f"--out {out} is a file, not a directory")
    if not out.exists() or not any(out.iterdir()):
        out.mkdir(parents=True, exist_ok=True)
        return None
    metadata = read_metadata(out)
    if overwrite:
        if metadata is None:
            raise DraftsmithError(
                f"--overwrite: {out} holds files that draftsmith generate did not write (no {META}); "
                "refusing to delete it"
            )
        shutil.rmtree(out)
        out.mkdir(parents=True)
        return None
    if not resume:
        raise DraftsmithError(
            f"--out {out} is not empty; pass --resume to continue that run or --overwrite to replace it"
        )
    if metadata is None:
        raise DraftsmithError(f"--resume: {out} has no {META}, so it is not a draftsmith generate run")
    return metadata


def check_resumable(previous: dict, current: dict, out: Path) -> None:
    """Refuse to resume a run made with another target, other settings or other prompts."""
    check_fingerprint(previous["target"], current["target"], f"--resume: the partial run in {out}")
    old, new = previous["settings"], current["settings"]
    diff = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if diff:
        detail = ", ".join(f"{k}={old.get(k)!r} (now {new.get(k)!r})" for k in diff)
        raise DraftsmithError(
            f"--resume: {out / META} was written with {detail}; rerun with the same settings or use --overwrite"
        )
    if previous["prompts_sha"] != current["prompts_sha"]:
        raise DraftsmithError(
            f"--resume: the prompts of {new['prompts']!r} changed since {out} was started "
            "(their token ids differ); use --overwrite to start again"
        )


def shard_dir(out: Path, index: int) -> Path:
    return Path(out) / SHARDS / f"shard-{index:05d}"


def completed_shards(out: Path) -> set[int]:
    """Indices of the shards saved in ``out``; half-written temporaries are removed."""
    root = Path(out) / SHARDS
    if not root.is_dir():
        return set()
    done = set()
    for path in root.iterdir():
        if path.name.endswith(".tmp"):
            shutil.rmtree(path)
        elif path.name.startswith("shard-") and (path / SHARD_STATS).is_file():
            done.add(int(path.name.removeprefix("shard-")))
    return done


def write_shard(out: Path, index: int, columns: dict, stats: dict, store_topk: int) -> None:
    """Save one shard atomically: to ``shard-N.tmp``, then rename."""
    from datasets import Dataset

    final = shard_dir(out, index)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    with quiet_datasets():
        Dataset.from_dict(columns, features=features(store_topk)).save_to_disk(str(tmp))
    (tmp / SHARD_STATS).write_text(json.dumps(stats))
    os.replace(tmp, final)


def shard_stats(out: Path, index: int) -> dict:
    return json.loads((shard_dir(out, index) / SHARD_STATS).read_text())


def finalize(out: Path, num_shards: int) -> None:
    """Concatenate the shards into the dataset at ``out`` and remove them."""
    from datasets import concatenate_datasets, load_from_disk

    out = Path(out)
    parts = [load_from_disk(str(shard_dir(out, i))) for i in range(num_shards)]
    data = concatenate_datasets(parts)
    tmp = out / ".data.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    with quiet_datasets():
        data.save_to_disk(str(tmp), num_shards=max(1, min(num_shards, len(data))))
    for stale in [*out.glob("data-*.arrow"), *(out / name for name in _DATASET_FILES)]:
        stale.unlink(missing_ok=True)
    # state.json last: until it is in place, out is not a loadable dataset
    for path in sorted(tmp.iterdir(), key=lambda p: p.name == "state.json"):
        os.replace(path, out / path.name)
    tmp.rmdir()


def snapshot(out: Path, dest: Path) -> Path:
    """The finished leading shards of an unfinished ``generate`` run at ``out`` as a complete dataset at ``dest``: a
    prefix of what the whole run will be (its first rows, in order), to train on while generation goes on.
    ``dest``'s metadata records ``snapshot: {of, shards, shard_size}``; its data identity differs from the whole
    run's, so caches and fits made from it are never mistaken for the whole run's. Reused when ``dest`` already
    holds a snapshot of as many shards. A finished run's snapshot is all of it (the run's shards are merged by
    then), so work begun on snapshots goes on at ``dest`` once the run is done."""
    out, dest = Path(out), Path(dest)
    metadata = read_metadata(out)
    if metadata is None:
        raise DraftsmithError(f"snapshot: {out} is not a generate run (no {META})")
    finished = metadata.get("status") == "complete"
    if finished:
        leading = metadata["shards"]
    else:
        done = completed_shards(out)
        leading = next(i for i in range(len(done) + 1) if i not in done)  # shards 0..leading-1 are all there
    if leading == 0:
        raise DraftsmithError(f"snapshot: {out} has no finished shard yet")
    previous = read_metadata(dest)
    if previous is not None and previous.get("snapshot", {}).get("shards") == leading:
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    snap = {"of": str(out), "shards": leading, "shard_size": metadata["settings"]["shard_size"]}
    if finished:
        dest.mkdir(parents=True)
        for path in [*out.glob("data-*.arrow"), *(out / name for name in _DATASET_FILES)]:
            shutil.copy2(path, dest / path.name)
        write_metadata(dest, {**metadata, "snapshot": snap})
        return dest
    (dest / SHARDS).mkdir(parents=True)
    for i in range(leading):
        shutil.copytree(shard_dir(out, i), shard_dir(dest, i))
    finalize(dest, leading)
    counts = totals(dest, leading)
    remove_shards(dest)
    write_metadata(dest, {**metadata, "status": "complete", **counts, "snapshot": snap})
    return dest


def totals(out: Path, num_shards: int) -> dict:
    """The counts of shards ``0..num_shards-1`` summed (rows, prompt and generated tokens, stops at EOS), their
    generation seconds and tokens/s: what a finished run's ``draftsmith.json`` records."""
    sums = {k: 0 for k in ("rows", "prompt_tokens", "generated_tokens", "stopped_at_eos", "seconds")}
    for i in range(num_shards):
        for k, v in shard_stats(out, i).items():
            sums[k] += v
    seconds = sums.pop("seconds")
    return {
        **sums,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(sums["generated_tokens"] / max(seconds, 1e-9), 1),
    }


def merge_ranks(out: Path) -> None:
    """Move the shards that parallel ranks saved under ``out/ranks/`` into ``out`` (ready for ``--resume``).

    Every rank's run must have the same target, settings and prompts; ``out/draftsmith.json`` is the
    first rank's unless ``out`` already has one. Missing shards (a rank that failed) are simply not
    there, so the resuming run generates them.
    """
    out = Path(out)
    ranks = sorted(p for p in (out / RANKS).glob("rank-*") if (p / META).is_file())
    if not ranks:
        return
    first = read_metadata(ranks[0])
    for rank in ranks[1:]:
        check_resumable(first, read_metadata(rank), rank)
    (out / SHARDS).mkdir(parents=True, exist_ok=True)
    for rank in ranks:
        for shard in sorted(completed_shards(rank)):
            os.replace(shard_dir(rank, shard), shard_dir(out, shard))
    if read_metadata(out) is None:
        write_metadata(out, first)
    shutil.rmtree(out / RANKS)


def remove_shards(out: Path) -> None:
    shutil.rmtree(Path(out) / SHARDS, ignore_errors=True)


def generated_dir(path: str | Path) -> Path:
    """The generated dir ``path`` names: itself, or for a packed corpus file its unpacked dir (made once)."""
    return unpack(path) if is_packed(path) else Path(path)


def load_generated(path: str | Path):
    """Read a dataset written by ``draftsmith generate``.

    Args:
        path: the ``--out`` dir of a complete run, or a corpus packed into one file (``data/packed.py``), read
            from its unpacked dir (made once).

    Returns:
        (the ``datasets.Dataset``, its ``draftsmith.json`` metadata as a dict).
    """
    return load_dir(generated_dir(path))


def check_dataset_target(metadata: dict, target: Target | dict, what: str = "generated dataset") -> None:
    """Refuse a generated dataset made by another target, naming both fingerprints.

    Args:
        metadata: the dataset's ``draftsmith.json`` (from ``load_generated``).
        target: the target it is about to be used with (or its fingerprint).
        what: how to name the dataset in the error (e.g. its path).
    """
    actual = target.fingerprint if isinstance(target, Target) else target
    check_fingerprint(metadata["target"], actual, what)
