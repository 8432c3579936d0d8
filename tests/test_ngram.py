"""The prompt-lookup drafter proposes what followed the latest earlier occurrence of the suffix."""

import torch

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import TargetOutput
from draftsmith.families.ngram.drafter import NGramDrafter

NO_TARGET = TargetOutput(torch.zeros(0, 1), ())


def propose(ids, k=3, **kw):
    drafter = NGramDrafter(**kw)
    state = drafter.begin(torch.tensor(ids), NO_TARGET)
    return drafter, state, drafter.propose(state, k, Sampling(), None).tokens.tolist()


def test_copies_continuation_of_longest_matching_suffix():
    # suffix (7, 8) occurred before, followed by 9 10 11; unigram 8 most recently followed by 1
    _, _, draft = propose([7, 8, 9, 10, 11, 8, 1, 2, 7, 8], k=3, max_ngram=2)
    assert draft == [9, 10, 11]


def test_falls_back_to_shorter_ngrams_and_latest_occurrence():
    _, _, draft = propose([5, 1, 4, 5, 2, 6, 5], k=2, max_ngram=3)
    assert draft == [2, 6]


def test_no_match_gives_empty_draft():
    _, _, draft = propose([1, 2, 3, 4], k=3)
    assert draft == []


def test_advance_extends_the_index():
    drafter, state, _ = propose([1, 2, 3], k=2)
    drafter.advance(state, torch.tensor([1, 2]), NO_TARGET)
    assert drafter.propose(state, 2, Sampling(), None).tokens.tolist() == [3, 1]


def test_a_match_near_the_end_copies_on_through_its_own_draft():
    # the latest occurrence of (4,) is one token back: a repeat of period 2, drafted to full length
    _, _, draft = propose([9, 3, 4, 3, 4], k=5, max_ngram=1)
    assert draft == [3, 4, 3, 4, 3]
    # a plain run of one token (period 1)
    _, _, draft = propose([1, 2, 2, 2], k=3, max_ngram=2)
    assert draft == [2, 2, 2]
