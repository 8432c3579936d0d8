"""Falcon (Gao et al. 2024): EAGLE-1's drafter made semi-autoregressive, ``block`` (k) tokens per forward.

The network is EAGLE-1's (``families/eagle``): anchor i pairs token x_{i+1} with the target feature f_i,
fc(concat(embed(x_{i+1}), f_i)) runs through one decoder layer, and the target's frozen LM head reads the output.
What changes:

- **Rows predict k-1 further.** Row i predicts x_{i+1+k} (EAGLE's predicts x_{i+2}; k = 1 is EAGLE-1), and its
  output is regressed onto f_{i+k}, the feature the target's head turns into that token.
- **Relaxed causal mask.** Rows are cut into blocks of k: a row sees every earlier block and its whole own block.
  After the last committed anchor t one forward runs the block t-k+1..t, whose offset o predicts the (o+1)-th
  next token x_{t+2+o}: k tokens. The next forward reads those k tokens paired with the k outputs that predicted
  them (own features, as EAGLE reads its own hidden states) at the k positions that follow, seeing the real
  context, the round's earlier drafted blocks and its own block.
- **Pads.** k-1 pad rows (zero embedding and feature) come before anchor 0, so the first round of a prompt
  shorter than k has a whole block too.

One layer's keys and values do not depend on the mask, so committed rows are cached once; each round reruns only
the rows committed since and the last block (whose rows now see a block that ends later; their keys come out
the same). Training unrolls ``passes``
forwards over the whole padded sequence (``forward``), as EAGLE-3's training-time test does per token: pass s
puts at row r the round whose first block holds r, s blocks on; blocks start at ``alignment`` (one of k ways
of cutting the rows; ``steps`` runs all k, so every anchor is a block end once, as drafting needs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from draftsmith.errors import DraftsmithError
from draftsmith.families.eagle.config import Eagle1Config, EagleConfig
from draftsmith.families.eagle.network import EagleDrafter, EagleModel
from draftsmith.families.registry import extended, register
from draftsmith.layers.attention import sees_itself
from draftsmith.layers.tree_draft import FeatureState


@dataclass
class FalconConfig(Eagle1Config):
    """EAGLE-1's shape plus the block size."""

    block: int = 2
    """Tokens one drafter forward emits (the paper's k); 1 is EAGLE-1."""

    def __post_init__(self) -> None:
        if self.block < 1:
            raise DraftsmithError(f"falcon: block must be at least 1, got {self.block}")

    @classmethod
    def for_target(cls, target_config, block: int) -> FalconConfig:
        """The Falcon drafter of a target with this HF config (EAGLE-1's layer shape)."""
        base = EagleConfig.from_target(target_config, 1, (-1,))
        return extended(base, cls, block=block)


def ahead(x: torch.Tensor, n: int, length: int) -> torch.Tensor:
    """(B, T, ...) -> (B, length, ...) whose row r holds x[:, r + n] (zeros past the end); n >= 0."""
    x = x[:, n : n + length]
    return torch.cat([x, x.new_zeros((x.shape[0], length - x.shape[1], *x.shape[2:]))], dim=1)


def block_mask(length: int, block: int, alignment: int, step: int, valid: torch.Tensor | None, device) -> torch.Tensor:
    """Attention mask of pass ``step`` over the keys of passes 0..step: (B or 1, 1, L, (step+1)L) bool.

    Row r is in block (r + alignment) // block. Pass-0 keys are block-causal (a row sees its whole block and
    every earlier one); keys of passes >= 1 only within the query's own block (its own round's drafted blocks). A row
    of a sequence with no real token sees its own key of this pass. ``block = 1`` is EAGLE's ``ttt_mask``.
    """
    idx = (torch.arange(length, device=device) + alignment) // block
    causal = idx[None, :] <= idx[:, None]  # (L, L)
    same = idx[None, :] == idx[:, None]
    mask = torch.cat([causal] + [same] * step, dim=1)[None, None]  # (1, 1, L, (step+1)L)
    if valid is not None:
        mask = sees_itself(mask & torch.cat([valid] * (step + 1), dim=1)[:, None, None, :].bool())
    return mask


@register("falcon", config=FalconConfig)
class FalconModel(EagleModel):
    """EAGLE-1's network (fc, one layer, the target's frozen embedding and LM head) drafting k tokens a forward."""

    method = "falcon"

    def __init__(self, cfg: FalconConfig) -> None:
        super().__init__(cfg)

    def as_drafter(self, topk_accuracy: list[list[float]] | None = None) -> FalconDrafter:
        return FalconDrafter(self, topk_accuracy)

    @property
    def pads(self) -> int:
        """Pad rows before anchor 0."""
        return self.cfg.block - 1

    def step(self, tokens, hidden, positions, past_k, past_v, mask):
        """EAGLE-1's layer on tokens (B, T) with hidden (B, T, H); token id -1 is a pad row (zero embedding)."""
        embeds = self.embed_tokens(tokens.clamp_min(0)) * (tokens >= 0).unsqueeze(-1).to(hidden.dtype)
        x = self.fc(torch.cat([embeds, hidden], dim=-1))
        cos, sin = self.rotary(x, positions)
        return self.layer(None, x, cos, sin, past_k, past_v, mask)

    def first_inputs(self, input_ids: torch.Tensor, features: tuple[torch.Tensor, ...]):
        """Pass 0's real inputs over the L = T + k - 1 padded rows: tokens (B, L) (-1 on pads; 0 after the
        end) and features (B, L, H); row r is anchor r - (k - 1)."""
        tokens = F.pad(F.pad(input_ids[:, 1:], (0, 1), value=0), (self.pads, 0), value=-1)
        return tokens, F.pad(self.fuse(features), (0, 0, self.pads, 0))

    def real_inputs(self, input_ids: torch.Tensor, features: tuple[torch.Tensor, ...], step: int):
        """The real tokens (B, L) and target features (B, L, H) at pass ``step`` >= 1's rows: row r is anchor
        r - (k - 1) + step * k, the anchors drafting fills with its own tokens and outputs."""
        n, length = step * self.cfg.block - self.pads, input_ids.shape[1] + self.pads
        return ahead(input_ids, n + 1, length), ahead(self.fuse(features), n, length)

    def run(self, tokens, hidden, step: int, alignment: int, valid, past_k=None, past_v=None):
        """Pass ``step`` over the padded rows (keys of the earlier passes in past_k/v; ``valid`` (B, L) or None):
        (output (B, L, H), k, v); row r's output predicts x_{r - (k-1) + (step+1) k + 1}."""
        b, length = tokens.shape
        k = self.cfg.block
        positions = (torch.arange(length, device=tokens.device) - self.pads + step * k).expand(b, length)
        mask = block_mask(length, k, alignment, step, valid, tokens.device)
        return self.step(tokens, hidden, positions, past_k, past_v, mask)

    def pad_valid(self, valid: torch.Tensor | None) -> torch.Tensor | None:
        """(B, T) -> (B, L): pad rows are always valid."""
        return None if valid is None else F.pad(valid, (self.pads, 0), value=1)

    def forward(
        self, input_ids: torch.Tensor, features: tuple[torch.Tensor, ...], valid, alignment: int, passes: int
    ) -> list[torch.Tensor]:
        """Drafting teacher-forced for ``passes`` forwards: pass s >= 1 reads the real tokens with its own
        previous outputs (what drafting reads once the earlier drafts are the real tokens).

        Args:
            input_ids: (B, T) the sequence x.
            features: target features at each position, each (B, T, Ht).
            valid: (B, T) 1 on real (non-pad) positions, or None.
            alignment: where blocks start (row r is in block (r + alignment) // k).
            passes: forwards to unroll.

        Returns:
            per pass, the outputs (B, L, H) over the padded rows (see ``run``).
        """
        tokens, hidden = self.first_inputs(input_ids, features)
        valid = self.pad_valid(valid)
        outs, past_k, past_v = [], None, None
        for s in range(passes):
            if s:
                tokens, hidden = self.real_inputs(input_ids, features, s)[0], outs[-1]
            out, k, v = self.run(tokens, hidden, s, alignment, valid, past_k, past_v)
            past_k = k if past_k is None else torch.cat([past_k, k], dim=2)
            past_v = v if past_v is None else torch.cat([past_v, v], dim=2)
            outs.append(out)
        return outs

    def steps(self, input_ids: torch.Tensor, features: tuple[torch.Tensor, ...], valid, depth: int):
        """Per draft step d < ``depth``, the output (B, T, H) that drafts it from each anchor t (as the last
        committed anchor), teacher-forced: it predicts x_{t+d+2}.

        Anchor t's round starts with the block ending at t (padded rows t..t+k-1), cut by alignment (-t) mod k;
        step d = s k + o is pass s's row t + o.
        """
        k, t = self.cfg.block, input_ids.shape[1]
        passes = -(-depth // k)
        outs = [self(input_ids, features, valid, a, passes) for a in range(k)]
        anchors = torch.arange(t, device=input_ids.device)
        alignment = (-anchors) % k  # (T,)
        steps = []
        for d in range(depth):
            s, o = divmod(d, k)
            stacked = torch.stack([outs[a][s][:, o : o + t] for a in range(k)])  # (k, B, T, H)
            steps.append(stacked[alignment, :, anchors].transpose(0, 1))  # (B, T, H)
        return steps


@dataclass
class FalconScratch:
    """One round's drafted blocks (discarded after the round), keyed by the node whose block a forward read:
    -1 for the root's forward (the committed block), else a node at depth k, 2k, ..."""

    blocks: dict[int, tuple[torch.Tensor, torch.Tensor]]
    """key -> (outputs (1, k, H), logits (k, V)): row o drafts the token o + 1 deeper than the key."""
    slot: dict[int, int] = field(default_factory=dict)
    """key (a drafted block) -> index of its first row's keys/values in keys/values."""
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None


class FalconDrafter(EagleDrafter):
    """The verifier's view of a ``FalconModel``: chains and trees whose every k depths cost one forward.

    A node at depth d gets its child's distribution from row d mod k of the forward that drafted its block (the
    root's for d < k, else the one keyed by its ancestor at depth k * (d // k)): ``grow`` on nodes inside a block
    only reads rows already computed, and on nodes ending a block runs their next blocks, batched in one forward.
    Siblings inside a block so share their children's distribution: a tree expands the top choices of a block's
    first token, each followed by its block.
    """

    @torch.no_grad()
    def root(self, state: FeatureState) -> tuple[FalconScratch, torch.Tensor]:
        """Run the rows committed since the last round (cached for good) and the last block's queries, in one
        forward: the last k anchors' outputs draft the next k tokens."""
        model, k, pads, device = self.model, self.model.cfg.block, self.model.pads, state.features.device
        last = len(state.tokens) - 2  # the last committed anchor
        first = state.cached - pads if state.past_k is not None else -pads  # first anchor without keys
        lo = min(first, last - k + 1)
        rows = range(lo, last + 1)
        tokens = torch.tensor([[state.tokens[i + 1] if i >= 0 else -1 for i in rows]], device=device)
        feats = state.features[max(lo, 0) : last + 1]
        hidden = torch.cat([feats.new_zeros(max(0, -lo), feats.shape[-1]), feats])[None]  # (1, m, H)
        keep = lo + pads  # cached rows kept (those after are recomputed: identical keys)
        past_k = state.past_k[:, :, :keep] if keep else None
        past_v = state.past_v[:, :, :keep] if keep else None
        mask = torch.ones(1, 1, len(rows), keep + len(rows), dtype=torch.bool, device=device)
        positions = torch.arange(lo, last + 1, device=device)[None]
        out, k_new, v_new = model.step(tokens, hidden, positions, past_k, past_v, mask)
        state.past_k = k_new if past_k is None else torch.cat([past_k, k_new], dim=2)
        state.past_v = v_new if past_v is None else torch.cat([past_v, v_new], dim=2)
        block = out[:, -k:]  # (1, k, H)
        logits = self._full_logits(block[0])
        return FalconScratch({-1: (block, logits)}), logits[0]

    @torch.no_grad()
    def grow(self, state: FeatureState, scratch: FalconScratch, tokens, parents, new) -> torch.Tensor:
        k = self.model.cfg.block
        path = {n: _path(n, parents) for n in new}  # root-first ancestors, the node last
        keys = [p[len(p) // k * k - 1] if len(p) >= k else -1 for p in path.values()]
        missing = list(dict.fromkeys(key for key in keys if key not in scratch.blocks))
        if missing:
            self._run_blocks(state, scratch, tokens, parents, missing)
        return torch.stack([scratch.blocks[key][1][len(path[n]) % k] for n, key in zip(new, keys, strict=True)])

    def _run_blocks(self, state: FeatureState, scratch: FalconScratch, tokens, parents, ends: list[int]) -> None:
        """One forward over the blocks ending at nodes ``ends`` (depths multiples of k): each block's rows see the
        context, the drafted blocks before it on its path, and the whole of itself."""
        model, k, device = self.model, self.model.cfg.block, state.features.device
        last = len(state.tokens) - 2
        drafted = 0 if scratch.keys is None else scratch.keys.shape[2]  # rows of earlier drafted blocks
        ids, hidden, positions, rows = [], [], [], []
        for end in ends:
            path = _path(end, parents)
            depth = len(path)
            before = path[k - 1 : depth - k : k]  # block ends on the path before this block
            ids += [tokens[n] for n in path[-k:]]
            hidden.append(scratch.blocks[before[-1] if before else -1][0])
            positions += range(last + depth - k + 1, last + depth + 1)
            seen = torch.zeros(drafted, dtype=torch.bool)
            for b in before:
                seen[scratch.slot[b] : scratch.slot[b] + k] = True
            rows.append(seen.expand(k, drafted))
        own = torch.block_diag(*[torch.ones(k, k, dtype=torch.bool)] * len(ends))
        context = torch.ones(len(ends) * k, state.cached, dtype=torch.bool)
        mask = torch.cat([context, torch.cat(rows), own], dim=1).to(device)[None, None]
        past_k = state.past_k if scratch.keys is None else torch.cat([state.past_k, scratch.keys], dim=2)
        past_v = state.past_v if scratch.values is None else torch.cat([state.past_v, scratch.values], dim=2)
        out, k_new, v_new = model.step(
            torch.tensor([ids], device=device),
            torch.cat(hidden, dim=1),
            torch.tensor([positions], device=device),
            past_k,
            past_v,
            mask,
        )
        scratch.keys = k_new if scratch.keys is None else torch.cat([scratch.keys, k_new], dim=2)
        scratch.values = v_new if scratch.values is None else torch.cat([scratch.values, v_new], dim=2)
        logits = self._full_logits(out[0])  # (F k, V)
        for i, end in enumerate(ends):
            scratch.slot[end] = drafted + i * k
            scratch.blocks[end] = (out[:, i * k : (i + 1) * k], logits[i * k : (i + 1) * k])


def _path(node: int, parents: list[int]) -> list[int]:
    """The nodes from depth 1 down to ``node``."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]
