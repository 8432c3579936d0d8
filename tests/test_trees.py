"""Tree drafts: mask and positions, greedy exactness, lossless multi-candidate sampling."""

from __future__ import annotations

import pytest
import torch
from conftest import make_llama
from test_verifier import SMALL_V, depth_pvalues, sampled_triples

from draftsmith.core import trees
from draftsmith.core.draft import Draft, Drafter
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.families.ngram.drafter import NGramDrafter

PARENTS = torch.tensor([-1, -1, 0, 0, 2])  # two root children; node 0 has two children; node 2 one


def test_tree_depths_positions_and_mask():
    assert trees.depths(PARENTS).tolist() == [1, 1, 2, 2, 3]
    assert trees.positions(PARENTS, 10).tolist() == [[10, 11, 11, 12, 12, 13]]
    mask = trees.attention_mask(PARENTS, 3, torch.float32)[0, 0] == 0  # (6, 9): True = may attend
    assert mask[:, :3].all()  # the committed context is visible to every entry
    seen = mask[:, 3:].int().tolist()
    assert seen == [
        [1, 0, 0, 0, 0, 0],  # root
        [1, 1, 0, 0, 0, 0],  # node 0
        [1, 0, 1, 0, 0, 0],  # node 1: not its sibling
        [1, 1, 0, 1, 0, 0],  # node 2: root, node 0, itself
        [1, 1, 0, 0, 1, 0],  # node 3: not its sibling node 2
        [1, 1, 0, 1, 0, 1],  # node 4: root, 0, 2, itself
    ]
    assert trees.children(PARENTS) == {-1: [0, 1], 0: [2, 3], 2: [4]}


def test_greedy_tree_verification_follows_the_argmax_path():
    tokens = [5, 6, 7, 8, 9]
    # argmax after: root -> 6 (node 1, a leaf) -> then 3
    assert trees.verify_tree_greedy([6, 0, 3, 0, 0, 0], tokens, PARENTS) == ([1], 3)
    # root -> 5 (node 0) -> 7 (node 2) -> 9 (node 4) -> 2
    assert trees.verify_tree_greedy([5, 7, 0, 9, 0, 2], tokens, PARENTS) == ([0, 2, 4], 2)
    assert trees.verify_tree_greedy([4, 0, 0, 0, 0, 0], tokens, PARENTS) == ([], 4)


def test_duplicate_candidates_are_one_node_to_the_target_and_the_walk_takes_every_copys_children():
    """Root children 5, 5, 6 (5 drawn twice); the first 5 has child 7, the second 5 has child 8."""
    tokens, parents = [5, 5, 6, 7, 8, 9], [-1, -1, -1, 0, 1, 4]
    assert trees.representatives(tokens, parents) == [0, 0, 2, 3, 4, 5]
    nodes, index = trees.unique(tokens, parents)
    assert nodes == [0, 2, 3, 4, 5] and index == [0, 0, 1, 2, 3, 4]
    # verified rows: root, 5, 6, 7, 8, 9; drafted node i reads row 1 + index[i]; argmax: root -> 5 -> 8 -> 9 -> 1
    argmax = [5, 8, 8, 0, 0, 9, 1]  # the second 5 (node 1) shares the first's row: 8
    assert trees.verify_tree_greedy(argmax, tokens, torch.tensor(parents)) == ([0, 4, 5], 1)


def repetitive_prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    motifs = [torch.randint(0, 90, (4,), generator=g).tolist() for _ in range(3)]
    return [sum((motifs[(i + j) % 3] for j in range(6)), []) + motifs[i][:2] for i in range(3)]


@pytest.mark.parametrize("k", [2, 4])
def test_greedy_with_tree_drafts_equals_plain_greedy(target, k):
    drafter = NGramDrafter(max_ngram=2, width=3)
    decoder = SpeculativeDecoder(target, drafter, k, Sampling())
    trees_seen = accepted = 0
    propose = drafter.propose

    def counting(*args, **kwargs):
        nonlocal trees_seen
        draft = propose(*args, **kwargs)
        trees_seen += not draft.is_chain
        return draft

    drafter.propose = counting
    for prompt in repetitive_prompts():
        result = decoder.generate(prompt, 30)
        assert result.tokens == plain_decode(target, prompt, 30, Sampling()).tokens
        accepted += sum(result.accepted)
    assert trees_seen > 0 and accepted > 0


class RandomTree(Drafter):
    """Context-free proposals from fixed distributions: two i.i.d. root children (q_a), one child each (q_b)."""

    vocab_size = SMALL_V

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.q_a, self.q_b = torch.softmax(2.0 * torch.randn(2, SMALL_V, generator=g), -1)

    def begin(self, tokens, target_out):
        return None

    def advance(self, state, tokens, target_out) -> None:
        pass

    def propose(self, state, k, sampling, generator) -> Draft:
        first = torch.multinomial(self.q_a, 2, replacement=True, generator=generator)
        second = torch.multinomial(self.q_b, 2, replacement=True, generator=generator)
        tokens = torch.stack([first[0], first[1], second[0], second[1]])
        q = torch.stack([self.q_a, self.q_a, self.q_b, self.q_b])
        return Draft(tokens, torch.tensor([-1, -1, 0, 1]), q)


def tree_pvalues(target: Target, sampling: Sampling, n: int) -> tuple[float, float]:
    """Chi-square p-values of the (x1, x2) and (x2, x3) distributions: the tree's depth 1 and depth 2 verified
    (``sampled_triples`` leaves the verifier room for both levels; three new tokens capped it at depth 1)."""
    triples = sampled_triples(target, RandomTree(seed=5), [1, 2, 3], sampling, n, seed=321)
    return depth_pvalues(target, [1, 2, 3], sampling, triples)


@pytest.fixture(scope="module")
def soft_target() -> Target:
    target = Target(make_llama(seed=11, layers=1, hidden=32, vocab=SMALL_V))
    target.model.lm_head.weight.data.mul_(0.15)
    return target


@pytest.mark.parametrize("sampling", [Sampling(temperature=1.0), Sampling(temperature=0.8, top_p=0.9)])
def test_tree_speculative_sampling_is_distributed_as_the_target(soft_target, sampling):
    depth1, depth2 = tree_pvalues(soft_target, sampling, 1500)
    assert depth1 > 1e-3 and depth2 > 1e-3


def test_chi_square_catches_a_tree_rule_that_forgets_the_residual(soft_target, monkeypatch):
    """Trying the next sibling against p instead of the residual of the rejected one is biased."""
    monkeypatch.setattr(trees, "residual", lambda r, q: r)
    sampling = Sampling(temperature=1.0)
    depth1, depth2 = tree_pvalues(soft_target, sampling, 1500)
    assert depth1 < 1e-3 and depth2 < 1e-3


def test_tree_kinds_and_verify_rules_are_parsed_once_into_typed_records():
    """``--tree`` / ``--verify`` strings become a ``TreeKind`` / ``VerifyRule`` at the command line, each record saying
    what the modules used to work out from the string; an unknown value is one line naming its flag."""
    from draftsmith.errors import DraftsmithError
    from draftsmith.layers.tree_draft import TreePolicy

    assert trees.TreeKind.parse("sampled") is trees.TreeKind.SAMPLED
    assert [k for k in trees.TreeKind if k.draws] == [trees.TreeKind.SAMPLED, trees.TreeKind.BEAM]
    assert [k for k in trees.TreeKind if k.sized] == [trees.TreeKind.STATIC, trees.TreeKind.DYNAMIC]
    rules = trees.VerifyRule
    assert rules.parse("rsd") is rules.RSD and not rules.RSD.replacement and rules.SPECTR.replacement
    assert rules.SPECTR.verify_tree is trees.verify_tree_spectr
    assert rules.RSD.verify_tree is rules.SPECINFER.verify_tree is trees.verify_tree_sampling
    assert str(rules.SPECTR) == f"{rules.SPECTR}" == "spectr"  # reports and messages keep the flag's spelling
    with pytest.raises(
        DraftsmithError, match=r"^--tree must be one of chain, static, dynamic, sampled, beam, got 'x'$"
    ):
        trees.TreeKind.parse("x")
    with pytest.raises(DraftsmithError, match=r"^--verify must be one of specinfer, spectr, rsd, got 'beam'$"):
        rules.parse("beam")
    with pytest.raises(TypeError, match="TreeKind"):  # past the command line, only the typed record is accepted
        TreePolicy("static")
    with pytest.raises(TypeError, match="VerifyRule"):
        SpeculativeDecoder(None, NGramDrafter(), 2, Sampling(1.0), "spectr")
