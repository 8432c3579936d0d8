"""The offline feature cache: what it stores is what the target computes, training from it matches training
online, a killed run resumes, and a cache for other data / target / layers is refused."""

from __future__ import annotations

import json
import shutil

import lightning as L
import pytest
import torch
from safetensors.torch import load_file
from test_train import module, setup  # noqa: F401 - the shared tiny target + data fixture

from draftsmith.data.feature_cache import FeatureCache, cache_features
from draftsmith.errors import DraftsmithError
from draftsmith.targets import resolve_target
from draftsmith.train.data import CachedRows, GeneratedDataModule

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def cache(setup, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("cache") / "features"
    kwargs = {"max_length": 64, "shard_rows": 32, "dtype": "float16"}
    return cache_features(resolve_target(str(setup["target"])), setup["data-train"], [1, 2, 3], out, **kwargs)


def cached_data(setup, cache, **kwargs) -> GeneratedDataModule:  # noqa: F811
    kwargs = {"batch_size": 8, "max_length": 64, "features": str(cache), **kwargs}
    return GeneratedDataModule(str(setup["data-train"]), str(setup["data-val"]), **kwargs)


def first_batch(data: GeneratedDataModule) -> dict:
    data.setup()
    return next(iter(data.train_dataloader()))


def test_cached_batch_gives_the_targets_logits_and_features(setup, cache):  # noqa: F811
    model = module(setup, 3)
    batch = first_batch(cached_data(setup, cache))
    assert set(batch["hidden"]) == {1, 2, 3, 4}  # the final normed state (layer 4) is always kept
    cached = model.target_forward(batch)
    online = model.target_forward({k: v for k, v in batch.items() if k != "hidden"})
    real = batch["attention_mask"].bool()
    assert not torch.equal(cached.features[0][real], online.features[0][real])  # read from fp16, not recomputed
    for a, b in zip(cached.features, online.features, strict=True):
        torch.testing.assert_close(a[real], b[real], rtol=2e-3, atol=2e-3)  # fp16 storage
    torch.testing.assert_close(cached.logits[real], online.logits[real], rtol=1e-2, atol=2e-2)
    p, q = torch.softmax(cached.logits[real], -1), torch.softmax(online.logits[real], -1)
    assert bool((p.argmax(-1) == q.argmax(-1)).float().mean() > 0.99)


def test_training_from_the_cache_follows_online_training(setup, cache, tmp_path):  # noqa: F811
    calls = []

    def train(features: str | None) -> float:
        model = module(setup, 3)
        model.target.model.register_forward_hook(lambda *_: calls.append(features))
        data = cached_data(setup, cache, features=features)
        kw = {"accelerator": "cpu", "logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
        trainer = L.Trainer(max_steps=12, default_root_dir=tmp_path, enable_model_summary=False, **kw)
        trainer.fit(model, data)
        return trainer.validate(model, data, verbose=False)[0]["val/loss"]

    online, cached = train(None), train(str(cache))
    assert abs(online - cached) < 0.02 * online
    # no target forward in the 12 cached training steps; each run makes one 4-token probe (Target.check_final_logits:
    # the cached run to recompute logits from the cache, the online one to compute the draft vocabulary's only)
    assert (calls.count(None) - 1) - (calls.count(str(cache)) - 1) == 12


def test_killed_cache_run_resumes_to_the_same_files(setup, cache, tmp_path):  # noqa: F811
    out = tmp_path / "features"
    args = (resolve_target(str(setup["target"])), setup["data-train"], [1, 2, 3], out, "float16")
    cache_features(*args, max_length=64, shard_rows=32)
    (out / "shard-00001.safetensors").unlink()  # as if killed while writing the second shard
    meta = json.loads((out / "features.json").read_text())
    (out / "features.json").write_text(json.dumps({**meta, "status": "running"}))
    kept = (out / "shard-00000.safetensors").stat().st_mtime_ns
    cache_features(*args, max_length=64, shard_rows=32)
    assert (out / "shard-00000.safetensors").stat().st_mtime_ns == kept
    for name in ("shard-00000.safetensors", "shard-00001.safetensors", "shard-00002.safetensors"):
        a, b = load_file(str(out / name)), load_file(str(cache / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert FeatureCache(out).where == FeatureCache(cache).where


def test_cache_for_other_layers_data_or_length_is_refused(setup, cache, tmp_path):  # noqa: F811
    model = module(setup, 3)
    short = cache_features(
        resolve_target(str(setup["target"])), setup["data-train"], [1], tmp_path / "short", max_length=32
    )
    with pytest.raises(DraftsmithError, match=r"holds layers \[1, 4\], not \[2, 3\]"):
        cached_data(setup, short, max_length=32).check_target(model.target)
    with pytest.raises(DraftsmithError, match="truncated to 64 tokens"):
        cached_data(setup, cache, max_length=128).check_target(model.target)
    other = GeneratedDataModule(str(setup["data-val"]), str(setup["data-val"]), features=str(cache))
    with pytest.raises(DraftsmithError, match="other data"):
        other.check_target(model.target)
    with pytest.raises(DraftsmithError, match="other settings"):
        cache_features(
            resolve_target(str(setup["target"])), setup["data-train"], [2], cache, max_length=64, shard_rows=32
        )


def test_storage_dtype_defaults_to_bf16_for_a_float32_target_and_float16_refuses_overflow(setup, tmp_path):  # noqa: F811
    from transformers import AutoModelForCausalLM

    target, data = str(setup["target"]), setup["data-train"]
    default = cache_features(resolve_target(target), data, [2], tmp_path / "default", max_length=16)
    meta = json.loads((default / "features.json").read_text())
    assert meta["dtype"] == "bfloat16" and meta["target"]["dtype"] == "float32"
    assert load_file(str(default / "shard-00000.safetensors"))["hidden_2"].dtype == torch.bfloat16
    named = cache_features(
        resolve_target(f"{target}:float32"), data, [2], tmp_path / "named", max_length=16, dtype="fp16"
    )
    assert load_file(str(named / "shard-00000.safetensors"))["hidden_2"].dtype == torch.float16
    # a target whose residual stream exceeds float16's range (as LLMs' massive activations can): its embeddings x 1e6
    shutil.copytree(target, tmp_path / "loud")  # its tokenizer and config: the same target's identity
    model = AutoModelForCausalLM.from_pretrained(target)
    model.get_input_embeddings().weight.data *= 1e6
    model.save_pretrained(tmp_path / "loud")
    with pytest.raises(
        DraftsmithError, match="layer 2 holds values up to .* beyond float16's range; cache in bfloat16"
    ):
        cache_features(
            resolve_target(str(tmp_path / "loud")),
            data,
            [2],
            tmp_path / "loud-features",
            max_length=16,
            dtype="float16",
        )


def test_bf16_data_caches_in_bf16_trains_a_bf16_drafter_and_refuses_the_float32_target(setup, tmp_path):  # noqa: F811
    from draftsmith.data.generate import generate
    from draftsmith.data.shards import read_metadata
    from draftsmith.families.eagle.module import EagleModule

    target = str(setup["target"])
    common = {"max_new_tokens": 8, "device": "cpu", "num_prompts": 8}
    data = generate(
        resolve_target(f"{target}:bf16"), str(setup["train.jsonl"]), tmp_path / "data", temperature=1.0, **common
    )
    assert read_metadata(data)["target"]["dtype"] == "bfloat16"
    cache = cache_features(resolve_target(target), data, [2], tmp_path / "features", max_length=32)  # the data's dtype
    assert json.loads((cache / "features.json").read_text())["target"]["dtype"] == "bfloat16"
    with pytest.raises(DraftsmithError, match="in bfloat16 but is used with it in float32.*--dtype bfloat16"):
        cache_features(resolve_target(f"{target}:float32"), data, [2], tmp_path / "features32", max_length=32)
    model = EagleModule(f"{target}:bfloat16", version=1)
    assert model.target.dtype == "bfloat16" and not model.target.batch_invariant  # whole sequences: fast kernels
    batch = first_batch(GeneratedDataModule(str(data), str(data), batch_size=4, max_length=32))
    losses = model.losses(batch, model.target_forward(batch))  # float32 drafter on bf16 target features
    assert torch.isfinite(losses["loss"])


def test_reduced_vocabulary_loss_reads_only_its_logits_and_equals_the_full_one(setup, cache):  # noqa: F811
    model, data = module(setup, 3), cached_data(setup, cache)  # EAGLE-3 with a 48-token draft vocabulary
    data.setup()
    model.prepare_from_data(data)
    batch = first_batch(data)
    vocab = model.loss_vocab()
    assert vocab is not None and len(vocab) == 48
    restricted, full = model.target_forward(batch, vocab), model.target_forward(batch)
    assert restricted.logits.shape[-1] == 48
    torch.testing.assert_close(restricted.logits, full.logits[..., vocab])
    a, b = model.losses(batch, restricted), model.losses(batch, full)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="another token subset"):
        restricted.logits_over(vocab[:-1])
    online = {k: v for k, v in batch.items() if k != "hidden"}  # training without the cache: the same saving
    restricted, full = model.target_forward(online, vocab), model.target_forward(online)
    assert restricted.vocab is vocab and restricted.logits.shape[-1] == 48
    torch.testing.assert_close(restricted.logits, full.logits[..., vocab], rtol=1e-5, atol=1e-5)
    for x, y in zip(restricted.features, full.features, strict=True):
        torch.testing.assert_close(x, y)
    a, b = model.losses(online, restricted), model.losses(online, full)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)


def test_train_rows_trains_on_a_prefix_the_full_cache_serves(setup, cache):  # noqa: F811
    full, part = cached_data(setup, cache), cached_data(setup, cache, train_rows=5)
    full.setup()
    part.setup()
    assert part.train_ds["input_ids"] == full.train_ds["input_ids"][:5]
    part.check_target(module(setup, 3).target)  # the whole dataset's cache still serves the prefix
    rows = part.train_dataloader().dataset  # the prefix's rows with their cached hidden states
    assert len(rows) == 5
    for i in range(5):  # row i of the prefix is row i of the cache, its hidden states as long as its tokens
        assert rows[i]["input_ids"] == full.train_ds[i]["input_ids"]
        assert len(rows[i]["hidden"][4]) == min(64, len(rows[i]["input_ids"]))
    with pytest.raises(DraftsmithError, match="data.train_rows"):
        cached_data(setup, cache, train_rows=10**6).setup()


def test_prefix_cache_serves_its_first_rows_and_grows_in_place(setup, cache, tmp_path):  # noqa: F811
    out, model = tmp_path / "features", module(setup, 3)
    args = (resolve_target(str(setup["target"])), setup["data-train"], [1, 2, 3], out, "float16")
    cache_features(*args, max_length=64, shard_rows=32, rows=40)  # rounded up to whole shards: 64 rows
    assert json.loads((out / "features.json").read_text())["rows"] == 64
    assert sorted(p.name for p in out.glob("shard-*")) == ["shard-00000.safetensors", "shard-00001.safetensors"]
    cached_data(setup, out, train_rows=64).check_target(model.target)  # a fit on the first 64 rows: served
    with pytest.raises(DraftsmithError, match="holds the first 64 rows"):
        cached_data(setup, out).check_target(model.target)  # every row: refused before any step
    kept = (out / "shard-00001.safetensors").stat().st_mtime_ns
    cache_features(*args, max_length=64, shard_rows=32)  # the whole data: the two shards kept, the rest added
    assert (out / "shard-00001.safetensors").stat().st_mtime_ns == kept
    for path in cache.glob("shard-*.safetensors"):
        a, b = load_file(str(out / path.name)), load_file(str(path))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert FeatureCache(out).where == FeatureCache(cache).where
    cache_features(*args, max_length=64, shard_rows=32, rows=10)  # fewer rows than it holds: kept whole
    assert json.loads((out / "features.json").read_text())["rows"] == FeatureCache(cache).meta["rows"]
    with pytest.raises(DraftsmithError, match="rows must be positive"):
        cache_features(*args, max_length=64, shard_rows=32, rows=0)


def test_the_same_data_reached_by_another_path_keeps_its_cache(setup, cache, tmp_path):  # noqa: F811
    """The data's identity decides, not its path: a study dir whose data is a symlink to another's (or the data
    moved) finds the cache complete, even with ``overwrite`` (which once deleted a 250k-token cache for this and
    rebuilt it); other data at the new path is still another cache."""
    out, moved = tmp_path / "features", tmp_path / "elsewhere"
    shutil.copytree(cache, out)
    moved.symlink_to(setup["data-train"].resolve(), target_is_directory=True)
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")}
    args = (resolve_target(str(setup["target"])), moved, [1, 2, 3], out, "float16")
    assert cache_features(*args, max_length=64, shard_rows=32, overwrite=True) == out
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")} == kept
    with pytest.raises(DraftsmithError, match="other settings"):
        cache_features(*args, max_length=32, shard_rows=32)  # other settings are still refused


def same_batch(a: dict, b: dict) -> bool:
    """Equal keys, and equal tensors of equal dtypes under each (``hidden``: per layer)."""
    if a.keys() != b.keys():
        return False
    if isinstance(a.get("hidden"), dict) and not same_batch(a["hidden"], b["hidden"]):
        return False
    pairs = [(a[k], b[k]) for k in a if k != "hidden"]
    return all(x.dtype == y.dtype and torch.equal(x, y) for x, y in pairs)


@pytest.mark.parametrize("pack", [False, True])
def test_a_batch_is_read_in_one_call_and_equals_the_rows_read_one_at_a_time(setup, cache, pack, monkeypatch):  # noqa: F811
    """The DataLoader reads a training batch's rows at once (``CachedRows.__getitems__``: the dataset's rows in one
    read, the cache's as views; ``PackedRows`` through it), never a row alone, and its batches, padded and packed, are
    the ones reading each row alone gives (torch's fetcher without ``__getitems__``)."""

    def epoch() -> list[dict]:
        data = cached_data(setup, cache, pack=pack)
        data.setup()
        return list(data.train_dataloader())

    with monkeypatch.context() as m:
        m.setattr(CachedRows, "__getitems__", None)  # torch's fetcher and PackedRows then read row by row
        per_row = epoch()

    def alone(self, i):
        raise AssertionError(f"row {i} read alone")

    monkeypatch.setattr(CachedRows, "__getitem__", alone)
    batched = epoch()
    assert len(batched) == len(per_row) > 1 and ("doc_ids" in batched[0]) == pack
    assert all(same_batch(a, b) for a, b in zip(batched, per_row, strict=True))
    data = cached_data(setup, cache)
    data.setup()
    rows = CachedRows(data.train_ds, data.cache).__getitems__([70, 3, 40, 3])  # three shards, a row twice
    part = data.cache.parts[data.cache.where[70][0]]["hidden_2"]
    assert rows[0]["hidden"][2].untyped_storage().data_ptr() == part.untyped_storage().data_ptr()  # a view
