"""``val/tau_est``'s acceptance (``layers/estimate.py``): every family compares the target's and its drafter's
``choice`` (argmax tokens when greedy, distributions when sampling) instead of one-hot (B, T, V) tensors; these
tests hold it to the definition, the overlap of the two full-vocabulary distributions, built here independently."""

from __future__ import annotations

import pytest
import torch

from draftsmith.core.sampling import Sampling
from draftsmith.layers.estimate import acceptance_prob, choice, choice_ahead

V, VD = 40, 12


def overlap(p_logits: torch.Tensor, q_logits: torch.Tensor, sampling: Sampling, ids: torch.Tensor | None):
    """The definition: sum over the full vocabulary of min(p, q), q zero outside the drafter's tokens ``ids``; a
    greedy distribution is the one-hot of its argmax."""

    def dist(logits):
        if sampling.greedy:
            return torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)
        return torch.softmax(logits / sampling.temperature, -1)

    p, q_own = dist(p_logits), dist(q_logits)
    q = torch.zeros_like(p)
    q[..., ids if ids is not None else slice(None)] = q_own
    return torch.minimum(p, q).sum(-1)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
@pytest.mark.parametrize("own_vocab", [False, True])
def test_acceptance_of_choices_is_the_overlap_of_the_full_distributions(temperature, own_vocab):
    torch.manual_seed(0)
    sampling = Sampling(temperature)
    ids = torch.randperm(V)[:VD].sort().values if own_vocab else None
    p_logits = torch.randn(3, 50, V)
    q_logits = torch.randn(3, 50, VD if own_vocab else V)
    # make some greedy drafts right: the drafter's argmax is the target's where it can be
    wanted = p_logits.argmax(-1)
    for b, t in zip(*torch.nonzero(torch.rand(3, 50) < 0.5, as_tuple=True), strict=True):
        where = (ids == wanted[b, t]).nonzero() if own_vocab else wanted[b, t][None, None]
        if len(where):
            q_logits[b, t, where[0, 0]] = 10.0
    got = acceptance_prob(choice(p_logits, sampling), choice(q_logits, sampling), sampling.greedy, ids)
    expected = overlap(p_logits, q_logits, sampling, ids)
    assert got.shape == (3, 50)
    torch.testing.assert_close(got, expected)
    if sampling.greedy:
        assert 0 < got.sum() < got.numel()  # both answers occur


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_step_past_the_end_of_the_text_is_never_accepted(temperature):
    """``choice_ahead`` pads with a choice no draft matches, not token 0 (a real token a drafter may pick)."""
    sampling = Sampling(temperature)
    p_logits, q_logits = torch.full((1, 6, V), -5.0), torch.full((1, 6, V), -5.0)
    p_logits[..., 0] = q_logits[..., 0] = 5.0  # both pick token 0 everywhere
    got = acceptance_prob(choice_ahead(choice(p_logits, sampling), 2), choice(q_logits, sampling), sampling.greedy)
    assert got[0, :4].min() > 0.99 and got[0, 4:].abs().max() == 0, got
