"""Cost-aware draft length: τ(K), the predicted speedup and the K (or static tree) it picks."""

from __future__ import annotations

import pytest

from draftsmith.decode.auto_k import (
    Shape,
    chain_tau,
    choose_chain_k,
    choose_tree,
    conditional_acceptance,
    tree_tau,
    unconditional_acceptance,
)
from draftsmith.errors import DraftsmithError
from draftsmith.layers.tree_draft import static_tree

FLAT = {1: 1.0}  # verifying any number of tokens costs one decode step
STEEP = {1: 1.0, 128: 128.0}  # r(m) = m: verifying m tokens costs m decode steps


def test_tau_matches_its_definition_and_extends_with_the_last_acceptance():
    a = [0.8, 0.5, 0.25]
    assert chain_tau(a, 0) == 1.0
    assert chain_tau(a, 1) == pytest.approx(1 + 0.8)
    assert chain_tau(a, 3) == pytest.approx(1 + 0.8 + 0.8 * 0.5 + 0.8 * 0.5 * 0.25)
    assert chain_tau(a, 5) == pytest.approx(chain_tau(a, 3) + 0.1 * 0.25 + 0.1 * 0.25**2)
    accept_at = unconditional_acceptance(a)
    for k in range(4):
        assert chain_tau(a, k) == pytest.approx(1 + sum(accept_at[:k]))


def test_accept_at_and_conditional_acceptance_round_trip():
    a = [0.9, 0.7, 0.5, 0.3]
    assert unconditional_acceptance(a) == pytest.approx([0.9, 0.63, 0.315, 0.0945])
    assert conditional_acceptance(unconditional_acceptance(a)) == pytest.approx(a)
    accept_at = [0.6, 0.3, 0.0, 0.0]  # no round got past position 2
    assert conditional_acceptance(accept_at) == pytest.approx([0.6, 0.5, 0.0, 0.0])
    assert unconditional_acceptance(conditional_acceptance(accept_at)) == pytest.approx(accept_at)


def test_chain_choice_by_hand_prefers_k1_for_a_costly_drafter():
    # a = 0.5 everywhere, r = 1, c = 0.3: S(1) = 1.5 / 1.3 = 1.154, S(2) = 1.75 / 1.6 = 1.094, S(3) = 1.875 / 1.9 ...
    choice = choose_chain_k([0.5] * 8, FLAT, 0.3)
    assert choice.k == 1 and choice.tree_size is None
    assert choice.predicted_tau == pytest.approx(1.5)
    assert choice.predicted_speedup == pytest.approx(1.5 / 1.3)
    speedups = [c["speedup"] for c in choice.candidates]
    assert speedups[:2] == pytest.approx([1.5 / 1.3, 1.75 / 1.6])
    assert [c["k"] for c in choice.candidates] == list(range(1, 9))
    assert speedups == sorted(speedups, reverse=True)


def test_chain_choice_equals_brute_force_argmax_with_flat_verification():
    # a = 0.9 everywhere: τ(K) = (1 - 0.9^(K+1)) / 0.1, cost 1 + 0.05 K; longer drafts pay off up to a point
    speedup = {k: (1 - 0.9 ** (k + 1)) / 0.1 / (1 + 0.05 * k) for k in range(1, 41)}
    best = max(speedup, key=speedup.get)
    assert 1 < best < 40
    choice = choose_chain_k([0.9] * 8, FLAT, 0.05, ks=range(1, 41))
    assert choice.k == best
    assert choice.predicted_speedup == pytest.approx(speedup[best])


def test_chain_choice_equals_brute_force_argmax_with_measured_verification():
    a = [0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6]
    ratios = {1: 1.0, 41: 1.8}  # r(m) = 1 + 0.02 (m - 1)
    speedup = {}
    for k in range(1, 17):
        tau, reach = 1.0, 1.0
        for i in range(k):
            reach *= a[min(i, 7)]
            tau += reach
        speedup[k] = tau / (1 + 0.02 * k + 0.04 * k)
    choice = choose_chain_k(a, ratios, 0.04, ks=range(1, 17))
    assert choice.k == max(speedup, key=speedup.get)
    assert [c["speedup"] for c in choice.candidates] == pytest.approx(list(speedup.values()))


def test_steep_verification_chooses_the_shortest_draft():
    assert choose_chain_k([0.95] * 8, STEEP, 0.1).k == 1
    assert choose_chain_k([0.95] * 8, STEEP, 0.0, ks=range(3, 9)).k == 3
    # every K ties at S = 1 (all accepted, verification as dear as plain decoding): the smaller K wins
    tie = choose_chain_k([1.0] * 8, STEEP, 0.0)
    assert tie.k == 1 and tie.predicted_speedup == pytest.approx(1.0)


def test_tree_tau_by_hand():
    accuracy = [[0.6, 0.2], [0.5, 0.3]]
    paths = [(0,), (1,), (0, 0), (0, 1)]
    assert tree_tau(accuracy, paths) == pytest.approx(1 + 0.6 + 0.2 + 0.6 * 0.5 + 0.6 * 0.3)
    assert tree_tau(accuracy, [(0,), (0, 0)]) == pytest.approx(chain_tau([0.6, 0.5], 2))


def test_tree_choice_is_larger_when_verification_is_flat_than_steep():
    accuracy = [[0.7, 0.15, 0.05, 0.03]] * 5
    flat = choose_tree(accuracy, FLAT, 0.05)
    steep = choose_tree(accuracy, STEEP, 0.05)
    assert flat.tree_size > steep.tree_size
    assert steep.tree_size == 2
    for choice in (flat, steep):
        assert choice.predicted_speedup == max(c["speedup"] for c in choice.candidates)
        paths = static_tree(accuracy, choice.tree_size, choice.k)
        assert len(paths) == choice.tree_size and max(map(len, paths)) == choice.k
        assert choice.predicted_tau == pytest.approx(tree_tau(accuracy, paths))


def test_tree_cost_counts_one_drafter_forward_per_depth():
    accuracy = [[0.6, 0.2], [0.5, 0.3]]
    choice = choose_tree(accuracy, FLAT, 0.25, sizes=[4], max_depth=2)
    by_shape = {(c["k"], c["tree_size"]): c for c in choice.candidates}
    assert set(by_shape) == {(1, 2), (2, 4)}  # depth 1 holds only the two ranks measured
    assert by_shape[(2, 4)]["speedup"] == pytest.approx(2.28 / (1 + 2 * 0.25))
    assert by_shape[(1, 2)]["speedup"] == pytest.approx(1.8 / (1 + 0.25))


def test_bad_inputs_are_named():
    with pytest.raises(DraftsmithError, match=r"\[0, 1\]"):
        choose_chain_k([1.5], FLAT, 0.1)
    with pytest.raises(DraftsmithError, match="no values"):
        choose_chain_k([], FLAT, 0.1)
    with pytest.raises(DraftsmithError, match="ratios"):
        choose_chain_k([0.5], {}, 0.1)
    with pytest.raises(DraftsmithError, match=">= 1"):
        choose_chain_k([0.5], FLAT, 0.1, ks=[0, 1])


def test_the_shape_auto_k_records_is_its_choice_with_cost_and_source_and_reads_back():
    choice = choose_chain_k([0.9, 0.8, 0.5], {1: 1.0, 9: 1.5}, 0.05, ks=range(1, 5))
    shape = Shape.of(choice, cost=0.0512345, source="calibration")
    assert (shape.k, shape.tree_size, shape.candidates) == (choice.k, None, choice.candidates)
    saved = shape.to_dict()
    assert list(saved) == ["k", "tree_size", "predicted_tau", "predicted_speedup", "cost", "source", "candidates"]
    assert saved["cost"] == 0.05123 and saved["predicted_tau"] == round(choice.predicted_tau, 4)
    assert Shape.from_dict(saved).to_dict() == saved
