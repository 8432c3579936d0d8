"""The speculative decoding loop, and plain decoding of the same target to compare against."""

from __future__ import annotations

import time

import torch

from draftsmith.core import trees
from draftsmith.core.draft import DecodeResult, Draft, Drafter
from draftsmith.core.sampling import (
    Sampling,
    one_hot,
    probs,
    sample,
    verify_chain_greedy,
    verify_chain_judged,
    verify_chain_sampling,
)
from draftsmith.core.target import Target, TargetOutput, keep_positions, rollback
from draftsmith.core.trees import TreeKind, VerifyRule
from draftsmith.errors import DraftsmithError


def check_compatible(target: Target, drafter: Drafter, drafter_name: str) -> None:
    """Refuse a drafter whose token space differs from the target's, naming both."""
    t_hash = target.fingerprint["tokenizer_hash"]
    if drafter.vocab_size is not None and drafter.vocab_size != target.vocab_size:
        raise DraftsmithError(
            f"drafter {drafter_name!r} has vocabulary size {drafter.vocab_size} but target "
            f"{target.name!r} has {target.vocab_size}: they must share a tokenizer (a draft model with its own: xvocab:DIR)"
        )
    if drafter.tokenizer_hash is not None and t_hash is not None and drafter.tokenizer_hash != t_hash:
        raise DraftsmithError(
            f"drafter {drafter_name!r} uses a different tokenizer (hash {drafter.tokenizer_hash}) than "
            f"target {target.name!r} (hash {t_hash}): they must share a tokenizer (a draft model with its own: xvocab:DIR)"
        )


def check_rule(drafter: Drafter, verify: trees.VerifyRule, sampling: Sampling, drafter_name: str = "drafter") -> None:
    """Refuse a verification rule the drafter cannot feed, in one line naming both."""
    from draftsmith.layers.tree_draft import TreeDrafter

    if not isinstance(verify, trees.VerifyRule):
        raise TypeError(f"verify is a trees.VerifyRule (VerifyRule.parse reads --verify), got {verify!r}")
    tree = drafter.tree if isinstance(drafter, TreeDrafter) else None
    kind = tree.kind if tree is not None else None
    if kind is TreeKind.BEAM and verify is not VerifyRule.RSD:
        raise DraftsmithError(
            f"{drafter_name!r} drafts a beam tree (RSD-S: siblings drawn without replacement by stochastic beam "
            f"search): verify it with --verify rsd, not {verify}"
        )
    if verify is VerifyRule.SPECINFER:
        return
    if sampling.greedy:
        raise DraftsmithError(
            f"--verify {verify} is a rule for sampling: it needs --temperature > 0 (greedy verification follows the "
            "target's argmax whatever the rule)"
        )
    if kind is TreeKind.BEAM:
        return
    if kind is not TreeKind.SAMPLED:
        raise DraftsmithError(
            f"--verify {verify} needs several candidates drawn per node, and {drafter_name!r} drafts "
            f"{'one chain' if tree is None else f'a {kind} tree'}: use --tree sampled"
            f"{' or --tree beam (RSD-S)' if verify is VerifyRule.RSD else ''} with a tree drafter "
            "(EAGLE, Medusa, Hydra, Clover, Falcon, the parallel drafters, draft LMs)"
        )
    if tree.replacement != verify.replacement:
        how = "with" if verify.replacement else "without"
        raise DraftsmithError(
            f"--verify {verify} needs siblings drawn {how} replacement; {drafter_name!r} draws "
            "them the other way (set its tree policy's replacement)"
        )


def _finish(tokens: list[int], max_new_tokens: int, eos: tuple[int, ...]) -> tuple[list[int], bool]:
    """Cut at max_new_tokens and after the first of the ``eos`` tokens; say whether decoding is done."""
    stop = next((i for i, t in enumerate(tokens[:max_new_tokens]) if t in eos), None)
    if stop is not None:
        return tokens[: stop + 1], True
    return tokens[:max_new_tokens], len(tokens) >= max_new_tokens


class SpeculativeDecoder:
    """Speculative decoding of one sequence at a time (batch 1), chain or tree drafts.

    The target's KV cache holds every committed token but the last; each round
    the drafter proposes k tokens, the target scores [last, d_1..d_k] in one
    forward, the acceptance rule keeps a prefix and adds one target token, and
    the cache is cropped back to the kept prefix.

    Args:
        target: the frozen target.
        drafter: any ``Drafter``.
        k: tokens drafted per round.
        sampling: greedy (temperature 0) or sampling settings of the target.
        verify: the multi-candidate rule for sampled trees (``VerifyRule``): SpecInfer (also every deterministic
            tree's), SpecTr or RSD; these two need a drafter drawing several candidates per node the rule's way
            (``--tree sampled``) and sampling.
        judge: Judge decoding (LOSSY): a draft token the rule rejects is kept when this head, reading the target's
            final hidden state at the token's position, judges it correct (``families.judge``; chains only).
    """

    def __init__(
        self,
        target: Target,
        drafter: Drafter,
        k: int,
        sampling: Sampling,
        verify: VerifyRule = VerifyRule.SPECINFER,
        judge=None,
    ) -> None:
        if k <= 0:
            raise DraftsmithError(f"k (draft length) must be a positive integer, got {k}")
        check_rule(drafter, verify, sampling)
        self.target, self.drafter, self.k, self.sampling, self.verify = target, drafter, k, sampling, verify
        self.judge = judge
        drafter.bind(target)

    def _verify(self, out: TargetOutput, draft: Draft, generator) -> tuple[int, int, int]:
        """(kept draft tokens, the target's next token, of the kept how many only the judge kept)."""
        tokens, logits = draft.tokens.tolist(), out.logits[0]
        if self.sampling.greedy and self.judge is None:
            return (*verify_chain_greedy(logits.argmax(-1).tolist(), tokens), 0)
        p = probs(logits.cpu(), self.sampling)  # the rules draw on the CPU, with the caller's CPU generator
        q = draft.q.cpu() if draft.q is not None else None
        if q is None or self.sampling.greedy:  # deterministic drafter (or greedy): a point mass on each token
            q = torch.stack([one_hot(t, p.shape[-1]) for t in tokens]) if tokens else p[:0]
        if self.judge is None:
            return (*verify_chain_sampling(p, q, tokens, generator), 0)
        judged = self.judge.accepts(out.features[-1][0, 1 : 1 + len(tokens)])
        return verify_chain_judged(p, q, tokens, judged, generator)

    def _layers(self) -> tuple[bool, tuple[int, ...] | None]:
        """(with_features, feature_layers) of the verification forward: the drafter's, and with a judge the target's
        final hidden state last."""
        feats, layers = self.drafter.needs_features, self.drafter.feature_layers
        if self.judge is None:
            return feats, layers
        own = (layers or self.target.feature_layers) if feats else ()
        return True, (*own, self.target.num_layers)

    def _for_drafter(self, out: TargetOutput) -> TargetOutput:
        """``out`` without the judge's layer (the drafter reads only its own)."""
        if self.judge is None:
            return out
        return TargetOutput(out.logits, out.features[:-1], out.past_key_values)

    def _tree_round(self, cache, last: int, draft: Draft, generator, layers) -> tuple[list[int], TargetOutput, int]:
        """Verify a token tree in one target forward; keep the accepted path's cache entries.

        Returns the committed tokens (accepted path + the target's token), the target rows that
        predicted them (for ``drafter.advance``) and how many draft tokens the target verified (duplicates once).
        """
        target, committed = self.target, cache.get_seq_length()
        tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
        nodes, index = trees.unique(tokens, parents)  # duplicate candidates verified once
        merged = torch.tensor([-1 if parents[u] < 0 else index[parents[u]] for u in nodes], dtype=torch.long)
        seq = torch.tensor([[last] + [tokens[u] for u in nodes]])
        mask = trees.attention_mask(merged, committed, target.model.dtype).to(target.device)
        pos = trees.positions(merged, committed).to(target.device)
        feats = self.drafter.needs_features
        out = target(seq, cache, attention_mask=mask, position_ids=pos, with_features=feats, feature_layers=layers)
        rows_of = torch.tensor([0] + [1 + j for j in index])  # each drafted node's row in the verified sequence
        logits = out.logits[0]
        if self.sampling.greedy:
            path, nxt = trees.verify_tree_greedy(logits.argmax(-1)[rows_of].tolist(), tokens, draft.parents)
        else:
            q = draft.q.cpu() if draft.q is not None else None
            path, nxt = self.verify.verify_tree(
                probs(logits.cpu(), self.sampling)[rows_of], q, tokens, draft.parents, generator
            )
        keep_positions(cache, list(range(committed + 1)) + [committed + 1 + index[i] for i in path])
        return [tokens[i] for i in path] + [nxt], out.positions(rows_of[[0] + [1 + i for i in path]]), len(nodes)

    @torch.inference_mode()
    def generate(
        self, prompt: list[int], max_new_tokens: int, generator: torch.Generator | None = None
    ) -> DecodeResult:
        target, drafter = self.target, self.drafter
        start = time.perf_counter()
        cache = target.new_cache()
        ids = torch.tensor([prompt])
        # the prefill feeds the drafter only; the judge reads verification forwards
        out = target(ids, cache, with_features=drafter.needs_features, feature_layers=drafter.feature_layers)
        feats, layers = self._layers()
        first = _pick(out.logits[0, -1], self.sampling, generator)
        result = DecodeResult(tokens=[first], target_calls=1)
        result.tokens, done = _finish(result.tokens, max_new_tokens, target.eos_token_ids)
        t0 = time.perf_counter()
        state = drafter.begin(torch.tensor(prompt + [first]), out.positions(slice(None)))
        result.draft_seconds += time.perf_counter() - t0
        while not done:
            k = min(self.k, max_new_tokens - len(result.tokens) - 1)
            t0 = time.perf_counter()
            draft = drafter.propose(state, k, self.sampling, generator) if k > 0 else Draft.empty()
            result.draft_seconds += time.perf_counter() - t0
            if not draft.is_chain:
                if self.judge is not None:
                    raise DraftsmithError("judge decoding verifies chains: score judged drafters with --tree chain")
                new, rows, verified = self._tree_round(cache, result.tokens[-1], draft, generator, layers)
                result.target_calls += 1
                result.accepted.append(len(new) - 1)
                result.drafted.append(verified)
                result.depth.append(int(trees.depths(draft.parents).max()))
                t0 = time.perf_counter()
                drafter.advance(state, torch.tensor(new), rows)
                result.draft_seconds += time.perf_counter() - t0
                result.tokens.extend(new)
                result.tokens, done = _finish(result.tokens, max_new_tokens, target.eos_token_ids)
                continue
            committed = cache.get_seq_length()
            step = torch.cat([torch.tensor([result.tokens[-1]]), draft.tokens])[None]  # (1, 1+n)
            out = target(step, cache, with_features=feats, feature_layers=layers)
            result.target_calls += 1
            n, nxt, judged = self._verify(out, draft, generator)
            rollback(cache, committed + 1 + n)
            new = draft.tokens[:n].tolist() + [nxt]
            result.accepted.append(n)
            result.drafted.append(len(draft))
            result.depth.append(len(draft))
            if self.judge is not None:
                result.judged.append(judged)
            t0 = time.perf_counter()
            drafter.advance(state, torch.tensor(new), self._for_drafter(out).positions(slice(0, n + 1)))
            result.draft_seconds += time.perf_counter() - t0
            result.tokens.extend(new)
            result.tokens, done = _finish(result.tokens, max_new_tokens, target.eos_token_ids)
        result.seconds = time.perf_counter() - start
        return result


def _pick(logits: torch.Tensor, sampling: Sampling, generator) -> int:
    return int(logits.argmax()) if sampling.greedy else sample(probs(logits.cpu(), sampling), generator)


@torch.inference_mode()
def plain_decode(
    target: Target,
    prompt: list[int],
    max_new_tokens: int,
    sampling: Sampling,
    generator: torch.Generator | None = None,
) -> DecodeResult:
    """Ordinary autoregressive decoding of the target with its KV cache: the baseline."""
    start = time.perf_counter()
    cache = target.new_cache()
    out = target(torch.tensor([prompt]), cache, with_features=False)
    result = DecodeResult(tokens=[_pick(out.logits[0, -1], sampling, generator)], target_calls=1)
    result.tokens, done = _finish(result.tokens, max_new_tokens, target.eos_token_ids)
    while not done:
        out = target(torch.tensor([[result.tokens[-1]]]), cache, with_features=False)
        result.target_calls += 1
        result.tokens.append(_pick(out.logits[0, -1], sampling, generator))
        result.tokens, done = _finish(result.tokens, max_new_tokens, target.eos_token_ids)
    result.seconds = time.perf_counter() - start
    return result
