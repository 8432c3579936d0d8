"""Batched sampling from the target with a KV cache, seeded per row so the batch does not change the output.

Each row (one sample of one prompt) owns a random stream seeded from
(seed, prompt index, sample index). Its token at step t is drawn by inverse-CDF
sampling with the t-th uniform of that stream, so which other rows share its
batch, and how much left padding that brings, does not change what it draws
(up to float rounding of the logits, ~1e-6, which flips a draw only when a
uniform lands that close to a boundary of the cumulative distribution).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from draftsmith.core.hf_cache import cache_arg, takes
from draftsmith.core.sampling import Sampling, probs


@dataclass
class Decoded:
    """One row's generation.

    Attributes:
        tokens: the generated ids, the EOS token included when the row reached it.
        topk_ids: (n, K) the target's K most likely tokens at each generated position (empty when K = 0).
        topk_logprobs: (n, K) their log-probabilities under the untempered target (log-softmax of the logits).
        last_hidden: (H,) the model's final hidden state at the prompt's last token, when asked for.
    """

    tokens: list[int]
    topk_ids: list[list[int]]
    topk_logprobs: list[list[float]]
    last_hidden: torch.Tensor | None = None


def row_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """The seed of one row's random stream: a hash of (seed, prompt index, sample index)."""
    digest = hashlib.sha256(f"draftsmith.generate/{seed}/{prompt_index}/{sample_index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def draw(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: row i takes the token whose cumulative-mass interval holds ``u[i]``.

    Args:
        p: (B, V) probabilities (rows need not sum exactly to 1).
        u: (B,) uniforms in [0, 1).

    Returns:
        (B,) token ids; a token of probability 0 is never drawn.
    """
    cdf = p.cumsum(-1)  # (B, V)
    total = cdf[:, -1:]  # (B, 1)
    # strictly below the total mass, so the search always lands on a token with p > 0
    v = torch.minimum(u[:, None].to(cdf.dtype) * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, v, right=True).squeeze(-1)


@torch.no_grad()
def decode_batch(
    model: PreTrainedModel,
    prompts: list[list[int]],
    seeds: list[int],
    sampling: Sampling,
    max_new_tokens: int | Sequence[int],
    eos_token_id: int | Sequence[int] | None = None,
    context: int | None = None,
    store_topk: int = 0,
    last_hidden: bool = False,
) -> list[Decoded]:
    """Sample continuations of a batch of prompts (left-padded) with one KV cache.

    A row stops after its EOS token (kept), after ``max_new_tokens``, or when its
    sequence fills ``context`` positions; finished rows ride along until the
    batch is done, as in ``model.generate``.

    Args:
        model: the target's HF causal LM.
        prompts: token ids, each non-empty and shorter than ``context``.
        seeds: one seed per prompt (see ``row_seed``); unused when greedy.
        sampling: temperature 0 is greedy (argmax).
        max_new_tokens: generation budget of every row, or one per row.
        eos_token_id: the token, or tokens (any of them), that stop a row (``Target.eos_token_ids``);
            None or empty never stops early.
        context: the model's maximum sequence length, or None for no limit.
        store_topk: also return the K most likely tokens and their log-probabilities per step.
        last_hidden: also return each row's final hidden state at its prompt's last token (what a head on the
            target's last layer reads where the first generated token is chosen).
    """
    device = model.device
    lens = torch.tensor([len(p) for p in prompts])  # (B,)
    batch, width = len(prompts), int(lens.max())
    budget = (
        torch.tensor(max_new_tokens) if isinstance(max_new_tokens, Sequence) else torch.full((batch,), max_new_tokens)
    )
    if context is not None:
        budget = budget.clamp_max(context - lens)
    if int(budget.min()) < 1:
        raise ValueError("every prompt must be non-empty and shorter than the context")
    steps = int(budget.max())

    ids = torch.zeros((batch, width), dtype=torch.long)  # left padded; pad positions are masked
    mask = torch.ones((batch, width + steps), dtype=torch.long)  # prompt + every generated position
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt) :] = torch.tensor(prompt)
        mask[i, : width - len(prompt)] = 0
    padded = bool((lens != width).any())
    prompt_pos = (mask[:, :width].cumsum(-1) - 1).clamp_min(0)  # (B, width)
    step_pos = lens[:, None] + torch.arange(steps)  # (B, steps): position of the token fed after step t
    if context is not None:
        step_pos = step_pos.clamp_max(context - 1)  # finished rows only; their outputs are ignored
    uniforms = None
    if not sampling.greedy:
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        uniforms = torch.stack([torch.rand(steps, generator=g) for g in gens]).to(device)  # (B, steps)
    stop = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or ())
    eos = torch.tensor(stop, dtype=torch.long)  # (n_eos,)
    ids, mask, prompt_pos, step_pos, budget, eos = (
        x.to(device) for x in (ids, mask, prompt_pos, step_pos, budget, eos)
    )

    cache = DynamicCache(config=model.config)
    keep = {"logits_to_keep": 1} if takes(model, "logits_to_keep") else {}
    out = model(
        input_ids=ids,
        attention_mask=mask[:, :width] if padded else None,
        position_ids=prompt_pos,
        **cache_arg(model, cache),
        use_cache=True,
        output_hidden_states=last_hidden,
        **keep,
    )
    hidden = out.hidden_states[-1][:, -1].float().cpu() if last_hidden else None
    tokens = torch.zeros((batch, steps), dtype=torch.long, device=device)
    top_ids = torch.zeros((batch, steps, store_topk), dtype=torch.long, device=device)
    top_lp = torch.zeros((batch, steps, store_topk), device=device)
    n_new = torch.zeros(batch, dtype=torch.long, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    for t in range(steps):
        logits = out.logits[:, -1].float()  # (B, V)
        if store_topk:
            top_lp[:, t], top_ids[:, t] = torch.log_softmax(logits, -1).topk(store_topk, -1)
        tok = logits.argmax(-1) if uniforms is None else draw(probs(logits, sampling), uniforms[:, t])
        tokens[:, t] = tok
        n_new += ~done
        done |= n_new >= budget
        done |= torch.isin(tok, eos)
        if t + 1 == steps or bool(done.all()):
            break
        out = model(
            input_ids=tok[:, None],
            attention_mask=mask[:, : width + t + 1] if padded else None,
            position_ids=step_pos[:, t : t + 1],
            **cache_arg(model, cache),
            use_cache=True,
        )
    counts = n_new.tolist()
    tokens_l = tokens.tolist()
    ids_l, lp_l = (top_ids.tolist(), top_lp.tolist()) if store_topk else ([[]] * batch, [[]] * batch)
    return [
        Decoded(tokens_l[i][:n], ids_l[i][:n], lp_l[i][:n], None if hidden is None else hidden[i])
        for i, n in enumerate(counts)
    ]
