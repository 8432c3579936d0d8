"""User mistakes get one clear line naming the file, field or flag, never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from draftsmith.cli import main
from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.core.trees import TreeKind
from draftsmith.data.prompts import load_prompts
from draftsmith.decode.verifier import SpeculativeDecoder, check_compatible
from draftsmith.errors import DraftsmithError
from draftsmith.families.medusa.network import MedusaConfig, MedusaModel
from draftsmith.families.ngram.drafter import NGramDrafter
from draftsmith.families.specs import load_drafter
from draftsmith.layers.causal_lm import DraftLM
from draftsmith.targets import resolve_target


def run_cli(capsys, *args) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_drafter_with_other_vocabulary_is_refused_naming_both(model_dirs):
    target = Target.from_pretrained(model_dirs["target"])
    with pytest.raises(DraftsmithError, match=r"vocabulary size 128 .*has 96"):
        check_compatible(target, DraftLM.from_pretrained(model_dirs["wide"]), "wide")


def test_drafter_with_other_tokenizer_is_refused_naming_both(model_dirs):
    target = Target.from_pretrained(model_dirs["target"])
    with pytest.raises(DraftsmithError, match=r"drafter 'foreign' uses a different tokenizer .* than target"):
        check_compatible(target, DraftLM.from_pretrained(model_dirs["foreign"]), "foreign")
    check_compatible(target, DraftLM.from_pretrained(model_dirs["drafter"]), "drafter")  # same tokenizer: fine


def test_cli_refuses_foreign_drafter_in_one_line(model_dirs, prompt_file, tmp_path, capsys):
    err = run_cli(
        capsys,
        "score",
        "--target",
        str(model_dirs["target"]),
        "--drafter",
        "[ngram," + str(model_dirs["foreign"]) + "]",
        "--prompts",
        str(prompt_file),
        "--out",
        str(tmp_path / "out"),
    )
    assert "different tokenizer" in err and str(model_dirs["foreign"]) in err


def test_missing_prompt_file_is_named(tmp_path):
    with pytest.raises(DraftsmithError, match="file not found: .*nope.jsonl"):
        load_prompts(tmp_path / "nope.jsonl")


def test_malformed_prompt_line_names_file_and_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b"\n')
    with pytest.raises(DraftsmithError, match=r"p.jsonl:3: malformed JSON"):
        load_prompts(path)


def test_prompt_record_without_prompt_field_names_the_keys(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "a"}\n')
    with pytest.raises(DraftsmithError, match=r"p.jsonl:1: no 'prompt' or 'messages' field \(keys: \['text'\]\)"):
        load_prompts(path)


def test_empty_prompt_file_is_an_error(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n")
    with pytest.raises(DraftsmithError, match="holds no prompts"):
        load_prompts(path)


@pytest.mark.parametrize("k", [0, -2])
def test_non_positive_k_is_refused(target, k):
    with pytest.raises(DraftsmithError, match="positive integer"):
        SpeculativeDecoder(target, NGramDrafter(), k, Sampling())


def test_cli_non_positive_k_is_one_line(model_dirs, prompt_file, tmp_path, capsys):
    err = run_cli(capsys, "score", "--target", str(model_dirs["target"]), "--drafter", "[ngram]", "-k", "0")
    assert "-k must be a positive integer or auto, got 0" in err
    err = run_cli(capsys, "score", "--target", str(model_dirs["target"]), "--drafter", "[ngram]", "-k", "fast")
    assert "-k must be a positive integer or auto, got 'fast'" in err


def test_score_on_a_device_this_machine_lacks_is_one_line(model_dirs, capsys):
    device = "tpu" if torch.cuda.is_available() else "cuda"
    err = run_cli(capsys, "score", "--target", str(model_dirs["target"]), "--drafter", "[ngram]", "--device", device)
    assert f"--device {device}: expected cpu or cuda[:N] on a machine with a CUDA GPU" in err


def test_cli_missing_target_dir(tmp_path, capsys):
    err = run_cli(capsys, "score", "--target", str(tmp_path / "none"), "--drafter", "[ngram]")
    assert "is not a model directory" in err


def test_out_of_range_feature_layer(model_dirs):
    with pytest.raises(DraftsmithError, match=r"feature_layers: 9 is out of range for a target with 2 layers"):
        Target.from_pretrained(model_dirs["target"], feature_layers=(9,))


def test_bare_boolean_flags_mean_true():
    from draftsmith.cli import _normalize

    assert _normalize(["quickstart", "--fast"]) == ["quickstart", "--fast=true"]
    assert _normalize(["generate", "--resume", "--max-new-tokens", "8"]) == [
        "generate",
        "--resume=true",
        "--max_new_tokens",
        "8",
    ]
    assert _normalize(["score", "--temperature", "-1"]) == ["score", "--temperature", "-1"]


@pytest.mark.parametrize("spec", ["ngram:x", "ngram:0", "ngram:2:3:4", "ngram:2:0"])
def test_bad_ngram_spec_is_refused_naming_the_forms(target, spec):
    from draftsmith.families.specs import load_drafter

    with pytest.raises(DraftsmithError, match="ngram:N:W"):
        load_drafter(spec, target)


def test_unknown_tree_kind_and_static_tree_without_accuracies_are_one_line_errors(
    model_dirs, prompt_file, tmp_path, capsys
):
    args = ["score", "--target", str(model_dirs["target"]), "--drafter", "ngram", "--prompts", str(prompt_file)]
    err = run_cli(capsys, *args, "--tree", "bushy", "--out", str(tmp_path / "a"))
    assert "--tree must be one of chain, static, dynamic, sampled, beam, got 'bushy'" in err
    err = run_cli(capsys, *args, "--tree", "dynamic", "--tree-size", "0", "--out", str(tmp_path / "b"))
    assert "--tree_size, --tree_top_k and --tree_beam_width must be positive, got 0, 4 and 4" in err
    from draftsmith.families.medusa.network import MedusaConfig, MedusaModel
    from draftsmith.layers.tree_draft import TreePolicy

    drafter = MedusaModel(MedusaConfig(num_heads=2, hidden_size=8, vocab_size=16)).as_drafter()
    with pytest.raises(DraftsmithError, match="--tree static needs the drafter's measured top-k accuracies"):
        drafter.set_tree(TreePolicy(TreeKind.STATIC), 4)


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_truncated_drafter_weights_are_one_line_naming_the_file(target, model_dirs, tmp_path, kind):
    if kind == "native":
        cfg = MedusaConfig(num_heads=2, hidden_size=target.hidden_size, vocab_size=target.vocab_size)
        drafter_dir = save_native(MedusaModel(cfg), target, tmp_path / "medusa")
    else:
        drafter_dir = Path(shutil.copytree(model_dirs["drafter"], tmp_path / "drafter"))
    weights = drafter_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(DraftsmithError, match="truncated or corrupt") as err:
        load_drafter(str(drafter_dir), target)
    assert str(weights) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["bfloat16", "bf16"])
def test_dtype_names_and_their_short_aliases_mean_the_same(name):
    from draftsmith.core.dtypes import canonical_dtype, torch_dtype

    assert canonical_dtype(name) == "bfloat16" and torch_dtype(name) is torch.bfloat16


def test_unknown_dtype_is_one_line_naming_the_flag_and_the_choices(model_dirs, prompt_file, tmp_path, capsys):
    args = ["generate", "--target", str(model_dirs["target"]), "--prompts", str(prompt_file)]
    err = run_cli(capsys, *args, "--out", str(tmp_path / "out"), "--dtype", "fp8")
    assert err.count("\n") == 1
    assert "--dtype must be one of float32, bfloat16, float16 (or fp32, bf16, fp16), got 'fp8'" in err
    with pytest.raises(DraftsmithError, match="features: dtype must be one of float16, bfloat16 .*got 'float32'"):
        from draftsmith.data.feature_cache import cache_features

        cache_features(resolve_target(str(model_dirs["target"])), tmp_path / "none", [1], dtype="float32")


@pytest.mark.parametrize("threshold", ["x", "1.5", "-0.1"])
def test_bad_confidence_threshold_is_refused_naming_the_form(model_dirs, target, threshold):
    from draftsmith.families.specs import load_drafter

    with pytest.raises(DraftsmithError, match="confidence:THRESHOLD:DRAFT_LM"):
        load_drafter(f"confidence:{threshold}:{model_dirs['drafter']}", target)


def test_confidence_stopping_on_a_drafter_that_is_no_draft_lm_is_one_line(model_dirs, prompt_file, tmp_path, capsys):
    args = ["score", "--target", str(model_dirs["target"]), "--prompts", str(prompt_file), "--out", str(tmp_path)]
    err = run_cli(capsys, *args, "--drafter", "confidence:0.4:ngram")
    assert "confidence stopping is for draft LMs, and ngram drafts with a NGramDrafter" in err


def test_confidence_spec_builds_a_draft_lm_that_stops_below_its_threshold(model_dirs, target):
    from draftsmith.families.specs import Confident, load_drafter, parse_spec
    from draftsmith.layers.causal_lm import DraftLM

    assert parse_spec(f"c=confidence:0.25:{model_dirs['drafter']}").spec == Confident(str(model_dirs["drafter"]), 0.25)
    assert parse_spec(f"confidence:{model_dirs['drafter']}").spec == Confident(str(model_dirs["drafter"]))
    drafter = load_drafter(f"confidence:0.25:{model_dirs['drafter']}", target)
    assert isinstance(drafter, DraftLM) and drafter.stop_below == 0.25


@pytest.mark.parametrize("suffix", ["float8", "fp8", "int4", "half"])
def test_target_spec_with_an_unknown_dtype_is_one_line_naming_the_dtypes(
    model_dirs, prompt_file, tmp_path, capsys, suffix
):
    """Not "is not a model directory", which hid the real mistake."""
    target = f"{model_dirs['target']}:{suffix}"
    err = run_cli(
        capsys, "score", "--target", target, "--drafter", "ngram", "--prompts", str(prompt_file), "--out", str(tmp_path)
    )
    assert err.count("\n") == 1 and f"{suffix!r} is no dtype" in err and "float32, bfloat16, float16, auto" in err


@pytest.mark.parametrize("cut", [0.5, 0.0])
def test_export_of_a_truncated_or_empty_checkpoint_is_one_line_naming_it(tmp_path, capsys, cut):
    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(64, 64)}, "hyper_parameters": {}}, ckpt)
    ckpt.write_bytes(ckpt.read_bytes()[: int(ckpt.stat().st_size * cut)])
    err = run_cli(capsys, "export", str(ckpt), "--to", "native", "--out", str(tmp_path / "out"))
    assert err.count("\n") == 1 and f"{ckpt}: cannot read the checkpoint (truncated or corrupt" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["import", "{tmp}/no-such-checkpoint", "--target", "default", "--out", "{tmp}/imported"],
        ["generate", "--target", "default", "--prompts", "{tmp}/no-such-prompts.jsonl", "--out", "{tmp}/data"],
        ["score", "--target", "default", "--drafter", "ngram", "--prompts", "{tmp}/no-such-prompts.jsonl"],
        ["score", "--target", "default", "--drafter", "mine={tmp}/no-such-drafter", "--prompts", "builtin:heldout"],
        ["score", "--target", "default", "--drafter", "rasd:{tmp}/no-such-drafter", "--prompts", "builtin:heldout"],
    ],
    ids=["import", "generate", "score-prompts", "score-drafter", "score-rasd-drafter"],
)
def test_a_wrong_path_is_named_before_the_default_target_is_built(tmp_path, monkeypatch, capsys, args):
    """The cheap inputs are checked first: building the default target takes minutes on 2 cores."""
    from draftsmith.targets import default

    def build(*_, **__):
        raise AssertionError("the default target was built before the wrong path was named")

    monkeypatch.setattr(default, "build", build)
    err = run_cli(capsys, *[a.format(tmp=tmp_path) for a in args])
    assert err.count("\n") == 1 and str(tmp_path / "no-such") in err


# -- a command that replaces an output keeps the old one until the new one is whole ------------------
@pytest.fixture
def medusa_dir(target, tmp_path) -> Path:
    cfg = MedusaConfig(num_heads=2, hidden_size=target.hidden_size, vocab_size=target.vocab_size)
    return save_native(MedusaModel(cfg), target, tmp_path / "medusa")


def files_of(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_a_refused_export_overwrite_keeps_the_old_export(medusa_dir, tmp_path, capsys):
    """``--overwrite`` deleted the old export, then refused the format: the user lost a good export."""
    out = tmp_path / "out"
    main(["export", str(medusa_dir), "--to", "native", "--out", str(out)])
    before = files_of(out)
    err = run_cli(capsys, "export", str(medusa_dir), "--to", "hf", "--out", str(out), "--overwrite")
    assert err.count("\n") == 1 and "--to hf cannot hold a medusa1 drafter" in err
    assert files_of(out) == before and not (tmp_path / "out.tmp").exists()


def test_an_export_that_fails_midway_keeps_the_old_export_and_leaves_no_tmp(medusa_dir, tmp_path, monkeypatch):
    from draftsmith.export import native
    from draftsmith.export.registry import write_export

    out = tmp_path / "out"
    write_export(medusa_dir, "native", out)
    before = files_of(out)

    def crash(*_, **__):
        raise RuntimeError("disk full")

    monkeypatch.setattr(native, "model_card", crash)  # after the weights are written
    with pytest.raises(RuntimeError, match="disk full"):
        write_export(medusa_dir, "native", out, overwrite=True)
    assert files_of(out) == before and not (tmp_path / "out.tmp").exists()
    monkeypatch.undo()
    command = write_export(medusa_dir, "native", out, overwrite=True)
    assert str(out) in command and ".tmp" not in command and ".tmp" not in (out / "manifest.json").read_text()


@pytest.mark.parametrize(
    "args",
    [
        ["import", "{src}", "--target", "default", "--out", "{out}"],
        ["s2d", "export", "--src", "{src}", "--depth", "1", "--target", "default", "--out", "{out}"],
    ],
    ids=["import", "s2d-export"],
)
def test_an_existing_out_needs_overwrite_before_the_target_is_built(tmp_path, monkeypatch, capsys, args):
    """``import`` and ``s2d export`` wrote into an existing ``--out`` (``save_native``) without asking."""
    from draftsmith.targets import default

    def build(*_, **__):
        raise AssertionError("the default target was built before --out was checked")

    monkeypatch.setattr(default, "build", build)
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "config.json").write_text("{}")
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    err = run_cli(capsys, *[a.format(src=src, out=out) for a in args])
    assert err.count("\n") == 1 and f"--out {out} exists" in err and "--overwrite" in err
    assert (out / "mine.txt").read_text() == "keep me"


# -- the bad inputs of issue 88: each one line, before any target is built ----------------------------
@pytest.fixture
def no_default_build(monkeypatch):
    """Building the default target takes minutes on 2 cores: a refusal must come before it."""
    from draftsmith.targets import default

    def build(*_, **__):
        raise AssertionError("the default target was built before the bad input was named")

    monkeypatch.setattr(default, "build", build)


def a_datastore(tmp_path: Path, name: str = "store") -> Path:
    from draftsmith.families.rasd.retrieval import SuffixIndex

    out = tmp_path / name
    SuffixIndex.build([[1, 2, 3, 4, 5, 6]]).save(out, {"format": 1, "fingerprint": {"name": "x"}})
    return out


@pytest.mark.parametrize(
    "case", ["no-tokens", "garbage-json", "empty-rasd", "empty-confidence", "empty-rasd-options", "rasd-nodes-bad"]
)
def test_a_bad_drafter_spec_or_datastore_is_one_line_before_the_target_is_built(
    tmp_path, capsys, no_default_build, case
):
    """A datastore missing ``tokens.npy`` or with a garbage ``datastore.json`` passed the path check and ended in a
    traceback; an empty ``rasd:`` / ``confidence:`` spec passed it too (``Path("")`` is the current dir)."""
    store = a_datastore(tmp_path)
    if case == "no-tokens":
        (store / "tokens.npy").unlink()
    if case == "garbage-json":
        (store / "datastore.json").write_text("{not json")
    drafter, expected = {
        "no-tokens": (f"rasd:datastore={store}:ngram", f"{store / 'tokens.npy'}"),
        "garbage-json": (f"rasd:datastore={store}:ngram", f"{store / 'datastore.json'} is not valid JSON"),
        "empty-rasd": ("rasd:", "names no drafter"),
        "empty-confidence": ("confidence:", "names no drafter"),
        "empty-rasd-options": ("rasd:nodes=4:", "names no drafter"),
        "rasd-nodes-bad": ("rasd:nodes=-1:ngram", "nodes and prune (>= 0"),
    }[case]
    err = run_cli(capsys, "score", "--target", "default", "--drafter", drafter, "--prompts", "builtin:heldout")
    assert err.count("\n") == 1 and expected in err, err


def test_rasd_nodes_0_means_the_model_drafter_alone_and_is_accepted():
    from draftsmith.families.specs import Rasd, parse_spec

    assert parse_spec("rasd:nodes=0:ngram").spec == Rasd("ngram", nodes=0)


def test_datastore_out_that_is_a_file_or_a_users_dir_is_one_line(tmp_path, capsys):
    """``datastore DATA --out EXISTING_FILE`` was a FileExistsError traceback."""
    data = tmp_path / "data"  # checked after --out: any path will do
    mine = tmp_path / "mine.txt"
    mine.write_text("keep me")
    err = run_cli(capsys, "datastore", str(data), "--out", str(mine))
    assert err.count("\n") == 1 and f"--out {mine} is a file" in err and mine.read_text() == "keep me"
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "notes.txt").write_text("keep me")
    err = run_cli(capsys, "datastore", str(data), "--out", str(tmp_path / "dir"))
    assert err.count("\n") == 1 and "holds other files than a datastore" in err


def test_export_out_that_is_a_file_is_one_line(medusa_dir, tmp_path, capsys):
    """``export C --to vllm --out A_FILE`` was a NotADirectoryError traceback."""
    mine = tmp_path / "a_file"
    mine.write_text("keep me")
    err = run_cli(capsys, "export", str(medusa_dir), "--to", "vllm", "--out", str(mine), "--overwrite")
    assert err.count("\n") == 1 and f"--out {mine} is a file" in err and mine.read_text() == "keep me"


@pytest.mark.parametrize(
    "args, expected",
    [
        (["tlt", "--drafter.init", "{tmp}/none"], "drafter.init: {tmp}/none does not exist"),
        (["tlt", "--rollout.temperature", "-1"], "rollout.temperature must be >= 0, got -1"),
        (["tlt", "--policy.update", "foo"], "tlt --policy.update: expected one of 'sft', 'grpo', got 'foo'"),
        (["pipeline", "--target", "default", "--hours", "abc"], "pipeline --hours: expected a float, got 'abc'"),
        (["pipeline", "--target", "default", "--heldout", "0"], "--heldout must be positive, got 0"),
        (["pipeline", "--target", "default", "--families", "bogus"], "--families bogus: not a family with a recipe"),
        (
            ["score", "--target", "default", "--drafter", "ngram", "--num-prompts", "-1"],
            "--num_prompts must be positive",
        ),
        (
            ["score", "--target", "default", "--drafter", "ngram", "--num-prompts", "0"],
            "--num_prompts must be positive",
        ),
    ],
    ids=[
        "tlt-init",
        "tlt-temperature",
        "tlt-update",
        "pipeline-hours",
        "pipeline-heldout",
        "pipeline-families",
        "score-num-prompts-negative",
        "score-num-prompts-0",
    ],  # fmt: skip
)
def test_a_bad_flag_value_is_one_line_naming_it_before_the_target_is_built(
    tmp_path, capsys, no_default_build, args, expected
):
    """These were a traceback, a misleading line (``--num-prompts -1`` dropped the last prompt, ``0`` scored all),
    usage text of 17-29 lines, or came after the target was built."""
    out = ["--out", str(tmp_path / "out")]
    err = run_cli(capsys, *[a.format(tmp=tmp_path) for a in args], *out)
    assert err.count("\n") == 1 and expected.format(tmp=tmp_path) in err, err


def test_score_refuses_a_prompt_beyond_the_targets_context_as_generate_does(model_dirs, tmp_path, capsys):
    """A 9,007-token prompt on a 2,048-token target was scored without a word (and a 4.4 MB one-line file printed
    nothing for 300 s); ``generate`` refused it: one check, shared."""
    import json

    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": " ".join(f"w{i % 90}" for i in range(600))}) + "\n")
    args = ["--target", str(model_dirs["target"]), "--prompts", str(prompts)]
    err = run_cli(capsys, "score", *args, "--drafter", "ngram", "--out", str(tmp_path / "score"))
    assert f"prompt 1 of {prompts} has 600 tokens, the target's context is 512" in err.splitlines()[-1]
    err = run_cli(capsys, "generate", *args, "--out", str(tmp_path / "data"))
    assert "reach the target's 512-token context" in err.splitlines()[-1]  # after transformers' loading bar


def test_the_speculators_harness_names_a_missing_draftsmith_python_in_one_line(tmp_path):
    """``engines/peers/speculators_train.py`` prepares its rows with draftsmith's Python first; run from a checkout
    without ``.venv`` (a worktree) it said so with a FileNotFoundError traceback after starting."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "engines" / "peers" / "speculators_train.py"
    cmd = [sys.executable, str(script), "--tokens", "10", "--out", str(tmp_path / "run")]
    proc = subprocess.run([*cmd, "--draftsmith-python", str(tmp_path / "nope")], capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        proc.stderr.strip()
        == f"--draftsmith-python {tmp_path / 'nope'}: no such Python (draftsmith's venv, made by `make setup`)"
    )
