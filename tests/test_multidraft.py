"""Multi-draft verification (issue 33): SpecTr's K-SEQ and RSD's candidates without replacement, both lossless.

The chi-square tests decode with a sampled tree (several candidates per node) and compare joint distributions of
decoded tokens with plain sampling of the target: (x1, x2), which a tree's depth 1 decides, and (x2, x3), which its
depth 2 decides (children of merged repeated candidates included); a deliberately broken variant of each rule must
fail them, one that breaks only depth 2 failing only the second.
"""

from __future__ import annotations

import pytest
import torch
from test_trees import soft_target  # noqa: F401 (fixture)
from test_verifier import (  # noqa: F401
    SMALL_V,
    chi_square_pvalue,
    depth_pvalues,
    exact_pair_distribution,
    sampled_pairs,
    sampled_triples,
    small_pair,
)

from draftsmith.core import sampling as sampling_module
from draftsmith.core.draft import Draft
from draftsmith.core.sampling import Sampling, draw_candidates, spectr_rho, verify_kseq
from draftsmith.core.trees import TreeKind, VerifyRule
from draftsmith.decode.verifier import SpeculativeDecoder
from draftsmith.errors import DraftsmithError
from draftsmith.eval.score import score_drafters
from draftsmith.families.ngram.drafter import NGramDrafter
from draftsmith.layers import tree_draft
from draftsmith.layers.tree_draft import TreeDrafter, TreePolicy


class BigramTree(TreeDrafter):
    """A bigram drafter: the logits of a token's child are a fixed random row of the token; it grows any tree."""

    vocab_size = SMALL_V

    def __init__(self, seed: int, policy: TreePolicy) -> None:
        g = torch.Generator().manual_seed(seed)
        self.table = 1.5 * torch.randn(SMALL_V, SMALL_V, generator=g)
        self.tree = policy

    def begin(self, tokens, target_out):
        return tokens.tolist()

    def advance(self, state, tokens, target_out) -> None:
        state.extend(tokens.tolist())

    def root(self, state):
        return None, self.table[state[-1]]

    def grow(self, state, scratch, tokens, parents, new):
        return self.table[[tokens[i] for i in new]]


def sampled_tree(rule: str, branching=(3, 2)) -> BigramTree:
    return BigramTree(7, TreePolicy(TreeKind.SAMPLED, branching=branching, replacement=VerifyRule(rule).replacement))


def pairs(target, drafter, rule: str, sampling: Sampling, n: int) -> torch.Tensor:
    return sampled_pairs(target, drafter, [1, 2, 3], sampling, n, seed=99, verify=VerifyRule(rule))


def both_depths(target, drafter, rule: str, sampling: Sampling, n: int = 1500) -> tuple[float, float]:
    """(depth 1, depth 2) chi-square p-values of decoding with ``drafter``'s trees verified by ``rule``."""
    triples = sampled_triples(target, drafter, [1, 2, 3], sampling, n, seed=99, verify=VerifyRule(rule))
    return depth_pvalues(target, [1, 2, 3], sampling, triples)


SAMPLINGS = [Sampling(temperature=1.0), Sampling(temperature=0.8, top_p=0.9)]


@pytest.mark.parametrize("rule", ["specinfer", "spectr", "rsd"])
@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_multi_draft_rules_are_distributed_as_the_target(soft_target, rule, sampling):  # noqa: F811
    depth1, depth2 = both_depths(soft_target, sampled_tree(rule), rule, sampling)
    assert depth1 > 1e-3 and depth2 > 1e-3, (depth1, depth2)


def test_chi_square_catches_spectr_without_its_rho(soft_target, monkeypatch):  # noqa: F811
    """K-SEQ with ρ = 1 for several candidates accepts more than p allows: its residual would go negative."""
    monkeypatch.setattr(sampling_module, "spectr_rho", lambda p, q, m: 1.0)
    sampling = Sampling(temperature=1.0)
    counts = pairs(soft_target, sampled_tree("spectr"), "spectr", sampling, 1500)
    assert chi_square_pvalue(counts, exact_pair_distribution(soft_target, [1, 2, 3], sampling)) < 1e-3


def test_chi_square_catches_rsd_verified_against_the_unconditioned_q(soft_target, monkeypatch):  # noqa: F811
    """Candidates drawn without replacement but verified as if each came from q itself: biased."""

    def forgetful(q, n, replacement, generator):
        tokens, _ = draw_candidates(q, n, replacement, generator)
        return tokens, [q] * len(tokens)

    monkeypatch.setattr(tree_draft, "draw_candidates", forgetful)
    sampling = Sampling(temperature=1.0)
    counts = pairs(soft_target, sampled_tree("rsd"), "rsd", sampling, 1500)
    assert chi_square_pvalue(counts, exact_pair_distribution(soft_target, [1, 2, 3], sampling)) < 1e-3


def test_repeated_candidates_are_verified_once_and_drawn_from_one_row(soft_target):  # noqa: F811
    """A peaked drafter draws the same token twice often: the target verifies it once, the drafter grows it once."""
    drafter = sampled_tree("spectr", branching=(4, 2))
    drafter.table = 4 * drafter.table  # peaked: repeats are common
    calls = []
    grow = drafter.grow
    drafter.grow = lambda state, scratch, tokens, parents, new: (
        calls.append(len(new)) or grow(state, scratch, tokens, parents, new)
    )
    decoder = SpeculativeDecoder(soft_target, drafter, 2, Sampling(1.0), VerifyRule.SPECTR)
    result = decoder.generate([1, 2, 3], 40, torch.Generator().manual_seed(0))
    assert min(result.drafted) < 12 and max(result.drafted) <= 12  # 4 + 8 nodes drafted, repeats verified once
    assert min(calls) < 4  # repeated root children grown once


def drop_repeats(tokens: list[int], below: list[int]) -> list[int]:
    seen: set[int] = set()
    return [c for c in below if not (tokens[c] in seen or seen.add(tokens[c]))]


def test_chi_square_catches_merging_that_drops_repeated_trials(soft_target, monkeypatch):  # noqa: F811
    """K-SEQ needs every draw as a trial: merging repeats into one trial of their token is biased (measured too:
    trying the trials grouped by token instead of in draw order is biased by less than 1,500 samples resolve)."""
    from draftsmith.core import trees

    original = trees.Walk.candidates
    monkeypatch.setattr(trees.Walk, "candidates", lambda walk: drop_repeats(walk.tokens, original(walk)))
    sampling = Sampling(temperature=1.0)
    counts = pairs(soft_target, sampled_tree("spectr", branching=(4, 1)), "spectr", sampling, 1500)
    assert chi_square_pvalue(counts, exact_pair_distribution(soft_target, [1, 2, 3], sampling)) < 1e-3


def test_chi_square_at_depth_2_catches_merged_repeats_children_verified_against_wrong_q(soft_target):  # noqa: F811
    """q given a row per merged node (as the target's rows are) instead of one per drafted node: after a repeated
    candidate every later node is verified against an earlier node's row. Depth 1 is untouched (its nodes all share
    the root's row), so only the (x2, x3) test can see it, and must."""
    from draftsmith.core.trees import unique

    drafter = sampled_tree("specinfer")
    honest = drafter.propose

    def merged_rows(*args) -> Draft:
        draft = honest(*args)
        _, index = unique(draft.tokens.tolist(), draft.parents.tolist())
        return Draft(draft.tokens, draft.parents, draft.q[index])

    drafter.propose = merged_rows
    depth1, depth2 = both_depths(soft_target, drafter, "specinfer", Sampling(temperature=1.0))
    assert depth1 > 1e-3 and depth2 < 1e-3, (depth1, depth2)


def beam_tree(width: int = 3) -> BigramTree:
    return BigramTree(7, TreePolicy(TreeKind.BEAM, beam_width=width))


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_rsd_s_beam_trees_are_distributed_as_the_target(soft_target, sampling):  # noqa: F811
    depth1, depth2 = both_depths(soft_target, beam_tree(), "rsd", sampling)
    assert depth1 > 1e-3 and depth2 > 1e-3, (depth1, depth2)


def test_chi_square_catches_a_beam_tree_whose_siblings_are_out_of_draw_order(soft_target, monkeypatch):  # noqa: F811
    """Siblings listed by token id: each row still removes the siblings before it, but the first one listed is no
    longer a draw from the node's distribution."""
    monkeypatch.setattr(tree_draft, "draw_order", lambda kept: sorted(kept, key=lambda c: (c[1], c[2])))
    sampling = Sampling(temperature=1.0)
    counts = pairs(soft_target, beam_tree(), "rsd", sampling, 1500)
    assert chi_square_pvalue(counts, exact_pair_distribution(soft_target, [1, 2, 3], sampling)) < 1e-3


def test_beam_tree_shape_rows_and_first_draws():
    """At most ``width`` nodes per depth, parents first, siblings distinct with each row its parent's distribution
    minus the earlier siblings; and the first child of the root is a draw from the root's distribution (a beam of
    width 1 is ancestral sampling)."""
    drafter = beam_tree(width=3)
    g = torch.Generator().manual_seed(4)
    draft = drafter.propose([1, 2], 4, Sampling(1.0), g)
    tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
    depth = tree_draft_depths(parents)
    assert max(depth) == 4 and all(depth.count(d) <= 3 for d in range(1, 5)) and depth.count(1) == 3
    assert all(p < i for i, p in enumerate(parents))
    for node, parent in enumerate(parents):
        q = torch.softmax(drafter.table[2 if parent < 0 else tokens[parent]], -1)
        earlier = [tokens[s] for s in range(node) if parents[s] == parent]
        assert tokens[node] not in earlier
        q[earlier] = 0
        torch.testing.assert_close(draft.q[node], q / q.sum())
    first = torch.zeros(SMALL_V)
    for _ in range(3000):
        first[int(beam_tree(width=1).propose([1, 2], 1, Sampling(1.0), g).tokens[0])] += 1
    assert chi_square_pvalue(first, torch.softmax(drafter.table[2], -1)) > 1e-3


def tree_draft_depths(parents: list[int]) -> list[int]:
    from draftsmith.core.trees import depths

    return depths(torch.tensor(parents)).tolist()


def random_pq(seed: int, vocab: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(1.5 * torch.randn(2, vocab, generator=g), -1).unbind()


@pytest.mark.parametrize("m", [1, 2, 4])
def test_kseq_outputs_the_target_distribution_and_accepts_more_with_more_candidates(m):
    p, q = random_pq(3)
    g = torch.Generator().manual_seed(5)
    counts, accepted, n = torch.zeros(len(p)), 0, 6000
    for _ in range(n):
        candidates = torch.multinomial(q, m, replacement=True, generator=g).tolist()
        chosen, token = verify_kseq(p, q, candidates, g)
        counts[token] += 1
        accepted += chosen is not None
    assert chi_square_pvalue(counts, p) > 1e-3
    rho = spectr_rho(p, q, m)
    beta = float(torch.minimum(q, p / rho).sum())
    assert 1 <= rho <= m and (1 - (1 - beta) ** m) / beta <= rho * (1 + 1e-6)
    single = float(torch.minimum(p, q).sum())  # one candidate's acceptance
    expected = 1 - (1 - beta) ** m
    assert expected >= single - 1e-6 and (m == 1 or expected > single)
    assert abs(accepted / n - expected) < 4 * (expected * (1 - expected) / n) ** 0.5 + 1e-3


def test_candidates_without_replacement_are_distinct_with_renormalised_rows():
    q = torch.tensor([0.5, 0.3, 0.2, 0.0])
    g = torch.Generator().manual_seed(0)
    tokens, rows = draw_candidates(q, 5, False, g)
    assert sorted(tokens) == [0, 1, 2]  # the support ran out after three
    for i, row in enumerate(rows):
        assert float(row[tokens[:i]].sum()) == 0 and abs(float(row.sum()) - 1) < 1e-6
        expected = q.clone()
        expected[tokens[:i]] = 0
        torch.testing.assert_close(row, expected / expected.sum())
    iid, iid_rows = draw_candidates(q, 5, True, g)
    assert len(iid) == 5 and all(r is q for r in iid_rows)


def test_sampled_tree_shape_and_rows():
    drafter = sampled_tree("spectr", branching=(3, 2, 1))
    draft = drafter.propose([1, 2], 3, Sampling(1.0), torch.Generator().manual_seed(1))
    assert len(draft) == 3 + 6 + 6 == drafter.tree.sampled_nodes(3)
    assert draft.parents[:3].tolist() == [-1, -1, -1] and draft.parents[3:9].tolist() == [0, 0, 1, 1, 2, 2]
    torch.testing.assert_close(draft.q[3], torch.softmax(drafter.table[int(draft.tokens[0])], -1))
    assert len(drafter.propose([1, 2], 2, Sampling(1.0), None)) == 9  # cut at depth k


def test_rules_a_drafter_cannot_feed_fail_in_one_line(soft_target):  # noqa: F811
    hot = Sampling(temperature=1.0)
    prompts = [[1, 2, 3]]
    cases = [
        (
            {"ngram": NGramDrafter()},
            "rsd",
            hot,
            "needs several candidates drawn per node, and 'ngram' drafts one chain",
        ),
        (
            {"tree": BigramTree(1, TreePolicy(TreeKind.DYNAMIC))},
            "spectr",
            hot,
            "drafts a dynamic tree: use --tree sampled",
        ),
        ({"tree": sampled_tree("rsd")}, "rsd", Sampling(0.0), "needs --temperature > 0"),
        ({"tree": sampled_tree("rsd")}, "spectr", hot, "needs siblings drawn with replacement"),
        ({"tree": sampled_tree("rsd")}, "beam", hot, "--verify must be one of specinfer, spectr, rsd"),
        ({"tree": beam_tree()}, "spectr", hot, "drafts a beam tree (RSD-S"),
        ({"tree": beam_tree()}, "rsd", Sampling(0.0), "needs --temperature > 0"),
    ]
    for drafters, rule, sampling, message in cases:
        with pytest.raises(DraftsmithError, match=message.replace("(", r"\(").replace(")", r"\)")):
            score_drafters(
                soft_target, drafters, prompts, 2, sampling, 4, progress=False, verify=VerifyRule.parse(rule)
            )
    with pytest.raises(DraftsmithError, match="--tree sampled draws candidates"):
        sampled_tree("specinfer").propose([1], 2, Sampling(0.0), None)
    with pytest.raises(DraftsmithError, match="--tree_branching must be positive"):
        TreePolicy(TreeKind.SAMPLED, branching=(2, 0))
    with pytest.raises(DraftsmithError, match="--tree beam draws candidates"):
        beam_tree().propose([1], 2, Sampling(0.0), None)
    with pytest.raises(DraftsmithError, match="--tree_beam_width must be positive"):
        TreePolicy(TreeKind.BEAM, beam_width=0)


def test_score_reports_each_rule_on_one_interleaved_run(soft_target):  # noqa: F811
    drafters = {rule: sampled_tree(rule) for rule in ("specinfer", "spectr", "rsd")}
    rules = {rule: VerifyRule(rule) for rule in drafters}
    _, rows = score_drafters(soft_target, drafters, [[1, 2, 3], [4, 5]], 2, Sampling(1.0), 12, 0, False, verify=rules)
    assert [r.verify or VerifyRule.SPECINFER for r in rows] == ["specinfer", "spectr", "rsd"]
    assert all(r.tau >= 1 for r in rows)


def test_draft_lm_grows_sampled_trees_whose_rows_are_its_own_distributions(small_pair):  # noqa: F811
    """A draft LM drafts trees one depth per forward, its frontier as a batch over its cache: each node's q row is
    what the draft model gives after that node's own path, and its cache holds the committed context afterwards."""
    target, drafter = small_pair
    drafter.tree = TreePolicy(TreeKind.SAMPLED, branching=(2, 2, 1), replacement=False)
    prompt = [1, 2, 3]
    state = drafter.begin(torch.tensor(prompt), None)
    draft = drafter.propose(state, 3, Sampling(1.0), torch.Generator().manual_seed(2))
    assert len(draft) == 2 + 4 + 4 and state.cache.get_seq_length() == len(state.cached) == len(prompt)
    tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
    for node in range(2, len(tokens)):
        path, p = [], parents[node]
        while p >= 0:
            path.insert(0, tokens[p])
            p = parents[p]
        logits = drafter.model(torch.tensor([prompt + path])).logits[0, -1]
        expected = torch.softmax(logits.float(), -1)
        siblings = [s for s in range(node) if parents[s] == parents[node]]
        if siblings:  # without replacement: the earlier siblings' tokens removed
            expected[[tokens[s] for s in siblings]] = 0
            expected = expected / expected.sum()
        torch.testing.assert_close(draft.q[node], expected, atol=1e-5, rtol=1e-4)
    drafter.tree = TreePolicy()


@pytest.mark.parametrize("rule", ["spectr", "rsd", "rsd-s"])
def test_draft_lm_multi_draft_sampling_is_distributed_as_the_target(small_pair, rule):  # noqa: F811
    target, drafter = small_pair
    if rule == "rsd-s":  # a beam of 3 paths grown through the draft model's batched frontier
        drafter.tree, rule = TreePolicy(TreeKind.BEAM, beam_width=3), "rsd"
    else:
        drafter.tree = TreePolicy(TreeKind.SAMPLED, branching=(3, 1), replacement=VerifyRule(rule).replacement)
    try:
        depth1, depth2 = both_depths(target, drafter, rule, Sampling(temperature=1.0))
    finally:
        drafter.tree = TreePolicy()
    assert depth1 > 1e-3 and depth2 > 1e-3, (depth1, depth2)


def test_draft_lm_dynamic_trees_keep_greedy_exact(target, tokenizer, prompts):
    from draftsmith.decode.verifier import plain_decode
    from draftsmith.layers.causal_lm import DraftLM

    drafter = DraftLM(target.model, tokenizer)  # the target drafting for itself: its argmax is always a root child
    drafter.set_tree(TreePolicy(TreeKind.DYNAMIC, size=32, top_k=2), 4)
    decoder = SpeculativeDecoder(target, drafter, 4, Sampling())
    for prompt in prompts:
        result = decoder.generate(prompt, 20)
        assert result.tokens == plain_decode(target, prompt, 20, Sampling()).tokens
        assert min(result.accepted[:-1]) >= 1 and max(result.accepted) > 1
