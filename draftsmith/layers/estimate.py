"""Cheap teacher-forced estimate of the verifier's mean accepted length τ (``val/tau_est``).

A drafter is unrolled K steps from every position of held-out sequences, as it
drafts; ``acceptance_prob`` says how likely each step's token is accepted. The
verifier does not draft from every position, though: a round that accepts L
tokens jumps L + 1 positions ahead, so long runs of easy text are crossed in few
rounds. Averaging over all positions therefore over-weights the easy ones (on
the default target by ~30%). ``replay_rounds`` instead walks each sequence the
way the verifier does and averages over the rounds it would run. On greedy data
with greedy acceptance this reproduces the verifier's rounds exactly.
"""

from __future__ import annotations

import torch

from draftsmith.core.sampling import Sampling, probs


def choice(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """What acceptance compares of (..., V) logits: greedy, the argmax token (...); else the distribution ``sampling``
    draws from (..., V). The greedy one is what ``probs``' one-hot distribution says, without building (..., V)
    floats: on a 49k vocabulary, K of them a batch were most of a validation (issue 86)."""
    return logits.float().argmax(-1) if sampling.greedy else probs(logits, sampling)


def choice_ahead(target: torch.Tensor, s: int) -> torch.Tensor:
    """The target's ``choice`` s rows ahead along T: row t holds row t + s; past the end, a choice no draft matches
    (token -1, or a distribution of zeros)."""
    pad = torch.full_like(target[:, :s], -1) if not target.is_floating_point() else torch.zeros_like(target[:, :s])
    return torch.cat([target[:, s:], pad], dim=1)


def acceptance_prob(
    p: torch.Tensor, q: torch.Tensor, greedy: bool, draft_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Probability the draft token is accepted, from the target's ``choice`` p and the drafter's q -> (...).

    Greedy: 1 if the drafter's argmax is the target's. Sampling: sum_v min(p, q). ``draft_ids``: q is over these
    tokens of the target's vocabulary only (the drafter's own smaller vocabulary; it drafts no other token).
    """
    if greedy:
        return ((q if draft_ids is None else draft_ids[q]) == p).float()
    return torch.minimum(p if draft_ids is None else p[..., draft_ids], q).sum(-1)


def accepted_lengths(step_accept: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """(K, ...) per-step acceptance probabilities -> (...) tokens accepted before the first rejection.

    Probabilities of exactly 0 or 1 (greedy) give a deterministic result; others are drawn.
    """
    u = torch.rand(step_accept.shape, generator=generator, device=step_accept.device)
    return (u < step_accept).int().cumprod(0).sum(0)


def replay_rounds(
    step_accept: torch.Tensor, valid: torch.Tensor, generator: torch.Generator | None = None
) -> list[list[tuple[int, int]]]:
    """The verifier's rounds along each sequence, replayed from teacher-forced acceptance.

    Args:
        step_accept: (K, B, T) acceptance probability of draft step j from anchor t of row b
            (anchor t pairs token x_{t+1} with the target's state at t; step j proposes x_{t+j+2}).
        valid: (K, B, T) whether step j from anchor t has a generated target token to compare to.
        generator: for the draws when probabilities are not 0/1.

    Returns:
        per row, (anchor, tokens accepted) of each round whose K drafted tokens and bonus token all
        lie in the generated text (the verifier's full-length rounds). The first
        round starts one anchor after the first checkable one: that first generated token comes
        from the target's own prefill, as in the verifier.
    """
    lengths = accepted_lengths(step_accept, generator).tolist()
    full = valid.all(0).tolist()
    first = valid[0].int().argmax(-1).tolist()
    rounds = []
    for b, row in enumerate(full):
        out, t = [], first[b] + 1 if valid[0, b].any() else len(row)
        while t + 1 < len(row) and row[t + 1]:  # K drafts and the bonus token are all generated text
            n = lengths[b][t]
            out.append((t, n))
            t += n + 1
        rounds.append(out)
    return rounds


def tau_from_rounds(rounds: list[list[tuple[int, int]]]) -> tuple[int, int]:
    """(tokens, rounds) summed over rows: τ = tokens / rounds (each round adds its accepted + 1)."""
    flat = [n for row in rounds for _, n in row]
    return sum(flat) + len(flat), len(flat)


LEARNED_TAU = 1.05
"""The ``val/tau_est`` a drafter that learned anything exceeds: an untrained one scores about 1.0-1.03 (its top
choice matches the target's now and then by chance), and so does a drafter whose weights turned NaN (the argmax of
NaN logits is still a token)."""


def did_not_learn(taus: list[tuple[int, float]], ended: bool = False) -> str | None:
    """Why a fit's ``val/tau_est`` curve, (step, τ) per validation, says its drafter did not learn, else None: from
    its second validation on (or at its end, ``ended``, whatever their number) the latest τ is at most
    ``LEARNED_TAU``, never having risen above it or having fallen back."""
    if not taus or (len(taus) < 2 and not ended):
        return None
    step, last = taus[-1]
    if last > LEARNED_TAU:
        return None
    best_step, best = max(taus, key=lambda t: t[1])
    if best <= LEARNED_TAU:
        return f"val/tau_est {last:.3f} at step {step} has not risen above {LEARNED_TAU}"
    return f"val/tau_est fell back to {last:.3f} at step {step} from {best:.3f} at step {best_step}"
