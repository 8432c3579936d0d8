"""The verifier on a CUDA GPU (skipped without one): exact greedy output and lossless sampling with the target and
the drafter on the GPU, in float32 and in bfloat16 (batch-invariant numerics). The training strategies that need a
GPU (FSDP, DeepSpeed) are tested in ``test_train.py``."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_llama
from test_bf16 import WIDE_V, step_and_block_logits, wide_bf16_llama
from test_verifier import SMALL_V, chi_square_pvalue, exact_pair_distribution, sampled_pairs

from draftsmith.cli import main
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.families.ngram.drafter import NGramDrafter
from draftsmith.layers.causal_lm import DraftLM

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def gpu_target(request) -> Target:
    model = wide_bf16_llama().to(getattr(torch, request.param)).to("cuda")
    return Target(model, name=f"wide-{request.param}-cuda")


def test_gpu_target_verification_rows_equal_one_token_steps_bit_for_bit(gpu_target):
    assert gpu_target.batch_invariant == (gpu_target.dtype == "bfloat16")
    if not gpu_target.batch_invariant:
        pytest.skip("float32 runs the fast kernels: its rows agree to rounding (~1e-6), not bit for bit")
    ids = torch.randint(0, WIDE_V, (1, 160), generator=torch.Generator().manual_seed(0))
    for past in (7, 140):
        steps, block = step_and_block_logits(gpu_target, ids, past, 8)
        print(gpu_target.dtype, past, "max |step - block|", float((steps - block).abs().max()))
        assert torch.equal(steps, block)


@pytest.mark.parametrize("drafter_kind", ["ngram", "noisy_lm"])
@pytest.mark.parametrize("k", [2, 5])
def test_gpu_greedy_speculative_output_equals_plain_greedy(gpu_target, drafter_kind, k):
    drafter = {
        "ngram": lambda: NGramDrafter(max_ngram=2),
        "noisy_lm": lambda: DraftLM(make_llama(seed=5, layers=1, hidden=32, vocab=WIDE_V).to("cuda")),
    }[drafter_kind]()
    decoder = SpeculativeDecoder(gpu_target, drafter, k, Sampling())
    g = torch.Generator().manual_seed(1)
    for n in (6, 40, 120):
        prompt = torch.randint(0, WIDE_V, (n,), generator=g).tolist()
        prompt = prompt + prompt[: n // 2]
        assert decoder.generate(prompt, 40).tokens == plain_decode(gpu_target, prompt, 40, Sampling()).tokens


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_speculative_sampling_is_distributed_as_the_target(dtype):
    """A GPU target and drafter, the caller's CPU generator: the pairs (x1, x2) follow the target's distribution."""
    target = Target(make_llama(seed=11, layers=1, hidden=32, vocab=SMALL_V).to(getattr(torch, dtype)).to("cuda"))
    target.model.lm_head.weight.data.mul_(0.15)
    drafter = DraftLM(make_llama(seed=12, layers=1, hidden=32, vocab=SMALL_V).to("cuda"))
    sampling = Sampling(temperature=1.0)
    counts = sampled_pairs(target, drafter, [1, 2, 3], sampling, 1500)
    expected = exact_pair_distribution(target, [1, 2, 3], sampling).cpu()
    assert chi_square_pvalue(counts, expected) > 1e-3


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_score_cli_on_a_gpu_scores_a_draft_model_and_the_ngram_drafter(model_dirs, prompt_file, tmp_path, temperature):
    """``draftsmith score --device cuda`` as a user runs it: the target and a draft-model directory on the GPU, the
    report's device says so, greedy output is exact, and a seeded sampled run gives the same tokens twice."""
    args = ["score", "--target", str(model_dirs["target"]), "--drafter", f"[ngram,{model_dirs['drafter']}]"]
    args += ["--prompts", str(prompt_file), "--device", "cuda", "--temperature", str(temperature)]
    args += ["--max-new-tokens", "16"]
    reports = []
    for run in ("a", "b"):
        main([*args, "--out", str(tmp_path / run)])
        reports.append(json.loads((tmp_path / run / "report.json").read_text()))
    assert reports[0]["config"]["device"].startswith("cuda:0 (")
    rows = [{r["name"]: r for r in report["drafters"]} for report in reports]
    assert set(rows[0]) == {"ngram", str(model_dirs["drafter"])}
    for name, row in rows[0].items():
        if temperature == 0:
            assert row["greedy_exact"] == 2, name
        assert row["tau"] == rows[1][name]["tau"], name  # seeded: the same rounds on a second run
