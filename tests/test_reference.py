"""draftsmith's target against the model as its authors run it: for every architecture of the matrix
(``test_architectures.ARCHITECTURES``), in float32 and in bfloat16 (batch-invariant, draftsmith's default there),
``Target`` logits within rounding of HF's eager forward (``attn_implementation="eager"``) of the same weights and
dtype, and plain greedy decoding equal to HF ``generate`` (greedy), in bfloat16 up to near-ties."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf
from test_architectures import ARCHITECTURES, LLAMA_LIKE, PROMPTS, build, hf_generate

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.decode.verifier import plain_decode
from draftsmith.errors import DraftsmithError

pytestmark = pytest.mark.usefixtures("one_thread")

SHARP = {"initializer_range": 0.2}
"""Weights ten times the usual random init's: attention scores large enough that each query attends to a few keys
(at 0.02 every query spreads evenly over its keys, and an attention that scaled, capped or masked its scores wrongly
could go unseen)."""
OVERRIDES = {"gemma2": {"attn_logit_softcapping": 1.0}}
"""A soft-cap that binds (Gemma-2's default of 50 moves these models' logits by less than their rounding scale)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ULPS = {torch.float32: 16, torch.bfloat16: 4}
"""Rounding scale of the logits: this many units in the last place (eps times the value) of the largest logit. In
float32 the target's attention (SDPA) sums in other orders than eager attention at every step and nothing rounds
the differences away (a few units, measured here). In bfloat16 every op rounds its output to 8 bits, and
batch-invariant attention, eager attention padded to other shapes, may round a value once differently per kernel;
a few such roundings through two layers stay within 4 units (0.75 for bf16 Gemma-2's logits of up to 24; with its
soft-cap of 1 ignored they were off by 3.4)."""


def rounding(logits: torch.Tensor, dtype: torch.dtype) -> float:
    """``ULPS[dtype]`` units in the last place of the largest of ``logits`` computed in ``dtype``."""
    return ULPS[dtype] * torch.finfo(dtype).eps * float(logits.abs().max())


@pytest.fixture(scope="module", params=[(a, d) for a in ARCHITECTURES for d in DTYPES], ids="-".join)
def pair(request) -> tuple[torch.nn.Module, Target]:
    """HF's eager model and draftsmith's target (its default attention) of the same weights and dtype."""
    name, dtype = request.param
    model = build(ARCHITECTURES[name], seed=1, **SHARP, **OVERRIDES.get(name, {})).to(DTYPES[dtype])
    reference = copy.deepcopy(model)
    reference.set_attn_implementation("eager")
    return reference, Target(model, name=name)


def test_target_logits_are_hf_eager_logits_within_rounding(pair):
    reference, target = pair
    assert target.batch_invariant == (target.dtype == "bfloat16")
    ids = torch.tensor([PROMPTS[0] + PROMPTS[1]])  # longer than the sliding windows
    with torch.no_grad():
        expected = reference(input_ids=ids).logits.float()
    tol = rounding(expected, reference.dtype)
    torch.testing.assert_close(target(ids, with_features=False).logits, expected, rtol=0, atol=tol)


def test_plain_greedy_output_is_hf_generate_up_to_near_ties(pair):
    """Float32: the same tokens. Bfloat16: the same tokens, or a first divergence where HF's own top two logits lie
    within twice the logits' rounding (each of the two may move by the rounding, so either order is HF's up to it)."""
    reference, target = pair
    for prompt in PROMPTS:
        expected = hf_generate(reference, prompt, 30)
        got = plain_decode(target, prompt, 30, Sampling()).tokens
        if got == expected:
            continue
        i = next(i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b)
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([prompt + expected[:i]])).logits[0, -1].float()
        top = logits.topk(2).values
        gap, tie = float(top[0] - top[1]), 2 * rounding(logits, reference.dtype)
        assert reference.dtype == torch.bfloat16 and gap <= tie, f"diverges at {i}: top-2 gap {gap:.4f} > {tie:.4f}"


def test_batch_invariant_attention_refuses_in_one_line_what_it_does_not_compute():
    """gpt-oss's attention sinks (``s_aux``), dropout in training and GPT-2's float32 scores
    (``reorder_and_upcast_attn``, which HF applies only under ``eager``) are refused, naming the keyword and the
    model, instead of silently computed otherwise."""
    oss = tf.GptOssForCausalLM(
        tf.GptOssConfig(vocab_size=96, **LLAMA_LIKE, head_dim=16, num_local_experts=2, num_experts_per_tok=1)
    )
    gpt2 = build(ARCHITECTURES["gpt2"], seed=0, reorder_and_upcast_attn=True)
    dropping = build(ARCHITECTURES["llama"], seed=0, attention_dropout=0.1)
    cases = [(oss, "GptOssAttention .*'s_aux'"), (gpt2, "GPT2Attention .*reorder_and_upcast_attn")]
    cases.append((dropping, "LlamaAttention runs attention dropout 0.1 in training"))
    for model, message in cases:
        target = Target(model.to(torch.bfloat16))
        model.train(model is dropping)
        with pytest.raises(DraftsmithError, match=message) as e:
            target(torch.tensor([[1, 2, 3]]), with_features=False)
        assert "\n" not in str(e.value)
