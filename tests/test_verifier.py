"""The verifier's heart: greedy output equals plain greedy decoding; sampling is lossless."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, make_llama
from scipy import stats

from draftsmith.core.sampling import Sampling, probs, residual, verify_chain_sampling
from draftsmith.core.target import Target, rollback
from draftsmith.core.trees import VerifyRule
from draftsmith.decode import verifier as verifier_module
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.families.ngram.drafter import NGramDrafter
from draftsmith.layers.causal_lm import DraftLM


def hf_greedy(target: Target, prompt: list[int], n: int) -> list[int]:
    out = target.model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("drafter_kind", ["self", "random_lm", "one_layer_lm", "ngram"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_speculative_output_equals_plain_greedy(target, tokenizer, prompts, drafter_kind, k):
    drafter = {
        "self": lambda: DraftLM(target.model, tokenizer),
        "random_lm": lambda: DraftLM(make_llama(seed=7), tokenizer),
        "one_layer_lm": lambda: DraftLM(make_llama(seed=3, layers=1, hidden=32), tokenizer),
        "ngram": lambda: NGramDrafter(max_ngram=2),
    }[drafter_kind]()
    decoder = SpeculativeDecoder(target, drafter, k, Sampling())
    for prompt in prompts:
        spec = decoder.generate(prompt, 30)
        assert spec.tokens == plain_decode(target, prompt, 30, Sampling()).tokens
        assert spec.tokens == hf_greedy(target, prompt, 30)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_target_drafting_for_itself_accepts_everything(target, tokenizer, prompts, k):
    decoder = SpeculativeDecoder(target, DraftLM(target.model, tokenizer), k, Sampling())
    rounds = 6
    result = decoder.generate(prompts[0], 1 + rounds * (k + 1))
    assert result.accepted == [k] * rounds
    assert result.target_calls == 1 + rounds  # tau = (accepted + 1) per call = k + 1 exactly


def test_greedy_stops_at_eos_like_plain_decoding(tokenizer, prompts):
    # pick as eos a token plain decoding emits mid-way, so both must stop there
    base = Target(make_llama(seed=0), tokenizer)
    tokens = plain_decode(base, prompts[1], 20, Sampling()).tokens
    eos = tokens[7]
    target = Target(make_llama(seed=0, eos=eos), tokenizer)
    plain = plain_decode(target, prompts[1], 20, Sampling()).tokens
    assert plain[-1] == eos and len(plain) <= 8
    spec = SpeculativeDecoder(target, DraftLM(make_llama(seed=0), tokenizer), 4, Sampling())
    assert spec.generate(prompts[1], 20).tokens == plain


def test_kv_cache_rollback_matches_a_fresh_forward(target):
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    cache = target.new_cache()
    target(ids[:, :8], cache)
    target(torch.tensor([[5, 6, 7, 8]]), cache)  # a rejected draft
    rollback(cache, 8)
    assert cache.get_seq_length() == 8
    rolled = target(ids[:, 8:], cache).logits
    fresh = target(ids).logits[:, 8:]
    torch.testing.assert_close(rolled, fresh, atol=1e-5, rtol=1e-4)


def test_draft_lm_cache_rollback_keeps_only_committed_tokens(target, tokenizer):
    drafter = DraftLM(make_llama(seed=7), tokenizer)
    empty = target(torch.tensor([[1]])).positions(slice(0, 0))
    state = drafter.begin(torch.tensor([1, 2, 3, 4]), empty)
    draft = drafter.propose(state, 4, Sampling(), None)
    d = draft.tokens.tolist()
    other = (d[1] + 1) % VOCAB
    drafter.advance(state, torch.tensor([d[0], other]), empty)  # first draft kept, second replaced
    assert state.cached == [1, 2, 3, 4, d[0]]
    assert state.cache.get_seq_length() == 5
    # the next proposal equals a fresh drafter's on the same committed tokens
    fresh = drafter.begin(torch.tensor([1, 2, 3, 4, d[0], other]), empty)
    assert (
        drafter.propose(state, 3, Sampling(), None).tokens.tolist()
        == drafter.propose(fresh, 3, Sampling(), None).tokens.tolist()
    )


# ---- losslessness of speculative sampling ------------------------------------------------


def chi_square_pvalue(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit, pooling cells whose expected count is below 5."""
    counts, expected = counts.double(), expected_probs.double() / expected_probs.double().sum() * counts.sum()
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep].numpy(), exp[keep].numpy()
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def test_acceptance_rule_first_token_follows_target_distribution():
    g = torch.Generator().manual_seed(0)
    V = 6
    p = torch.softmax(torch.randn(2, V, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(1, V, generator=g) * 1.5, -1)
    counts = torch.zeros(V)
    for _ in range(20000):
        d = int(torch.multinomial(q[0], 1, generator=g))
        n, nxt = verify_chain_sampling(p, q, [d], g)
        counts[d if n == 1 else nxt] += 1
    assert chi_square_pvalue(counts, p[0]) > 1e-3


def test_residual_is_normalised_positive_part():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.5, 0.3])
    torch.testing.assert_close(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))


SMALL_V = 8


def exact_pair_distribution(target: Target, prompt: list[int], sampling: Sampling) -> torch.Tensor:
    """P(x1, x2) under plain sampling of the target: (V*V,)."""
    p1 = probs(target(torch.tensor([prompt])).logits[0, -1], sampling)
    rows = [p1[a] * probs(target(torch.tensor([prompt + [a]])).logits[0, -1], sampling) for a in range(SMALL_V)]
    return torch.stack(rows).flatten()


def sampled_pairs(
    target: Target,
    drafter,
    prompt: list[int],
    sampling: Sampling,
    n: int,
    seed: int = 123,
    verify: VerifyRule = VerifyRule.SPECINFER,
) -> torch.Tensor:
    """Counts of (x1, x2): x1 comes from the prefill, x2 from a verified draft token (``verify``: the tree rule)."""
    decoder = SpeculativeDecoder(target, drafter, 2, sampling, verify)
    counts = torch.zeros(SMALL_V * SMALL_V)
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        tokens = decoder.generate(prompt, 3, g).tokens
        counts[tokens[0] * SMALL_V + tokens[1]] += 1
    return counts


def later_pair_distribution(target: Target, prompt: list[int], sampling: Sampling) -> torch.Tensor:
    """P(x2, x3) under plain sampling of the target (x1 summed out): (V*V,)."""
    p1 = probs(target(torch.tensor([prompt])).logits[0, -1], sampling)
    return sum(p1[c] * exact_pair_distribution(target, prompt + [c], sampling) for c in range(SMALL_V))


def sampled_triples(
    target: Target,
    drafter,
    prompt: list[int],
    sampling: Sampling,
    n: int,
    seed: int = 123,
    verify: VerifyRule = VerifyRule.SPECINFER,
) -> torch.Tensor:
    """Counts of (x1, x2, x3), (V, V, V): x1 comes from the prefill, then a round drafted to depth 2 (K = 2 with three
    tokens left to generate): its depth 1 decides x2, its depth 2 x3 (``sampled_pairs`` leaves one token after x1, so
    the verifier drafts depth 1 only)."""
    decoder = SpeculativeDecoder(target, drafter, 2, sampling, verify)
    counts = torch.zeros(SMALL_V, SMALL_V, SMALL_V)
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x1, x2, x3 = decoder.generate(prompt, 4, g).tokens[:3]
        counts[x1, x2, x3] += 1
    return counts


def depth_pvalues(target: Target, prompt: list[int], sampling: Sampling, triples: torch.Tensor) -> tuple[float, float]:
    """Chi-square p-values of ``sampled_triples``' counts against plain sampling of the target: (x1, x2), what depth 1
    decides given x1, and (x2, x3), what depth 2 decides given x2 (x1 summed out)."""
    with torch.no_grad():
        first, later = (
            exact_pair_distribution(target, prompt, sampling),
            later_pair_distribution(target, prompt, sampling),
        )
    return chi_square_pvalue(triples.sum(2).flatten(), first), chi_square_pvalue(triples.sum(0).flatten(), later)


@pytest.fixture(scope="module")
def small_pair():
    torch.manual_seed(0)
    target = Target(make_llama(seed=11, layers=1, hidden=32, vocab=SMALL_V))
    drafter = DraftLM(make_llama(seed=12, layers=1, hidden=32, vocab=SMALL_V))
    # a soft target (every pair of tokens gets real mass) and a drafter that disagrees with it
    target.model.lm_head.weight.data.mul_(0.15)
    drafter.model.lm_head.weight.data.mul_(1.0)
    return target, drafter


@pytest.mark.parametrize("sampling", [Sampling(temperature=1.0), Sampling(temperature=0.8, top_p=0.9)])
def test_speculative_sampling_is_distributed_as_the_target(small_pair, sampling):
    target, drafter = small_pair
    prompt = [1, 2, 3]
    depth1, depth2 = depth_pvalues(target, prompt, sampling, sampled_triples(target, drafter, prompt, sampling, 1500))
    assert depth1 > 1e-3 and depth2 > 1e-3, (depth1, depth2)


def test_chi_square_test_catches_a_wrong_acceptance_rule(small_pair, monkeypatch):
    """Resampling from p instead of the residual after a rejection is a classic bug: it must fail."""

    def broken(p, q, draft, generator):
        for i, d in enumerate(draft):
            if torch.rand((), generator=generator) * q[i, d] < p[i, d]:
                continue
            return i, int(torch.multinomial(p[i], 1, generator=generator))
        return len(draft), int(torch.multinomial(p[len(draft)], 1, generator=generator))

    monkeypatch.setattr(verifier_module, "verify_chain_sampling", broken)
    target, drafter = small_pair
    sampling = Sampling(temperature=1.0)
    counts = sampled_pairs(target, drafter, [1, 2, 3], sampling, 1500)
    assert chi_square_pvalue(counts, exact_pair_distribution(target, [1, 2, 3], sampling)) < 1e-3


@torch.no_grad()
def confidences(drafter: DraftLM, target: Target, prompt: list[int], n: int) -> list[float]:
    """The draft model's probability of each token it drafts greedily, one round of ``n`` after ``prompt``."""
    state = drafter.begin(torch.tensor(prompt), target(torch.tensor([prompt])).positions(slice(0, 0)))
    draft = drafter.propose(state, n, Sampling(), None).tokens.tolist()
    ids = torch.tensor([prompt + draft])
    p = torch.softmax(drafter.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float(), -1)
    return [float(p[i, t]) for i, t in enumerate(draft)]


def test_confidence_stopping_shortens_drafts_and_keeps_greedy_output_exact(target, tokenizer, prompts):
    model = make_llama(seed=3, layers=1, hidden=32)
    middle = sorted(c for p in prompts for c in confidences(DraftLM(model, tokenizer), target, p, 4))
    cases = {0.0: "full", middle[len(middle) // 2]: "mixed", 1.0: "one"}
    for threshold, expect in cases.items():
        drafter = DraftLM(model, tokenizer, stop_below=threshold)
        drafted = []
        for prompt in prompts:
            result = SpeculativeDecoder(target, drafter, 4, Sampling()).generate(prompt, 30)
            assert result.tokens == plain_decode(target, prompt, 30, Sampling()).tokens
            drafted += result.drafted[:-4]  # the last (at most 4) rounds draft less: the budget ends
        lengths = set(drafted)
        assert {"full": lengths == {4}, "one": lengths == {1}, "mixed": len(lengths) > 1}[expect], (threshold, lengths)


def test_speculative_sampling_with_confidence_stopping_is_distributed_as_the_target(small_pair):
    target, drafter = small_pair
    prompt, sampling = [1, 2, 3], Sampling(temperature=1.0)
    with torch.no_grad():
        q = probs(drafter.model(input_ids=torch.tensor([prompt])).logits[0, -1], sampling)
    stopping = DraftLM(drafter.model, stop_below=float(q.median()))  # about half the first tokens stop a draft
    lengths = set()
    for seed in range(40):
        state = stopping.begin(torch.tensor(prompt), None)
        lengths.add(len(stopping.propose(state, 2, sampling, torch.Generator().manual_seed(seed))))
    assert lengths == {1, 2}  # the threshold really cuts some drafts short
    depth1, depth2 = depth_pvalues(target, prompt, sampling, sampled_triples(target, stopping, prompt, sampling, 1500))
    assert depth1 > 1e-3 and depth2 > 1e-3, (depth1, depth2)


@pytest.mark.slow
def test_compiled_forwards_keep_greedy_output_exact(tokenizer, prompts):
    """``score --compile``: the target's and the draft LM's compiled forwards decode what eager plain decoding does."""
    eager = Target(make_llama(seed=0), tokenizer)
    compiled = Target(make_llama(seed=0), tokenizer)
    compiled.compile()
    drafter = DraftLM(make_llama(seed=3, layers=1, hidden=32), tokenizer)
    drafter.compile()
    decoder = SpeculativeDecoder(compiled, drafter, 3, Sampling())
    for prompt in prompts:
        reference = plain_decode(eager, prompt, 20, Sampling()).tokens
        assert plain_decode(compiled, prompt, 20, Sampling()).tokens == reference
        assert decoder.generate(prompt, 20).tokens == reference
    assert compiled.compiled and not eager.compiled
    assert hasattr(compiled._forward, "_torchdynamo_orig_callable")  # torch.compile's wrapper ran the decodes
