"""Shared fixtures: tiny real models built in the test process (no network)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from draftsmith.core.target import Target

VOCAB = 96

MAX_WORKERS = 4
"""``make test`` runs the suite on one pytest-xdist worker per core, at most this many (each worker may load a real
SmolLM2 of its own: a few GiB)."""


def pytest_xdist_auto_num_workers(config) -> int:
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """``make engine-test`` runs on two workers (``--dist loadgroup``): every test that serves in vLLM on one, one
    engine at a time (each binds its threads to the cores), the peers' own code (speculators, SpecForge) on the
    other, beside it. A test is vLLM's when its id says so (its file or its name). First among the hooks: xdist's
    own reads the groups in this one (tests/test_engine_suite_grouping.py)."""
    for item in items:
        if item.get_closest_marker("engine"):
            item.add_marker(pytest.mark.xdist_group("vllm" if "vllm" in item.nodeid.lower() else "peers"))


if os.environ.get("PYTEST_XDIST_WORKER"):
    # the cores shared out between the workers: intra-op threads beyond a worker's share only contend, and the CLI
    # runs a test starts (subprocesses) take the same share
    _share = max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    torch.set_num_threads(_share)
    os.environ["OMP_NUM_THREADS"] = str(_share)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module (``pytestmark = pytest.mark.usefixtures("one_thread")``): tiny models
    gain nothing from intra-op threads and lose much when other jobs share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_tokenizer(vocab: int = VOCAB, salt: str = "") -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``vocab`` symbols; ``salt`` changes it (for mismatch tests)."""
    words = {f"w{salt}{i}": i for i in range(vocab - 2)}
    words.update({"<eos>": vocab - 2, "<unk>": vocab - 1})
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>")


def make_llama(seed: int, layers: int = 2, hidden: int = 64, vocab: int = VOCAB, eos: int | None = None):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=eos,
        bos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(cfg)
    # sharpen the random model so its distributions are peaked like a trained LM's
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.eval()


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def target(tokenizer) -> Target:
    return Target(make_llama(seed=0), tokenizer, feature_layers=(1, 2), name="tiny-target")


@pytest.fixture
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB - 2, (n,), generator=g).tolist() for n in (5, 9, 14)]


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory, tokenizer):
    """A saved tiny target, a drafter sharing its tokenizer, and one with another tokenizer."""
    root = tmp_path_factory.mktemp("models")
    dirs = {}
    for name, model, tok in [
        ("target", make_llama(seed=0), tokenizer),
        ("drafter", make_llama(seed=3, layers=1), tokenizer),
        ("foreign", make_llama(seed=3, layers=1), make_tokenizer(salt="x")),
        ("wide", make_llama(seed=3, layers=1, vocab=VOCAB + 32), make_tokenizer(vocab=VOCAB + 32)),
    ]:
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        dirs[name] = root / name
    return dirs


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "w1 w2 w3 w4"}\n{"prompt": "w5 w6 w7"}\n')
    return path


def kill_after_first_shard(cmd: list[str], out: Path, timeout: float, env: dict | None = None) -> int:
    """Start ``cmd`` (a ``draftsmith generate`` writing ``out``), SIGKILL it and every process it started as soon as
    its first shard is saved, and return how many shards were saved by then."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not (out / "shards" / "shard-00000").is_dir():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, f"no shard written in {timeout} s"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.stderr.close()
    return len(list((out / "shards").glob("shard-?????")))


def eagle3_case(root: Path, draft_vocab: int, length: int = 20, layers: tuple[int, ...] = (1, 2, 3), **options) -> dict:
    """A 4-layer tiny target at ``root/target`` and an EAGLE-3 drafter for it at ``root/native`` with a scattered
    draft vocabulary and perturbed weights (norms away from 1, so a dropped or doubled norm shows), and inputs for
    its training-time test: ``x`` (1, length) and the target's real ``features`` at ``layers``. ``options``: more
    ``EagleModule`` arguments (EAGLE-3.1's norms, ``num_layers``)."""
    from draftsmith.core.native import save_native
    from draftsmith.families.eagle.module import EagleModule

    target = make_llama(seed=0, layers=4)
    target.save_pretrained(root / "target")
    make_tokenizer().save_pretrained(root / "target")
    module = EagleModule(str(root / "target"), 3, list(layers), draft_vocab_size=draft_vocab, **options)
    network = module.drafter
    torch.manual_seed(0)
    with torch.no_grad():
        network.set_draft_vocab(torch.rand(VOCAB))  # scattered ids: d2t offsets all differ
        network.init_from_target(target.model.embed_tokens.weight, target.lm_head.weight)
        for name, p in network.named_parameters():
            if name != "embed_tokens.weight":
                p.add_(0.3 * torch.randn_like(p)) if "norm" in name else p.mul_(3.0)
    save_native(network, module.target, root / "native")
    x = torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden = target(x, output_hidden_states=True).hidden_states
    return {"root": root, "x": x, "features": tuple(hidden[i] for i in layers), "network": network.eval()}


@pytest.fixture(scope="session")
def speculators_fit(tmp_path_factory) -> tuple[Path, dict]:
    """vllm-project/speculators' own EAGLE-3 trainer (``engines/peers/speculators_train.py`` in its venv) run once per
    session on the packed SmolLM2 corpus's first 400 generated tokens: (its run dir, its ``fit.json``, whose
    ``checkpoint`` is the dir it wrote). 2 val rows, packed batches of 1024 tokens, a 16384-token draft vocabulary,
    the target's hidden states computed in float32, the rest their defaults (their bf16 autocast included). The
    vocabulary and dtype are the fixture's speed on a CPU without native bf16, where the step's [T, V] work and a bf16
    target forward are emulated: 132 s against 255 s at 32000 tokens and a bf16 target, alone on the 2-core EPYC. Engine tests only (their peers' group runs on one worker, so one fit serves them all);
    skips, saying why, where the peer's venv cannot be built."""
    from engines import peer_check

    root = Path(__file__).resolve().parents[1]
    python, why = peer_check.ensure_venv("speculators", root / ".venv-speculators")
    if python is None:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("speculators") / "run"
    cmd = [str(python), str(root / "engines" / "peers" / "speculators_train.py"), "--tokens", "400"]
    cmd += ["--epochs", "1", "--val-rows", "2", "--total-seq-len", "1024", "--draft-vocab-size", "16384"]
    cmd += ["--target-dtype", "float32"]
    cmd += ["--out", str(out)]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return out, json.loads((out / "fit.json").read_text())
