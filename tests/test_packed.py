"""A generated corpus packed into one file: read back, it is the corpus it came from, and training reads it."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, make_llama, make_tokenizer

from draftsmith.cli import main
from draftsmith.data.feature_cache import data_identity
from draftsmith.data.generate import generate, load_generated
from draftsmith.data.packed import pack, unpack
from draftsmith.errors import DraftsmithError
from draftsmith.targets import resolve_target
from draftsmith.train.data import GeneratedDataModule

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A tiny target, its sampled answers to 24 prompts (some rows end at EOS), greedy validation data."""
    root = tmp_path_factory.mktemp("packed")
    make_llama(seed=0, layers=2, eos=VOCAB - 2).save_pretrained(root / "target")
    make_tokenizer().save_pretrained(root / "target")
    g = torch.Generator().manual_seed(0)
    for name, n in [("train", 24), ("val", 6)]:
        words = (
            " ".join(f"w{i}" for i in torch.randint(0, VOCAB - 2, (2 + j % 5,), generator=g).tolist()) for j in range(n)
        )
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": w}) + "\n" for w in words))
    common = {"max_new_tokens": 16, "device": "cpu", "shard_size": 8}
    generate(resolve_target(str(root / "target")), str(root / "train.jsonl"), root / "train", temperature=1.0, **common)
    generate(resolve_target(str(root / "target")), str(root / "val.jsonl"), root / "val", temperature=0.0, **common)
    return root


def test_unpacked_corpus_has_the_rows_metadata_and_identity_it_was_packed_from(corpus, tmp_path):
    packed = pack(corpus / "train", tmp_path / "c.tar.xz", prompts=corpus / "train.jsonl")
    original, meta = load_generated(corpus / "train")
    back, back_meta = load_generated(unpack(packed.path, tmp_path / "unpacked"))
    assert back.to_list() == original.to_list()
    assert {k: v for k, v in back_meta.items() if k != "packed"} == meta
    assert back_meta["packed"] == {"file": "c.tar.xz", "sha256": packed.sha256}
    assert data_identity(back_meta) == data_identity(meta)  # feature caches and fits take it for the same corpus
    assert packed.rows == len(original) and packed.generated_tokens == sum(map(sum, original["loss_mask"]))
    with tarfile.open(packed.path) as tar:
        assert tar.extractfile("prompts.jsonl").read() == (corpus / "train.jsonl").read_bytes()


def test_packing_is_reproducible_byte_for_byte(corpus, tmp_path):
    assert pack(corpus / "train", tmp_path / "a.tar.xz").sha256 == pack(corpus / "train", tmp_path / "b.tar.xz").sha256


def test_load_generated_reads_a_packed_file_as_its_corpus_unpacked_once(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))
    packed = pack(corpus / "train", tmp_path / "c.tar.xz")
    ds, meta = load_generated(packed.path)
    assert ds.to_list() == load_generated(corpus / "train")[0].to_list()
    unpacked = [p for p in (tmp_path / "home" / "corpora").iterdir() if p.is_dir()]
    assert len(unpacked) == 1 and packed.sha256[:12] in unpacked[0].name
    stamp = (unpacked[0] / "draftsmith.json").stat().st_mtime_ns
    load_generated(packed.path)
    assert (unpacked[0] / "draftsmith.json").stat().st_mtime_ns == stamp, "the unpacked dir is reused"


def test_fit_trains_from_a_packed_corpus_as_from_its_dir(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))
    packed = pack(corpus / "train", tmp_path / "c.tar.xz")
    rows = {}
    for name, train in [("dir", corpus / "train"), ("packed", packed.path)]:
        dm = GeneratedDataModule(str(train), str(corpus / "val"), batch_size=4, max_length=32)
        dm.setup()
        rows[name] = [b["input_ids"].tolist() for b in dm.train_dataloader()]
    assert rows["packed"] == rows["dir"]
    main(
        [
            "fit",
            f"--config={ROOT / 'configs' / 'eagle1.yaml'}",
            f"--model.init_args.target={corpus / 'target'}",
            f"--data.train={packed.path}",
            f"--data.val={corpus / 'val'}",
            f"--trainer.default_root_dir={tmp_path / 'fit'}",
            "--trainer.enable_progress_bar=false",
            "--trainer.max_steps=2",
            "--trainer.max_epochs=-1",
            "--trainer.check_val_every_n_epoch=null",
            "--trainer.val_check_interval=2",
        ]
    )
    assert (tmp_path / "fit" / "csv" / "version_0" / "checkpoints" / "last.ckpt").is_file()


def test_a_truncated_or_foreign_file_and_a_dir_holding_another_corpus_are_one_line(corpus, tmp_path):
    packed = pack(corpus / "train", tmp_path / "c.tar.xz")
    cut = tmp_path / "cut.tar.xz"
    cut.write_bytes(packed.path.read_bytes()[: packed.bytes // 2])
    with pytest.raises(DraftsmithError, match="not a readable packed corpus"):
        unpack(cut, tmp_path / "x")
    foreign = tmp_path / "foreign.tar.xz"
    with tarfile.open(foreign, "w:xz") as tar:
        tar.add(corpus / "train.jsonl", "train.jsonl")
    with pytest.raises(DraftsmithError, match="lacks format.json"):
        unpack(foreign, tmp_path / "y")
    other = pack(corpus / "val", tmp_path / "v.tar.xz")
    unpack(packed.path, tmp_path / "z")
    with pytest.raises(DraftsmithError, match="holds another corpus"):
        unpack(other.path, tmp_path / "z")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's own file")
    with pytest.raises(DraftsmithError, match=r"holds another corpus .*\(other files\)"):
        unpack(packed.path, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").is_file()
    with pytest.raises(DraftsmithError, match="holds another corpus"):
        unpack(packed.path, tmp_path / "mine" / "notes.txt")
    with pytest.raises(DraftsmithError, match="must end in .tar.xz"):
        pack(corpus / "train", tmp_path / "c.zip")


def test_pack_command_writes_the_file_and_a_wrong_suffix_is_one_line(corpus, tmp_path, capsys):
    main(["pack", str(corpus / "train"), "--out", str(tmp_path / "c.tar.xz"), "--prompts", str(corpus / "train.jsonl")])
    assert "train on it with --data.init_args.train" in capsys.readouterr().out
    assert load_generated(unpack(tmp_path / "c.tar.xz", tmp_path / "u"))[0].to_list() == (
        load_generated(corpus / "train")[0].to_list()
    )
    with pytest.raises(SystemExit) as exit_:
        main(["pack", str(corpus / "train"), "--out", str(tmp_path / "c.npz")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "must end in .tar.xz" in err and "Traceback" not in err


def test_pack_over_an_existing_file_needs_overwrite_and_a_failed_pack_leaves_the_old_file_and_no_tmp(
    corpus, tmp_path, capsys, monkeypatch
):
    """``pack`` silently replaced an existing ``--out``; ``--prompts MISSING`` was a traceback after the compression,
    leaving ``OUT.tar.xz.tmp`` behind."""
    out = tmp_path / "c.tar.xz"
    out.write_bytes(b"the user's own file")

    def refused(*args: str) -> str:
        with pytest.raises(SystemExit) as exit_:
            main(["pack", str(corpus / "train"), "--out", str(out), *args])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
        assert out.read_bytes() == b"the user's own file" and not (tmp_path / "c.tar.xz.tmp").exists()
        return err

    assert f"pack: --out {out} exists (pass --overwrite to replace it)" in refused()
    assert f"pack: --prompts {tmp_path / 'none.jsonl'}: no such file" in refused(
        "--prompts", str(tmp_path / "none.jsonl"), "--overwrite"
    )
    from draftsmith.data import packed

    monkeypatch.setattr(packed, "_npy", lambda array: 1 / 0)  # a crash midway through the file
    with pytest.raises(ZeroDivisionError):
        pack(corpus / "train", out, overwrite=True)
    assert out.read_bytes() == b"the user's own file" and not (tmp_path / "c.tar.xz.tmp").exists()
    monkeypatch.undo()
    main(["pack", str(corpus / "train"), "--out", str(out), "--overwrite"])
    assert unpack(out, tmp_path / "u").is_dir()


def test_the_repositorys_smollm2_corpus_is_a_complete_million_token_draw_of_smollm2_in_bf16():
    """``benchmarks/data/smollm2-1m.tar.xz``, the corpus every machine trains the recipe study on (issue 51), and its
    validation data: complete, drawn from SmolLM2-135M-Instruct in bf16, at most ~10 MB."""
    from draftsmith.data.packed import metadata

    root = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
    train, val = metadata(root / "smollm2-1m.tar.xz"), metadata(root / "smollm2-val.tar.xz")
    for meta in (train, val):
        assert meta["status"] == "complete" and meta["settings"]["dtype"] == "bfloat16"
        assert (meta["target"]["num_layers"], meta["target"]["vocab_size"]) == (30, 49152)
        assert meta["target"]["tokenizer_hash"] == train["target"]["tokenizer_hash"]
    assert train["generated_tokens"] >= 1_000_000 and train["rows"] == train["prompts_used"]
    assert val["settings"]["temperature"] == 0.0
    assert (root / "smollm2-1m.tar.xz").stat().st_size <= 10e6


def test_the_repositorys_smollm2_corpus_is_taken_as_made_by_the_smollm2_target_installed_here():
    """The corpus was drawn under transformers 5.24, and its target's config hash then covered the version the
    config serialises (the installed one); under the transformers installed now the smollm2 target in bf16 still
    takes it as its own, as ``fit`` checks it (under 5.25, before the hash left the version out, it did not)."""
    from draftsmith.data.packed import metadata
    from draftsmith.data.shards import check_dataset_target
    from draftsmith.export.common import target_fingerprint
    from draftsmith.targets import resolve

    fingerprint = target_fingerprint(resolve("smollm2"), "bfloat16")
    root = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
    for name in ("smollm2-1m.tar.xz", "smollm2-val.tar.xz"):
        check_dataset_target(metadata(root / name), fingerprint, name)
