"""The data stage (``data/stage.py``): generated data made once per settings; a packed corpus of the same generation
unpacked in its place (the studies' validation answers), another generation's not; a packed corpus unpacked for a
run that computes in another dtype allows it, saying so."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import VOCAB, make_llama, make_tokenizer

from draftsmith.core.fingerprint import ALLOW_DTYPE_MISMATCH
from draftsmith.data import stage
from draftsmith.data.packed import pack
from draftsmith.data.shards import read_metadata
from draftsmith.targets import resolve_target


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A tiny float32 target, greedy answers to 6 prompts made by ``generated_once``, and them packed."""
    root = tmp_path_factory.mktemp("stage")
    make_llama(seed=0, layers=2).save_pretrained(root / "target")
    make_tokenizer().save_pretrained(root / "target")
    g = torch.Generator().manual_seed(0)
    prompts = (" ".join(f"w{i}" for i in torch.randint(0, VOCAB - 2, (3,), generator=g).tolist()) for _ in range(6))
    (root / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    target = resolve_target(str(root / "target"))
    made = stage.generated_once(target, root / "made", settings(root), device="cpu")
    pack(made, root / "made.tar.xz")
    return root, target


class Generated(Exception):
    """Raised by a patched ``generate``: the stage generated."""


def settings(root, **changed) -> dict:
    return {"prompts": str(root / "p.jsonl"), "temperature": 0.0, "max_new_tokens": 8, **changed}


def test_generated_data_is_made_once_and_a_packed_file_of_the_same_generation_stands_in(toy, tmp_path, monkeypatch):
    root, target = toy
    calls = []

    def generating(*args, **kwargs):
        calls.append(kwargs["out"])
        raise Generated

    monkeypatch.setattr(stage, "generate", generating)
    assert stage.generated_once(target, root / "made", settings(root), device="cpu") == root / "made"  # current
    packed = stage.generated_once(target, tmp_path / "val", settings(root), "cpu", packed=root / "made.tar.xz")
    assert read_metadata(packed)["packed"]["file"] == "made.tar.xz" and not calls
    assert stage.made_with(root / "made.tar.xz", "float32", settings(root, dtype="float32"))
    assert not stage.made_with(root / "made.tar.xz", "bfloat16", settings(root))  # another dtype's answers
    assert not stage.made_with(root / "none.tar.xz", "float32", settings(root))
    with pytest.raises(Generated):  # another generation's packed file: generated
        stage.generated_once(target, tmp_path / "o", settings(root, max_new_tokens=4), packed=root / "made.tar.xz")
    assert calls == [tmp_path / "o"]


def test_a_packed_corpus_of_another_dtype_is_unpacked_for_the_run_and_allowed(toy, tmp_path, monkeypatch, capsys):
    root, _ = toy
    monkeypatch.delenv(ALLOW_DTYPE_MISMATCH, raising=False)
    assert read_metadata(stage.unpacked_for(root / "made.tar.xz", tmp_path / "a", "float32"))["packed"]
    assert ALLOW_DTYPE_MISMATCH not in stage.os.environ and not capsys.readouterr().out
    stage.unpacked_for(root / "made.tar.xz", tmp_path / "b", "bfloat16")
    assert stage.os.environ[ALLOW_DTYPE_MISMATCH] == "1"
    assert capsys.readouterr().out == (
        "data: made.tar.xz was generated in float32; this run's target computes in bfloat16 "
        f"({ALLOW_DTYPE_MISMATCH}=1)\n"
    )


def test_the_feature_drafters_cache_holds_eagle3_s_layers_and_the_final_state(toy):
    """``feature_cache.eagle3_features``: the one feature-cache call of the pipeline, the studies and the benchmarks."""
    from draftsmith.data.feature_cache import eagle3_features

    root, target = toy
    cache = eagle3_features(target, root / "made", max_length=16)
    meta = json.loads((cache / "features.json").read_text())
    assert cache == root / "made-features" and meta["layers"] == [1, 2] and meta["max_length"] == 16  # 2 layers: 1 1 2
    assert meta["rows"] == 6 and meta["status"] == "complete"
