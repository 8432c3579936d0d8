"""A generated corpus as one compressed file that a repository can keep, read back as the data dir it came from.

Generating a corpus is the slow part of training on a CPU (1M tokens of SmolLM2: 41 min to over 2 h on 2 cores, and
each machine draws its own sample). ``pack`` writes a finished ``draftsmith generate`` dir to one ``.tar.xz`` file:
the token ids of every row (prompt + answer), where the answer starts, the loss mask, the row's prompt and sample
index, its ``draftsmith.json`` (target fingerprint, settings, counts) and, when given, the prompts as text. The file
is byte-for-byte reproducible (fixed member order, times and owners), so its sha256 names the corpus.

``unpack`` writes it back as a complete generated dir (under ``$DRAFTSMITH_HOME/corpora/`` by default, reused when
present), and ``load_generated`` (``data/shards.py``) accepts the packed file wherever it accepts a data dir: ``fit``
(``--data.init_args.train FILE``), ``features`` and the benchmarks train on it as they would on the original dir.
The unpacked metadata is the original's plus ``packed: {file, sha256}``: the rows and their data identity (the
settings, counts and target that feature caches and fits check) are the original's.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftsmith.core.files import made_once, made_whole, refuse_existing
from draftsmith.core.manifest import file_sha256
from draftsmith.data.dataset_dir import features, load_dir, quiet_datasets, read_metadata, write_metadata
from draftsmith.errors import DraftsmithError

SUFFIX = ".tar.xz"
FORMAT = 1
"""The packed file's format version (``format.json``)."""
_ARRAYS = ("lengths", "input_ids", "loss_mask", "prompt_len", "prompt_index", "sample_index")
_MEMBERS = ("format.json", "draftsmith.json", *(f"{a}.npy" for a in _ARRAYS))
"""What every packed file holds (and ``prompts.jsonl`` when the prompts were given)."""


@dataclass(frozen=True)
class Packed:
    """What ``pack`` wrote."""

    path: Path
    sha256: str
    rows: int
    tokens: int
    """Prompt and answer tokens of every row."""
    generated_tokens: int
    bytes: int


def is_packed(path: str | Path) -> bool:
    """``path`` names a packed corpus file (a ``.tar.xz`` file, not a directory)."""
    return str(path).endswith(SUFFIX) and not Path(path).is_dir()


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid = len(data), 0, 0o644, 0, 0
    tar.addfile(info, io.BytesIO(data))


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def pack(data: str | Path, out: str | Path, prompts: str | Path | None = None, overwrite: bool = False) -> Packed:
    """Pack the finished generated dir ``data`` into the one file ``out`` (``*.tar.xz``).

    Args:
        data: a complete ``draftsmith generate`` output dir (no top-k logprobs: they would not fit a repository).
        out: the file to write (written beside it, then renamed onto it: an existing one stays until it is whole).
        prompts: the prompts file it was generated from, kept in the pack as text (optional).
        overwrite: replace an existing ``out`` (else refused).
    """
    data, out = Path(data), Path(out)
    if not str(out).endswith(SUFFIX):
        raise DraftsmithError(f"pack: --out {out} must end in {SUFFIX}")
    if prompts is not None and not Path(prompts).is_file():
        raise DraftsmithError(f"pack: --prompts {prompts}: no such file")
    if out.is_dir():
        raise DraftsmithError(f"pack: --out {out} is a directory; name the {SUFFIX} file to write")
    refuse_existing(out, overwrite, "pack")
    ds, metadata = load_dir(data)
    if "topk_ids" in ds.column_names:
        raise DraftsmithError(
            f"pack: {data} stores top-k logprobs; pack a corpus generated without them (store_topk 0)"
        )
    ids = ds["input_ids"]
    lengths = np.array([len(r) for r in ids], dtype=np.int64)
    flat = np.fromiter((t for r in ids for t in r), dtype=np.int64, count=int(lengths.sum()))
    vocab = metadata["target"].get("vocab_size") or int(flat.max()) + 1
    token_dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    mask = np.fromiter((m for r in ds["loss_mask"] for m in r), dtype=np.uint8, count=len(flat))
    arrays = {
        "lengths.npy": lengths.astype(np.int32),
        "input_ids.npy": flat.astype(token_dtype),
        "loss_mask.npy": np.packbits(mask),
        "prompt_len.npy": np.asarray(ds["prompt_len"], dtype=np.int32),
        "prompt_index.npy": np.asarray(ds["prompt_index"], dtype=np.int64),
        "sample_index.npy": np.asarray(ds["sample_index"], dtype=np.int32),
    }

    def write(tmp: Path) -> None:
        with tarfile.open(tmp, "w:xz", preset=9) as tar:
            _member(tar, "format.json", json.dumps({"format": FORMAT, "tokens": str(token_dtype.__name__)}).encode())
            _member(tar, "draftsmith.json", json.dumps(metadata, indent=1, sort_keys=True).encode())
            for name, array in arrays.items():
                _member(tar, name, _npy(array))
            if prompts is not None:
                _member(tar, "prompts.jsonl", Path(prompts).read_bytes())

    made_whole(out, write)
    return Packed(out, file_sha256(out), len(ds), len(flat), int(mask.sum()), out.stat().st_size)


def pack_corpus(data: Path, out: Path, prompts: Path | None = None, overwrite: bool = False) -> Path:
    """Pack a finished generated corpus into one compressed file (``draftsmith pack DATA --out FILE.tar.xz``).

    Args:
        data: a complete ``draftsmith generate`` output dir.
        out: the file to write, ending in ``.tar.xz``.
        prompts: the prompts file it was generated from, kept in the pack as text.
        overwrite: replace an existing ``out``.
    """
    packed = pack(data, out, prompts, overwrite)
    print(
        f"{packed.path}: {packed.rows:,} rows, {packed.tokens:,} tokens ({packed.generated_tokens:,} generated) in "
        f"{packed.bytes / 1e6:.1f} MB, sha256 {packed.sha256[:16]}; train on it with --data.init_args.train {packed.path}"
    )
    return packed.path


def _read(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    try:
        with tarfile.open(path, "r:xz") as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DraftsmithError(f"{path} is not a readable packed corpus ({e})") from None
    missing = [n for n in _MEMBERS if n not in members]
    if missing:
        raise DraftsmithError(f"{path} is not a packed corpus: it lacks {', '.join(missing)}")
    fmt = json.loads(members["format.json"])
    if fmt.get("format") != FORMAT:
        raise DraftsmithError(f"{path}: packed format {fmt.get('format')}, this draftsmith reads {FORMAT}")
    arrays = {n[:-4]: np.load(io.BytesIO(b), allow_pickle=False) for n, b in members.items() if n.endswith(".npy")}
    return json.loads(members["draftsmith.json"]), arrays


def read_columns(path: str | Path) -> tuple[dict, dict]:
    """The packed corpus ``path``'s metadata and its columns as a generated dir holds them (``input_ids`` and
    ``loss_mask``: one array per row), read with numpy alone (no ``datasets``: ``unpack`` writes these)."""
    metadata, a = _read(Path(path))
    offsets = np.concatenate([[0], np.cumsum(a["lengths"], dtype=np.int64)])
    mask = np.unpackbits(a["loss_mask"], count=int(offsets[-1]))
    ids = a["input_ids"].astype(np.int32)
    columns = {
        "input_ids": [ids[s:e] for s, e in zip(offsets[:-1], offsets[1:], strict=True)],
        "loss_mask": [mask[s:e].astype(np.int8) for s, e in zip(offsets[:-1], offsets[1:], strict=True)],
        "prompt_len": a["prompt_len"],
        "prompt_index": a["prompt_index"],
        "sample_index": a["sample_index"],
    }
    return metadata, columns


def metadata(path: str | Path) -> dict:
    """The ``draftsmith.json`` a packed corpus holds (target fingerprint, settings, counts), read without unpacking."""
    try:
        with tarfile.open(path, "r:xz") as tar:
            return json.loads(tar.extractfile("draftsmith.json").read())
    except (tarfile.TarError, KeyError, EOFError, OSError) as e:
        raise DraftsmithError(f"{path} is not a readable packed corpus ({e})") from None


def default_dest(path: Path, digest: str) -> Path:
    from draftsmith.targets.cache import cache_home

    return cache_home() / "corpora" / f"{path.name[: -len(SUFFIX)]}-{digest[:12]}"


def unpack(path: str | Path, dest: str | Path | None = None) -> Path:
    """The packed corpus ``path`` as a complete generated dir (``dest``, default under
    ``$DRAFTSMITH_HOME/corpora/``); a dir that already holds this file's unpacking is reused as it is."""
    from datasets import Dataset

    path = Path(path)
    if not path.is_file():
        raise DraftsmithError(f"{path}: no such packed corpus file")
    digest = file_sha256(path)
    dest = Path(dest) if dest is not None else default_dest(path, digest)

    def is_made(out: Path) -> bool:
        previous = read_metadata(out)
        if previous is not None and previous.get("packed", {}).get("sha256") == digest:
            return True
        if previous is not None or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
            held = (previous or {}).get("packed", {}).get("file", "generated" if previous else "other files")
            raise DraftsmithError(
                f"unpack: {out} holds another corpus than {path} ({held}); remove it or name another destination"
            )
        return False

    def make(tmp: Path) -> None:
        metadata, columns = read_columns(path)
        with quiet_datasets():
            Dataset.from_dict(columns, features=features(0)).save_to_disk(str(tmp))
        write_metadata(tmp, {**metadata, "packed": {"file": path.name, "sha256": digest}})

    return made_once(dest, is_made, make)
