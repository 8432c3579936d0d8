"""What the measured checks read: the target's greedy continuations of the prompts with every hidden state along them
(``Probe``), and the drafter's teacher-forced predictions on them.

On greedy data the drafter's argmax matching the target's next token *is* greedy acceptance, so the teacher-forced
numbers here are acceptance, as ``val/tau_est`` measures it in training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.decode.verifier import plain_decode
from draftsmith.families.eagle.network import EagleModel
from draftsmith.layers.estimate import replay_rounds, tau_from_rounds


@dataclass
class Probe:
    """The target's greedy continuation of each prompt with all its hidden states."""

    sequences: list[torch.Tensor]
    """(T,) prompt + greedy continuation, per prompt."""
    prompt_lens: list[int]
    hidden: list[tuple[torch.Tensor, ...]]
    """Per prompt, HF ``hidden_states[0..L]``, each (1, T, H)."""

    @property
    def generated(self) -> torch.Tensor:
        """Every greedy token the target generated, concatenated."""
        return torch.cat([s[n:] for s, n in zip(self.sequences, self.prompt_lens, strict=True)])


@torch.no_grad()
def probe(target: Target, prompts: list[list[int]], max_new_tokens: int) -> Probe:
    """Decode each prompt greedily with the target and read every hidden state along the result."""
    layers = tuple(range(target.num_layers + 1))
    sequences, lens, hidden = [], [], []
    for prompt in prompts:
        tokens = plain_decode(target, prompt, max_new_tokens, Sampling(0.0)).tokens
        seq = torch.tensor(prompt + tokens)
        sequences.append(seq)
        lens.append(len(prompt))
        hidden.append(target(seq[None], feature_layers=layers).features)
    return Probe(sequences, lens, hidden)


def reads_features(network) -> bool:
    """Whether the teacher-forced probe applies: an EAGLE-1 / EAGLE-3 network (P-EAGLE drafts its depths in
    parallel, with its own inputs)."""
    return type(network) is EagleModel


@torch.no_grad()
def predictions(
    network: EagleModel, probe_: Probe, layers: tuple[int, ...], steps: int, shuffled: bool = False
) -> list[torch.Tensor]:
    """Per sequence, (steps, T) the target id the drafter puts first at anchor i and step j (training-time test
    unrolled on its own features, as it drafts), reading the target's ``layers``: it predicts x_{i+j+2}.
    ``shuffled``: each anchor reads the features of another position of its sequence (a fixed permutation): real
    features of the target that say nothing of this place, the baseline of what the features add."""
    out = []
    device = next(network.parameters()).device
    ids = network.draft_ids
    generator = torch.Generator().manual_seed(0)
    for seq, hidden in zip(probe_.sequences, probe_.hidden, strict=True):
        features = tuple(hidden[layer].to(device) for layer in layers)
        if shuffled:
            order = torch.randperm(len(seq), generator=generator).to(device)
            features = tuple(f[:, order] for f in features)
        steps_out = network(seq[None].to(device), features, steps, None)
        out.append(torch.stack([ids[network.logits(h[0]).argmax(-1)].cpu() for h in steps_out]))
    return out


def hit_rate(
    preds: list[torch.Tensor], probe_: Probe, step: int, offset: int = 0, distinct: bool = False
) -> tuple[float, int]:
    """(share, count) of anchors whose step-``step`` prediction equals x_{i+step+2+offset}, over anchors whose
    x_{i+step+2} is a generated token (what the verifier would check); ``distinct``: only the anchors whose labels
    one before, at and one after their place are three different tokens (on text that repeats a token, a prediction
    of one would count as a hit of another)."""
    hits = count = 0
    for pred, seq, n in zip(preds, probe_.sequences, probe_.prompt_lens, strict=True):
        t = len(seq)
        labels = torch.arange(t) + step + 2  # label index of each anchor
        keep = (labels >= n) & (labels < t) & (labels + offset >= 0) & (labels + offset < t)
        if distinct:
            keep &= (labels >= 1) & (labels + 1 < t)
            at = seq[labels.clamp(1, t - 2)]
            before, after = seq[(labels - 1).clamp(0, t - 1)], seq[(labels + 1).clamp(0, t - 1)]
            keep &= (at != before) & (at != after) & (before != after)
        anchors = torch.arange(t)[keep]
        hits += int((pred[step, anchors] == seq[labels[keep] + offset]).sum())
        count += len(anchors)
    return (hits / count if count else 0.0), count


def teacher_forced_tau(network: EagleModel, probe_: Probe, k: int) -> float:
    """τ at chain length ``k`` estimated as training's ``val/tau_est`` is (``layers.estimate.replay_rounds``) on the
    probe's greedy text: on greedy data, the verifier's τ over its full-length rounds exactly."""
    preds = predictions(network, probe_, tuple(network.cfg.feature_layers), k)
    replayed = []
    for pred, seq, n in zip(preds, probe_.sequences, probe_.prompt_lens, strict=True):
        t = len(seq)
        accept = torch.zeros(k, 1, t)  # (K, B, T) as replay_rounds reads it
        valid = torch.zeros(k, 1, t, dtype=torch.bool)
        for j in range(k):
            labels = torch.arange(t) + j + 2
            ok = labels < t
            accept[j, 0, ok] = (pred[j, ok] == seq[labels[ok]]).float()
            valid[j, 0] = ok & (labels >= n)
        replayed += replay_rounds(accept, valid)
    tokens, count = tau_from_rounds(replayed)
    return tokens / max(1, count)


def noise(p: float, n: int) -> float:
    """A margin two standard errors wide (at least 0.03) for a share ``p`` of ``n``."""
    return max(0.03, 2 * math.sqrt(max(p * (1 - p), 0.01) / max(n, 1)))
