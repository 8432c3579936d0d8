"""A bfloat16 target: exact greedy output (batch-invariant numerics), lossless sampling, dtype in the fingerprint,
the dtype spec and ``auto``, and the report's divergence diagnosis."""

from __future__ import annotations

import copy
import functools
import json
import random

import pytest
import torch
from conftest import make_llama
from test_verifier import SMALL_V, depth_pvalues, sampled_triples
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.pytorch_utils import Conv1D

from draftsmith import targets
from draftsmith.core import machine, numerics
from draftsmith.core.draft import DecodeResult
from draftsmith.core.fingerprint import ALLOW_DTYPE_MISMATCH, check_fingerprint
from draftsmith.core.numerics import INVARIANT_ATTENTION, invariant_attention, is_batch_invariant, make_batch_invariant
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target, rollback
from draftsmith.decode import auto_k
from draftsmith.decode import verifier as verifier_module
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.eval.score import divergences, score_drafters
from draftsmith.families.ngram.drafter import NGramDrafter
from draftsmith.layers.causal_lm import DraftLM
from draftsmith.layers.tree_draft import TreeKind, TreePolicy

WIDE_V = 512


def wide_bf16_llama(seed: int = 0) -> LlamaForCausalLM:
    """Two layers of SmolLM2's widths (576 hidden, 1,536 MLP, 9/3 heads) in bf16: wide enough that the CPU's bf16
    kernels round a one-row Linear differently from a many-row one (measured here: up to 0.014 in the logits)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=WIDE_V,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=2,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=512,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return model.to(torch.bfloat16).eval()


@pytest.fixture(scope="module")
def bf16_target() -> Target:
    return Target(wide_bf16_llama(), name="wide-bf16")


def step_and_block_logits(target: Target, ids: torch.Tensor, past: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of ``n`` tokens after ``past`` cached ones: one-token steps (plain decoding) and one forward (a
    verification)."""
    cache = target.new_cache()
    target(ids[:, :past], cache, with_features=False)
    steps = torch.stack(
        [target(ids[:, past + j : past + j + 1], cache, with_features=False).logits[0, -1] for j in range(n)]
    )
    rollback(cache, past)
    return steps, target(ids[:, past : past + n], cache, with_features=False).logits[0]


def test_bf16_target_is_batch_invariant_by_default_and_float32_is_not_changed(bf16_target, target):
    assert bf16_target.dtype == "bfloat16" and bf16_target.batch_invariant
    assert bf16_target.model.config._attn_implementation == INVARIANT_ATTENTION
    assert target.dtype == "float32" and not target.batch_invariant


def test_batch_invariant_bf16_verification_rows_equal_one_token_steps_bit_for_bit(bf16_target):
    ids = torch.randint(0, WIDE_V, (1, 160), generator=torch.Generator().manual_seed(0))
    for past in (7, 140):
        steps, block = step_and_block_logits(bf16_target, ids, past, 8)
        assert torch.equal(steps, block)


@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_batch_invariant_linear_gives_a_row_alone_the_value_it_gets_among_others(kind):
    """A Linear, and GPT-2's ``Conv1D`` (``x @ weight + bias``, one ``addmm``), of SmolLM2's MLP down-projection."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(1536, 576, bias=False) if kind == "linear" else Conv1D(576, 1536)
    if kind == "conv1d":
        torch.nn.init.normal_(linear.weight, std=0.05)
        torch.nn.init.normal_(linear.bias)
    layer = torch.nn.Sequential(linear).to(torch.bfloat16)
    x = (torch.randn(8, 1536) * 0.5).to(torch.bfloat16)
    with torch.no_grad():
        raw = torch.cat([layer(x[i : i + 1]) for i in range(8)])
        make_batch_invariant(layer)
        alone = torch.cat([layer(x[i : i + 1]) for i in range(8)])
        together = layer(x)
    assert torch.equal(alone, together)
    if torch.equal(raw, together):
        pytest.skip("this machine's one-row bf16 Linear already rounds as the many-row one")


def test_a_one_row_linear_runs_as_one_row_only_where_the_probe_found_it_rounds_as_among_many(monkeypatch):
    """``numerics._one_row_as_many``: a kernel that rounds a row alone otherwise than among others (here one row's
    outputs nudged by 1%) is caught; on this machine a batch-invariant one-row bf16 call runs one row where the
    probe passed (the AVX2-only EPYC), two where it did not, the pre-packed kernel where oneDNN has bf16 kernels,
    and its row equals that row among 65 either way."""
    from draftsmith.core import numerics

    real = torch.nn.functional.linear

    def nudged(x, weight, bias=None):
        out = real(x, weight, bias)
        return (out.float() * 1.01).to(out.dtype) if x.shape[0] == 1 else out

    numerics._one_row_as_many.cache_clear()
    monkeypatch.setattr(torch.nn.functional, "linear", nudged)
    assert not numerics._one_row_as_many(64, 32, False, torch.bfloat16)
    numerics._one_row_as_many.cache_clear()
    rows_seen = []

    def recorded(x, weight, bias=None):
        rows_seen.append(x.reshape(-1, x.shape[-1]).shape[0])
        return real(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", recorded)
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(1536, 576, bias=False)).to(torch.bfloat16)
    make_batch_invariant(layer)
    x = torch.randn(65, 1536).to(torch.bfloat16)
    probed = numerics._one_row_as_many(1536, 576, False, torch.bfloat16)  # with the real kernel
    with torch.no_grad():
        among = layer(x)
        rows_seen.clear()
        alone = layer(x[:1])
        packed = numerics._packs_bf16(layer[0].weight)  # asked as the call was: without grad
    assert torch.equal(alone, among[:1])
    assert rows_seen == ([] if packed else [1] if probed else [2])


@pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="this CPU's oneDNN has no bf16 kernels to pre-pack for"
)
def test_batch_invariant_bf16_linear_runs_prepacked_row_invariant_with_the_bits_of_f_linear_at_round_widths():
    """The pre-packed bf16 Linear (oneDNN's blocked weight): each row alone (a decode step) equals it among the rows
    of the largest verification block (the largest static tree of ``auto_k.TREE_SIZES`` and its root: 65 rows),
    equals ``F.linear`` at 2 to 32 rows (chains up to K = 31, trees up to 31 nodes), and a weight written in place
    is packed again. The packed kernel alone on one row differs from it among many (7 of 64 rows on the EPYC):
    computing a single row as two is what this checks. From 33 rows ``F.linear`` may take another path than the
    packed kernel (the AMX Xeon, torch 2.13: SmolLM2's Linear shapes but one)."""
    torch.manual_seed(0)
    widest = max(auto_k.TREE_SIZES) + 1
    linear = torch.nn.Linear(1536, 576, bias=True).to(torch.bfloat16)
    x = (torch.randn(widest, 1536) * 0.5).to(torch.bfloat16)
    make_batch_invariant(linear)
    with torch.no_grad():
        alone = torch.cat([linear(x[i : i + 1]) for i in range(widest)])
        together = linear(x)
        assert linear in numerics._PACKED
        assert torch.equal(alone, together)
        for n in range(2, 33):
            assert torch.equal(linear(x[:n]), torch.nn.functional.linear(x[:n], linear.weight, linear.bias)), n
        linear.weight.mul_(2)
        assert torch.equal(linear(x[:9]), torch.nn.functional.linear(x[:9], linear.weight, linear.bias))
        packed = linear(x[:2])
        assert torch.equal(copy.deepcopy(linear)(x), linear(x))  # a copy (no opaque tensor to copy) packs its own
    out = linear(x[:2])  # gradients asked of the weight: F.linear's path, the same bits
    assert out.requires_grad and torch.equal(out.detach(), packed)


def block_and_alone(attention, kv: int, n: int, masked: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """SmolLM2-shaped attention (9 query heads over 3 key heads of 64) in bf16: ``n`` queries at the end of ``kv``
    keys in one call (a verification block; with HF's additive causal mask when ``masked``), and each computed
    alone over the keys up to its position (the one-token step there)."""
    g = torch.Generator().manual_seed(kv * 100 + n)
    q = torch.randn(1, n, 9, 64, generator=g).to(torch.bfloat16).transpose(1, 2)  # as HF's layers pass it: strided
    k, v = (torch.randn(1, 3, kv, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    module = torch.nn.Module()
    module.num_key_value_groups, module.training = 3, False
    mask = None
    if masked:
        seen = torch.arange(kv) <= torch.arange(kv - n, kv)[:, None]
        mask = torch.where(seen, 0.0, torch.finfo(torch.bfloat16).min).to(torch.bfloat16)[None, None]
    block = attention(module, q, k, v, mask, 0.125)[0][0]
    alone = torch.stack([attention(module, q[:, :, j : j + 1], k[:, :, : kv - n + j + 1], v[:, :, : kv - n + j + 1],
                                   None, 0.125)[0][0, 0] for j in range(n)])  # fmt: skip
    return block, alone


SWEEP = [(kv, n) for n in (5, 8, 12) for kv in range(n, 200, 3)]
"""Cache lengths and block sizes: a rounding difference survives the bf16 cast of the softmax in few of them."""


@pytest.mark.parametrize("softcap", [None, 2.0], ids=["fused", "eager-softcap"])
def test_invariant_attention_gives_a_block_query_the_value_of_its_one_token_step(softcap):
    """Both of ``_attend``'s paths: the fused SDPA kernel (a CPU, no soft-cap) and HF's eager order (a soft-cap)."""
    attention = functools.partial(invariant_attention, softcap=softcap)
    for kv, n in SWEEP:
        for masked in (False, True):
            block, alone = block_and_alone(attention, kv, n, masked)
            assert torch.equal(block, alone), (kv, n, masked)


def tree_block_and_alone(trial: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random tree of ``n`` queries after a random cache in one call (its additive tree mask: the cache and each
    query's ancestors, listed before it), and each query computed alone over the cache and its ancestors at
    consecutive positions (the one-token step it stands for), SmolLM2-shaped in bf16."""
    rnd = random.Random(trial)
    n, past = rnd.choice([4, 9, 17, 33]), rnd.randrange(5, 300)
    parents = [-1] + [rnd.randrange(-1, j) for j in range(1, n)]
    kv = past + n
    g = torch.Generator().manual_seed(trial)
    q = torch.randn(1, n, 9, 64, generator=g).to(torch.bfloat16).transpose(1, 2)
    k, v = (torch.randn(1, 3, kv, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    module = torch.nn.Module()
    module.num_key_value_groups, module.training = 3, False
    paths = []
    for j in range(n):
        path = [j]
        while parents[path[-1]] != -1:
            path.append(parents[path[-1]])
        paths.append(path[::-1])
    seen = torch.zeros(n, kv, dtype=torch.bool)
    seen[:, :past] = True
    for j, path in enumerate(paths):
        seen[j, [past + a for a in path]] = True
    mask = torch.where(seen, 0.0, torch.finfo(torch.bfloat16).min).to(torch.bfloat16)[None, None]
    block = invariant_attention(module, q, k, v, mask, 0.125)[0][0]
    alone = []
    for j, path in enumerate(paths):
        keys = list(range(past)) + [past + a for a in path]
        alone.append(
            invariant_attention(module, q[:, :, j : j + 1], k[:, :, keys], v[:, :, keys], None, 0.125)[0][0, 0]
        )
    return block, torch.stack(alone)


def test_invariant_attention_gives_a_tree_query_the_value_of_its_one_token_step(monkeypatch):
    """A tree's query sees its ancestors at block places other than the consecutive positions its one-token step
    sees them at; ``_tree_groups`` lays each query's keys out as that step does, so every row is the step's, bit
    for bit. The negative control: the same trees through the chain layout (tree groups off) leave some rows
    another rounding here (skipped where this machine's kernels happen to agree)."""
    trials = range(120)
    for trial in trials:
        block, alone = tree_block_and_alone(trial)
        assert torch.equal(block, alone), trial
    monkeypatch.setattr(numerics, "_tree_groups", lambda *args: None)
    differ = [t for t in trials if not torch.equal(*tree_block_and_alone(t))]
    if not differ:
        pytest.skip("this machine's kernels give a tree query the step's value in the chain layout too")
    assert differ


def test_invariant_attention_builds_a_forwards_masks_once_per_model_and_never_reuses_another_masks():
    """Every layer of one forward passes the same mask tensor (one per layer type): its groups are built once, kept
    in the model's own ``MaskCache`` while the mask lives, the masks of both layer types of a mixed model at once. A
    new mask of the same shape (the next round's tree) gets its own, whatever the last call built; another model
    shares nothing."""
    from draftsmith.core import numerics

    g = torch.Generator().manual_seed(0)
    kv, n = 70, 5
    q = torch.randn(1, 9, n, 64, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(1, 3, kv, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    model, twin = (torch.nn.Sequential(torch.nn.Module(), torch.nn.Module()) for _ in range(2))  # two layers each
    for m in (model, twin):
        make_batch_invariant(m)
        for layer in m:
            layer.num_key_value_groups, layer.training = 3, False
    cache = getattr(model[0], numerics.MASK_CACHE)
    assert getattr(model[1], numerics.MASK_CACHE) is cache and getattr(twin[0], numerics.MASK_CACHE) is not cache
    seen = torch.arange(kv) <= torch.arange(kv - n, kv)[:, None]
    lowest = torch.finfo(torch.bfloat16).min
    causal = torch.where(seen, 0.0, lowest).to(torch.bfloat16)[None, None]
    other = causal.clone()
    other[..., kv - n - 1] = lowest  # the same shape, one more key hidden from every query

    def groups(mask, cache):
        return numerics._group_masks(mask, 1, n, kv, torch.bfloat16, torch.device("cpu"), cache=cache)

    first = groups(causal, cache)
    with_causal = invariant_attention(model[0], q, k, v, causal, 0.125)[0]
    with_other = invariant_attention(model[1], q, k, v, other, 0.125)[0]
    assert groups(causal, cache) is first  # kept beside the other mask, for every layer of its type
    assert groups(causal, getattr(twin[0], numerics.MASK_CACHE)) is not first
    numerics.forget_masks(model)
    assert groups(causal, cache) is not first
    assert torch.equal(with_other, invariant_attention(model[0], q, k, v, other, 0.125)[0])
    assert not torch.equal(with_causal, with_other)


def test_eager_attention_rounds_a_block_query_differently_here():
    """What ``invariant_attention`` fixes: HF's eager attention gives a query of a block other values than its
    one-token step here (on an AMX CPU; skipped on a machine whose kernels happen to agree)."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    differ = [(kv, n) for kv, n in SWEEP if not torch.equal(*block_and_alone(eager_attention_forward, kv, n, True))]
    if not differ:
        pytest.skip("this machine's bf16 eager attention is row-invariant without help")
    assert 0 < len(differ) < len(SWEEP)


def test_fast_bf16_kernels_round_rows_differently_here():
    """What batch invariance fixes: without it, this machine's bf16 kernels give a verification row other values
    than the same row computed alone (skipped on a machine whose kernels happen to agree)."""
    fast = Target(wide_bf16_llama(), batch_invariant=False)
    assert not is_batch_invariant(fast.model)
    ids = torch.randint(0, WIDE_V, (1, 160), generator=torch.Generator().manual_seed(0))
    steps, block = step_and_block_logits(fast, ids, 140, 8)
    if torch.equal(steps, block):
        pytest.skip("this machine's bf16 kernels are row-invariant without help")
    assert (steps - block).abs().max() > 0


def greedy_runs(target: Target, drafter_kind: str, k: int):
    """Greedy speculative decoding (``drafter_kind``, ``k``) and plain greedy decoding of three prompts of 6, 40 and
    120 tokens (each with a repeat), 40 new tokens: ``(prompt length, speculative result, plain tokens)`` each."""
    drafter = {
        "ngram": lambda: NGramDrafter(max_ngram=2),
        "noisy_lm": lambda: DraftLM(make_llama(seed=5, layers=1, hidden=32, vocab=WIDE_V)),
        "self": lambda: DraftLM(target.model),
    }[drafter_kind]()
    decoder = SpeculativeDecoder(target, drafter, k, Sampling())
    g = torch.Generator().manual_seed(1)
    for n in (6, 40, 120):
        prompt = torch.randint(0, WIDE_V, (n,), generator=g).tolist()
        prompt = prompt + prompt[: n // 2]  # repeats give the n-gram drafter something to propose
        yield n, decoder.generate(prompt, 40), plain_decode(target, prompt, 40, Sampling()).tokens


@pytest.mark.parametrize("drafter_kind", ["ngram", "noisy_lm", "self"])
@pytest.mark.parametrize("k", [2, 5])
def test_bf16_greedy_speculative_output_equals_plain_greedy(bf16_target, drafter_kind, k):
    for n, spec, plain in greedy_runs(bf16_target, drafter_kind, k):
        assert spec.tokens == plain, f"the {n}-token prompt"
        if drafter_kind == "self":
            assert all(a == d for a, d in zip(spec.accepted, spec.drafted, strict=True))


@pytest.mark.parametrize("drafter_kind", ["noisy_lm", "self", "ngram"])
def test_bf16_greedy_tree_speculative_output_equals_plain_greedy(bf16_target, drafter_kind):
    """Dynamic trees (draft LMs) and n-gram trees of several continuations verified by the batch-invariant bf16
    target: the tree's queries are laid out per path (``numerics._tree_groups``), so greedy output is plain
    greedy's token for token."""
    if drafter_kind == "ngram":
        drafter = NGramDrafter(max_ngram=2, width=3)
    else:
        lm = bf16_target.model if drafter_kind == "self" else make_llama(seed=5, layers=1, hidden=32, vocab=WIDE_V)
        drafter = DraftLM(lm)
        drafter.set_tree(TreePolicy(TreeKind.DYNAMIC, 12, 3), 4)
    decoder = SpeculativeDecoder(bf16_target, drafter, 4, Sampling())
    g, widest = torch.Generator().manual_seed(2), 0
    for n in (6, 40, 120):
        prompt = torch.randint(0, WIDE_V, (n,), generator=g).tolist()
        prompt = prompt + prompt[: n // 2]
        spec = decoder.generate(prompt, 40)
        assert spec.tokens == plain_decode(bf16_target, prompt, 40, Sampling()).tokens, f"the {n}-token prompt"
        widest = max(widest, *spec.drafted)
    assert widest > 4  # trees: more candidates in a round than a chain of 4


def test_without_batch_invariance_bf16_greedy_speculative_output_leaves_plain_greedy():
    """The negative control of the test above: the same model, drafter and prompts with the fast kernels (SDPA, a
    one-row Linear) find a prompt where greedy speculative decoding leaves plain greedy decoding (on the AMD EPYC
    with avx512_bf16: the 40-token prompt, at its 18th new token), so that test fails on the bug it targets. Skipped
    on a machine whose bf16 kernels round a row alone as among others, and where bf16 is emulated (seen on an AMD
    EPYC with avx2 only: its kernels' rows differ, yet no greedy token of these prompts flips)."""
    fast = Target(wide_bf16_llama(), name="wide-bf16", batch_invariant=False)
    assert not fast.batch_invariant
    diverged = [n for n, spec, plain in greedy_runs(fast, "ngram", 2) if spec.tokens != plain]
    ids = torch.randint(0, WIDE_V, (1, 160), generator=torch.Generator().manual_seed(0))
    if not diverged:
        steps, block = step_and_block_logits(fast, ids, 140, 8)
        if torch.equal(steps, block):
            pytest.skip("this machine's bf16 kernels are row-invariant without help")
        native, why = machine.native_bf16()
        if not native:
            gap = float((steps.float() - block.float()).abs().max())
            pytest.skip(f"bf16 is emulated here ({why}): rows differ by up to {gap:.3g} without a greedy flip")
    assert diverged


@pytest.fixture(scope="module")
def small_bf16_pair():
    target = Target(make_llama(seed=11, layers=1, hidden=32, vocab=SMALL_V).to(torch.bfloat16))
    drafter = DraftLM(make_llama(seed=12, layers=1, hidden=32, vocab=SMALL_V))
    target.model.lm_head.weight.data.mul_(0.15)
    return target, drafter


def test_bf16_speculative_sampling_is_distributed_as_the_target(small_bf16_pair):
    target, drafter = small_bf16_pair
    sampling = Sampling(temperature=1.0)
    depth1, depth2 = depth_pvalues(
        target, [1, 2, 3], sampling, sampled_triples(target, drafter, [1, 2, 3], sampling, 1500)
    )
    assert depth1 > 1e-3 and depth2 > 1e-3  # the chain's first and second draft positions


def test_bf16_chi_square_catches_a_wrong_acceptance_rule(small_bf16_pair, monkeypatch):
    def broken(p, q, draft, generator):  # resamples from p after a rejection instead of the residual
        for i, d in enumerate(draft):
            if torch.rand((), generator=generator) * q[i, d] < p[i, d]:
                continue
            return i, int(torch.multinomial(p[i], 1, generator=generator))
        return len(draft), int(torch.multinomial(p[len(draft)], 1, generator=generator))

    monkeypatch.setattr(verifier_module, "verify_chain_sampling", broken)
    target, drafter = small_bf16_pair
    sampling = Sampling(temperature=1.0)
    depth1, depth2 = depth_pvalues(
        target, [1, 2, 3], sampling, sampled_triples(target, drafter, [1, 2, 3], sampling, 1500)
    )
    assert min(depth1, depth2) < 1e-3


def test_dtype_is_part_of_the_fingerprint_and_a_mismatch_is_one_line_naming_both(bf16_target, monkeypatch, capsys):
    fp32 = Target(wide_bf16_llama().float(), name="wide-bf16")
    made, used = fp32.fingerprint, bf16_target.fingerprint
    assert made["dtype"] == "float32" and used["dtype"] == "bfloat16"
    with pytest.raises(DraftsmithError, match=r"in float32 but is used with it in bfloat16.*--dtype float32") as e:
        check_fingerprint(made, used, "feature cache X")
    assert "\n" not in str(e.value)
    legacy = {k: v for k, v in made.items() if k != "dtype"}  # made before dtypes were recorded: float32
    check_fingerprint(legacy, fp32.fingerprint, "old data")
    with pytest.raises(DraftsmithError, match="in float32 but is used with it in bfloat16"):
        check_fingerprint(legacy, used, "old data")
    monkeypatch.setenv(ALLOW_DTYPE_MISMATCH, "1")
    check_fingerprint(made, used, "feature cache X")
    assert "warning: feature cache X was made with the target in float32" in capsys.readouterr().out


def test_target_spec_carries_the_dtype():
    assert targets.parse_target("smollm2") == targets.TargetSpec("smollm2", "auto")
    assert targets.parse_target("smollm2:bf16") == targets.TargetSpec("smollm2", "bfloat16")
    assert targets.parse_target("runs/m:float32", "bfloat16") == targets.TargetSpec("runs/m", "bfloat16")
    assert targets.parse_target("dir:with:colons") == targets.TargetSpec("dir:with:colons", "auto")
    assert str(targets.TargetSpec("smollm2", "bfloat16")) == "smollm2:bfloat16"
    with pytest.raises(DraftsmithError, match="--dtype must be one of float32, bfloat16, float16"):
        targets.parse_target("smollm2", "int8")


def test_auto_dtype_is_the_checkpoints_in_bf16_only_where_native(tmp_path, monkeypatch, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    spec = targets.parse_target(str(tmp_path))
    monkeypatch.setattr(machine, "native_bf16", lambda device="cpu": (True, "the CPU has avx512_bf16"))
    assert targets.target_dtype(spec, tmp_path) == "bfloat16"
    monkeypatch.setattr(machine, "native_bf16", lambda device="cpu": (False, "the CPU has no native bf16"))
    assert targets.target_dtype(spec, tmp_path) == "float32"
    assert "--dtype auto: float32, as the CPU has no native bf16" in capsys.readouterr().out
    assert targets.target_dtype(targets.parse_target(f"{tmp_path}:bfloat16"), tmp_path) == "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    assert targets.target_dtype(spec, tmp_path) == "float32"
    assert targets.checkpoint_dtype(targets.parse_target("smollm2"), tmp_path) == "bfloat16"


def test_a_resolved_target_is_loaded_as_it_is_below_the_entry(tmp_path, monkeypatch, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    monkeypatch.setattr(machine, "native_bf16", lambda device="cpu": (True, "the CPU has avx512_bf16"))
    resolved = targets.resolve_target(str(tmp_path))
    assert resolved == targets.ResolvedTarget(targets.TargetSpec(str(tmp_path)), tmp_path, "bfloat16")
    assert capsys.readouterr().out.count("--dtype auto") == 1  # the auto choice is made, and said, once
    # below the entry nothing is decided again: were it, the machine would now say float32
    monkeypatch.setattr(machine, "native_bf16", lambda device="cpu": (False, "the CPU has no native bf16"))
    loaded = []
    monkeypatch.setattr(
        targets.Target, "from_pretrained", lambda path, dtype, device, **_: loaded.append((path, dtype))
    )
    targets.load_target(resolved)
    assert loaded == [(tmp_path, "bfloat16")] and "--dtype auto" not in capsys.readouterr().out
    # str() is the concrete spec a fit's config carries: it resolves to the same directory and dtype
    assert targets.resolve_target(str(resolved)) == targets.ResolvedTarget(
        targets.TargetSpec(str(tmp_path), "bfloat16"), tmp_path, "bfloat16"
    )
    assert targets.resolve_target(resolved.spec, "float32").dtype == "float32"  # a --dtype asked for is honoured


def test_machine_record_names_the_cpu_and_whether_bf16_is_native():
    record = machine.machine_record()
    assert record["cpu"] and isinstance(record["cpu_flags"], list)
    assert record["native_bf16"] == any(f in record["cpu_flags"] for f in machine.BF16_FLAGS)


def test_divergence_report_locates_the_first_differing_token_and_its_logit_gap(bf16_target):
    prompt = list(range(10))
    plain = plain_decode(bf16_target, prompt, 8, Sampling())
    logits = bf16_target(torch.tensor([prompt + plain.tokens[:3]]), with_features=False).logits[0, -1]
    second = int(logits.topk(2).indices[1])
    spec = DecodeResult(tokens=plain.tokens[:3] + [second] + plain.tokens[4:])
    [d] = divergences(bf16_target, [prompt, prompt], [plain, spec], [plain, plain])
    assert d["prompt"] == 1 and d["position"] == 3
    assert d["gap"] == pytest.approx(float(logits[plain.tokens[3]] - logits[second]), abs=1e-3)
    assert d["gap"] == pytest.approx(d["top2_gap"], abs=1e-3)


def test_score_with_k_auto_chooses_a_k_per_drafter_and_stays_exact(bf16_target):
    prompt = torch.randint(0, WIDE_V, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    prompts = [prompt + prompt[:15], prompt[5:] + prompt[:20]]
    drafters = {"ngram": NGramDrafter(max_ngram=2), "self": DraftLM(bf16_target.model)}
    _, rows = score_drafters(bf16_target, drafters, prompts, "auto", Sampling(), 24, progress=False)
    by_name = {r.name: r for r in rows}
    for row in rows:
        assert 1 <= row.k <= 8 and row.k == row.auto_k.k
        assert row.greedy_exact == len(prompts)
        assert row.auto_k.source == "calibration"
    # the target drafting for itself is always accepted: its predicted τ(K) is K + 1
    self_auto = by_name["self"].auto_k
    assert self_auto.predicted_tau == pytest.approx(self_auto.k + 1)


@pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="this CPU's oneDNN has no bf16 kernels to pre-pack for"
)
def test_a_new_weight_at_the_address_of_the_old_one_is_packed_again():
    """A weight replaced by a new tensor of the same shape at the freed old one's address, its version counter 0
    like the old one's: the key (address, version, shape) alone matched and the old packed weight was used. Each
    replacement must compute with its own weight. The new weights are views of one host buffer, so that each lies
    at the old one's address every time (the allocator's reuse, which this once waited for, did not come in 20 tries
    in one CI worker)."""
    import numpy as np

    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 128, bias=False).to(torch.bfloat16)
    make_batch_invariant(linear)
    x = torch.randn(4, 256).to(torch.bfloat16)
    buffer = np.zeros((128, 256), dtype=np.int16)  # bf16 bits: numpy has no bf16

    def fresh() -> torch.nn.Parameter:
        """A new tensor over ``buffer`` holding new random weights, written before it exists (its version stays 0)."""
        buffer[:] = torch.empty(128, 256, dtype=torch.bfloat16).normal_().view(torch.int16).numpy()
        return torch.nn.Parameter(torch.from_numpy(buffer).view(torch.bfloat16), requires_grad=False)

    with torch.no_grad():
        linear.weight = fresh()
        for _ in range(3):
            key = (linear.weight.data_ptr(), linear.weight._version)
            linear(x)  # packs the current weight
            linear.weight = None  # the old weight freed, then a new one at its address
            linear.weight = fresh()
            assert (linear.weight.data_ptr(), linear.weight._version) == key  # the hazard: the key alone matches
            assert torch.equal(linear(x), torch.nn.functional.linear(x, linear.weight))


def test_a_tlt_lora_adapter_on_a_bf16_target_keeps_its_rows_batch_invariant():
    """TLT's LoRA adapter (peft Linears added to every projection) on a batch-invariant bf16 target, trained away from
    zero: a verification block's logits still equal the one-token steps' bit for bit, so bf16 TLT rollouts stay
    exactly greedy (the adapter's own Linears ran the fast kernels, outside the target's batch invariance)."""
    from draftsmith.families.eagle.tlt.policy import Policy, PolicyConfig

    target = Target(wide_bf16_llama(seed=1), name="wide-bf16-lora")
    policy = Policy(target, PolicyConfig())
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in policy.peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # an adapter that moved the target
    assert target.batch_invariant
    ids = torch.randint(0, WIDE_V, (1, 160), generator=torch.Generator().manual_seed(0))
    for past in (7, 140):
        steps, block = step_and_block_logits(target, ids, past, 8)
        assert torch.equal(steps, block), past
