"""A target's identity as datasets, feature caches, checkpoints and exports record it (``Target.fingerprint``): the
hashes of its tokenizer and of its config, and the check that an artifact was made for the target it is used with
(``check_fingerprint``: another target, or the same one in another dtype, refused in one line)."""

from __future__ import annotations

import hashlib
import json
import os

from draftsmith.errors import DraftsmithError


def tokenizer_hash(tokenizer) -> str:
    """A stable hash of a tokenizer's vocabulary and special tokens."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    special = sorted(str(t) for t in tokenizer.all_special_tokens)
    blob = json.dumps([vocab, special], ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


IDENTITY_KEYS = ("model_type", "vocab_size", "hidden_size", "num_layers", "tokenizer_hash", "config_hash")
# config fields the hash leaves out: the dtype (recorded and checked on its own) and the version of transformers that
# serialised the config (an upgrade of transformers is not another target)
UNHASHED = ("dtype", "transformers_version")
LEGACY_CONFIG_HASHES: dict[str, frozenset[str]] = {}
"""Each config hash of a target built in this process -> the hashes artifacts made before draftsmith left the
transformers version out of it recorded for the same config (``_legacy_config_hashes``)."""


def config_hash(config) -> str:
    """The hash of a target's HF ``config`` that its fingerprint records (private fields and ``UNHASHED`` left out);
    remembers, for ``identity_diff``, the hashes artifacts made under older transformers recorded for it."""
    cfg = {k: v for k, v in config.to_diff_dict().items() if not k.startswith("_") and k not in UNHASHED}
    hashed = _config_hash(cfg)
    if hashed not in LEGACY_CONFIG_HASHES:
        LEGACY_CONFIG_HASHES[hashed] = _legacy_config_hashes(cfg)
    return hashed


def _config_hash(cfg: dict) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _legacy_config_hashes(cfg: dict) -> frozenset[str]:
    """The config hashes that artifacts made before 2026-12-04 recorded for ``cfg``: they covered the
    ``transformers_version`` field too, i.e. the version installed when the artifact was made, which they do not
    record beside it. Recomputed for every 5.x release number up to the installed minor version (a few hundred
    hashes of a small JSON: milliseconds), so a corpus, cache or drafter made under an older transformers is still
    recognised as made for this target."""
    import transformers

    minor = int(transformers.__version__.split(".")[1])
    return frozenset(
        _config_hash(cfg | {"transformers_version": f"5.{m}.{p}"}) for m in range(minor + 1) for p in range(10)
    )


def identity_diff(expected: dict, actual: dict) -> list[str]:
    """The identity keys in which two target fingerprints differ (an old artifact's config hash, recorded with the
    transformers version in it, matches a target built in this process with the same config)."""
    diff = [k for k in IDENTITY_KEYS if expected.get(k) != actual.get(k)]
    if "config_hash" in diff and expected.get("config_hash") in LEGACY_CONFIG_HASHES.get(actual.get("config_hash"), ()):
        diff.remove("config_hash")
    return diff


ALLOW_DTYPE_MISMATCH = "DRAFTSMITH_ALLOW_DTYPE_MISMATCH"
"""Environment variable: ``1`` uses data, feature caches and drafters made against the same target in another
dtype, with a warning, instead of refusing them."""


def check_fingerprint(expected: dict, actual: dict, what: str) -> None:
    """Raise a clear error when an artifact was made for another target, or for the same one in another dtype
    (artifacts that record no dtype were made in float32, the only one before dtypes were recorded)."""
    diff = identity_diff(expected, actual)
    made, used = expected.get("dtype", "float32"), actual.get("dtype", "float32")
    if not diff and made != used:
        if os.environ.get(ALLOW_DTYPE_MISMATCH) == "1":
            print(f"warning: {what} was made with the target in {made}; using it in {used} ({ALLOW_DTYPE_MISMATCH}=1)")
            return
        raise DraftsmithError(
            f"{what} was made with target {expected.get('name')!r} in {made} but is used with it in {used}; "
            f"use the target in {made} (--dtype {made}, or the target spec TARGET:{made}), or set "
            f"{ALLOW_DTYPE_MISMATCH}=1 to use it anyway"
        )
    if diff:
        detail = ", ".join(f"{k}: {expected.get(k)!r} vs {actual.get(k)!r}" for k in diff)
        raise DraftsmithError(
            f"{what} was made for target {expected.get('name')!r} but is used with target "
            f"{actual.get('name')!r}; they differ in {detail}"
        )
