"""EAGLE-1 and EAGLE-3 feature drafters: one decoder layer autoregressing over the target's features.

EAGLE-1 (Li et al. 2024): input fc(concat(embed(x_{t+1}), f_t)) with f the target's
final hidden state; one decoder layer (no input norm) predicts f_{t+1}; the
target's frozen LM head turns it into tokens.

EAGLE-3 (Li et al. 2025): f_t = fc(concat(low, mid, high target layers)); the
layer attends over concat(norm(embed(x_{t+1})), norm(f_t)) (q/k/v take 2H);
its own LM head over a reduced draft vocabulary (``d2t``: target_id = i +
d2t[i]; ``t2d``: which target ids are in it). Trained with *training-time
test*: step j feeds the layer's own output of step j-1 instead of the target's
feature, attending to the real context and to its own earlier steps, exactly as
it drafts.

Positions: anchor i pairs token x_{i+1} with feature f_i and predicts x_{i+2};
TTT step j at anchor i predicts x_{i+j+2} at RoPE position i+j.

More decoder layers (``num_layers``, EAGLE-3 and P-EAGLE; vLLM's and speculators' ``num_hidden_layers``): the first
layer attends over (embeds ‖ feature) as above, each later one is a plain pre-norm Llama layer over the previous
layer's output, as vLLM's ``llama_eagle3.py`` stacks them; the output of the last is the step's output. Their
keys / values travel as one tensor, the layers' heads side by side on dim 1 ((B, L·nh, S, hd)), so every cache that
grows or trims along the sequence (dim 2) holds a stack as it holds one layer.

EAGLE-3.1 (arXiv 2605.09992; speculators PRs 610 / 670, vLLM PRs 42764 / 46488) adds norms as options of EAGLE-3,
named as speculators' ``Eagle3SpeculatorConfig`` and vLLM's ``llama_eagle3.py`` name them: ``fc_norm`` (an RMSNorm
on each target feature before fc: fc(concat(norm_a(f_a), norm_b(f_b), ...))), ``norm_before_fc`` (one RMSNorm on the
concatenation, gpt-oss style; exclusive with ``fc_norm``) and ``norm_output`` (the layer output after the final
``norm``, the LM head's input, is also the next step's feature, in training-time test and in drafting).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from draftsmith.core.draft import DrafterNetwork
from draftsmith.core.target import TargetOutput
from draftsmith.families.eagle.config import Eagle1Config, Eagle3Config
from draftsmith.families.registry import register
from draftsmith.layers.attention import sees_itself
from draftsmith.layers.decoder import Attention
from draftsmith.layers.tree_draft import FeatureState, TreeDrafter


class EagleLayer(nn.Module):
    """The drafter's decoder layer; EAGLE-3 norms token and feature inputs separately and attends over both."""

    def __init__(self, cfg: Eagle1Config | Eagle3Config) -> None:
        super().__init__()
        self.separate_inputs, self.norm_before_residual = cfg.separate_inputs, cfg.norm_before_residual
        h = cfg.shape.hidden_size
        if cfg.separate_inputs:
            self.input_layernorm = LlamaRMSNorm(h, cfg.shape.rms_norm_eps)
            self.hidden_norm = LlamaRMSNorm(h, cfg.shape.rms_norm_eps)
        self.self_attn = Attention(
            2 * h if cfg.separate_inputs else h, h, cfg.shape.num_attention_heads, cfg.shape.head_dim
        )
        self.post_attention_layernorm = LlamaRMSNorm(h, cfg.shape.rms_norm_eps)
        self.mlp = LlamaMLP(cfg.llama_config())

    def forward(self, embeds, hidden, cos, sin, past_k, past_v, mask):
        """EAGLE-1: ``hidden`` is fc's output and ``embeds`` is None. Returns (output (B,T,H), k, v)."""
        if self.separate_inputs:
            normed = self.hidden_norm(hidden)
            residual = normed if self.norm_before_residual else hidden
            x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        else:
            residual = x = hidden
        attn, k, v = self.self_attn(x, cos, sin, past_k, past_v, mask)
        h = residual + attn
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


class EagleStackLayer(nn.Module):
    """A decoder layer after the first (``num_layers`` > 1): pre-norm attention and MLP over the previous layer's
    output, as vLLM's ``llama_eagle3.py`` runs its layers after layer 0."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(cfg.shape.hidden_size, cfg.shape.rms_norm_eps)
        self.self_attn = Attention(
            cfg.shape.hidden_size, cfg.shape.hidden_size, cfg.shape.num_attention_heads, cfg.shape.head_dim
        )
        self.post_attention_layernorm = LlamaRMSNorm(cfg.shape.hidden_size, cfg.shape.rms_norm_eps)
        self.mlp = LlamaMLP(cfg.llama_config())

    def forward(self, x, cos, sin, past_k, past_v, mask):
        attn, k, v = self.self_attn(self.input_layernorm(x), cos, sin, past_k, past_v, mask)
        h = x + attn
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


def ttt_mask(t: int, step: int, valid: torch.Tensor | None, device, docs: torch.Tensor | None = None) -> torch.Tensor:
    """Attention mask of TTT step ``step`` over keys of steps 0..step: (B or 1, 1, T, (step+1)T) bool.

    Step-0 keys are causal (anchor <= query anchor) and valid; keys of steps >= 1
    are visible only on the query's own anchor (its own chain of drafts). A query of a row with no real token sees
    its own key of this step (``layers.attention.sees_itself``). ``docs`` (B, T): a packed batch's document of each
    anchor (``train.data.collate_packed``): step-0 keys of the query's own document only.
    """
    idx = torch.arange(t, device=device)
    causal = idx[None, :] <= idx[:, None]  # (T, T)
    diag = torch.eye(t, dtype=torch.bool, device=device)
    if docs is not None:
        causal = causal & (docs[:, :, None] == docs[:, None, :])  # (B, T, T)
        diag = diag.expand_as(causal)
        mask = torch.cat([causal] + [diag] * step, dim=-1)[:, None]  # (B, 1, T, (step+1)T)
    else:
        mask = torch.cat([causal] + [diag] * step, dim=1)[None, None]  # (1, 1, T, (step+1)T)
    if valid is not None:
        keys_valid = torch.cat([valid] * (step + 1), dim=1)[:, None, None, :].bool()  # (B, 1, 1, (step+1)T)
        mask = sees_itself(mask & keys_valid)
    return mask


@register("eagle1", config=Eagle1Config)
@register("eagle3", config=Eagle3Config)
class EagleModel(DrafterNetwork):
    """The trainable EAGLE network plus frozen copies of the target's embedding (and LM head for EAGLE-1)."""

    def __init__(self, cfg: Eagle1Config | Eagle3Config) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.shape.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h).requires_grad_(False)
        if cfg.separate_inputs:
            width = len(cfg.feature_layers) * cfg.target_hidden_size
            if cfg.fc_norm:  # EAGLE-3.1: one norm per feature layer
                self.fc_norm = nn.ModuleList(
                    LlamaRMSNorm(cfg.target_hidden_size, cfg.shape.rms_norm_eps) for _ in cfg.feature_layers
                )
            if cfg.norm_before_fc:
                self.input_norm = LlamaRMSNorm(width, cfg.shape.rms_norm_eps)
            self.fc = nn.Linear(width, h, bias=False)
        else:
            self.fc = nn.Linear(2 * h, h, bias=True)
        if cfg.own_head:
            self.norm = LlamaRMSNorm(h, cfg.shape.rms_norm_eps)
            self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
        else:
            self.lm_head = nn.Linear(h, cfg.vocab_size, bias=False).requires_grad_(False)
        self.layer = EagleLayer(cfg)
        if cfg.num_layers > 1:
            self.more_layers = nn.ModuleList(EagleStackLayer(cfg) for _ in range(cfg.num_layers - 1))
        self.rotary = LlamaRotaryEmbedding(cfg.llama_config())

    @property
    def method(self) -> str:
        return f"eagle{self.cfg.version}"

    def as_drafter(self, topk_accuracy: list[list[float]] | None = None) -> EagleDrafter:
        return EagleDrafter(self, topk_accuracy)

    @property
    def reads_layers(self) -> tuple[int, ...]:
        return tuple(self.cfg.feature_layers)

    @property
    def output_size(self) -> int:
        return self.cfg.shape.hidden_size

    def init_from_target(self, embed: torch.Tensor, lm_head: torch.Tensor | None) -> None:
        """Copy the target's embedding and, given its LM head, that head's rows of the draft vocabulary (None: the
        head keeps its random initialisation, as SpecForge's does)."""
        with torch.no_grad():
            self.embed_tokens.weight.copy_(embed)
            if lm_head is not None:
                self.lm_head.weight.copy_(lm_head[self.draft_ids] if self.cfg.own_head else lm_head)

    def set_draft_vocab(self, token_counts: torch.Tensor) -> None:
        """Keep the ``draft_vocab_size`` most frequent target tokens (ids ascending)."""
        keep = token_counts.topk(self.cfg.draft_vocab_size).indices.sort().values  # (Vd,)
        self.d2t.copy_(keep - torch.arange(len(keep), device=keep.device))
        self.t2d.zero_()
        self.t2d[keep] = True

    @property
    def draft_ids(self) -> torch.Tensor:
        """(Vd,) target id of each draft-vocabulary entry."""
        if not self.cfg.own_head:
            return torch.arange(self.cfg.vocab_size, device=self.lm_head.weight.device)
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def fuse(self, features: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Target features -> the drafter's feature input: (.., H). EAGLE-1 keeps f; EAGLE-3 applies fc."""
        dtype = self.fc.weight.dtype  # the target may run in another precision than the drafter
        if not self.cfg.separate_inputs:
            return features[0].to(dtype)
        if self.cfg.fc_norm:
            features = tuple(norm(f.to(dtype)) for norm, f in zip(self.fc_norm, features, strict=True))
        fused = torch.cat(features, dim=-1).to(dtype)  # (.., n * Ht)
        if self.cfg.norm_before_fc:
            fused = self.input_norm(fused)
        return self.fc(fused)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(.., H) ``step`` outputs -> (.., Vd) draft-vocabulary logits (EAGLE-3 norms them first, unless
        ``norm_output`` already did)."""
        if not self.cfg.own_head or self.cfg.norm_output:
            return self.lm_head(hidden)
        return self.lm_head(self.norm(hidden))

    def layers(self, embeds, hidden, cos, sin, past_k, past_v, mask):
        """The decoder layers on (embeds, hidden) -> (output (B, T, H), k, v); keys / values of all layers side by
        side on dim 1 ((B, L·nh, S, hd), the first layer's heads first)."""
        if self.cfg.num_layers == 1:
            return self.layer(embeds, hidden, cos, sin, past_k, past_v, mask)
        n = self.cfg.num_layers
        past_k = (None,) * n if past_k is None else past_k.chunk(n, dim=1)
        past_v = (None,) * n if past_v is None else past_v.chunk(n, dim=1)
        out, k, v = self.layer(embeds, hidden, cos, sin, past_k[0], past_v[0], mask)
        keys, values = [k], [v]
        for layer, pk, pv in zip(self.more_layers, past_k[1:], past_v[1:], strict=True):
            out, k, v = layer(out, cos, sin, pk, pv, mask)
            keys.append(k)
            values.append(v)
        return out, torch.cat(keys, dim=1), torch.cat(values, dim=1)

    def step(self, tokens, hidden, positions, past_k, past_v, mask):
        """One application of the layers: tokens (B,T) paired with hidden (B,T,H) at positions (B,T) -> (output (B,T,H),
        k, v); the output is the next step's feature (``norm``-ed first with ``norm_output``)."""
        embeds = self.embed_tokens(tokens)
        if not self.cfg.separate_inputs:
            x, embeds = self.fc(torch.cat([embeds, hidden], dim=-1)), None
        else:
            x = hidden
        cos, sin = self.rotary(x, positions)
        out, k, v = self.layers(embeds, x, cos, sin, past_k, past_v, mask)
        return (self.norm(out) if self.cfg.norm_output else out), k, v

    def forward(
        self,
        input_ids: torch.Tensor,
        features: tuple[torch.Tensor, ...],
        steps: int,
        valid: torch.Tensor | None,
        positions: torch.Tensor | None = None,
        docs: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """Training-time test unrolled for ``steps`` steps.

        Args:
            input_ids: (B, T) the sequence x.
            features: target features at each position, each (B, T, Ht).
            steps: TTT steps (1 = plain teacher forcing, as EAGLE-1 trains).
            valid: (B, T) 1 on real (non-pad) positions.
            positions: (B, T) each anchor's position (a packed batch's: from 0 in each document); None: 0..T-1.
            docs: (B, T) a packed batch's document of each anchor (nothing attends across documents); None: one
                document a row.

        Returns:
            per step j, the output hidden states (B, T, H); anchor i of step j predicts x_{i+j+2}.
        """
        b, t = input_ids.shape
        hidden = self.fuse(features)
        padded = F.pad(input_ids, (0, steps), value=0)
        if positions is None:
            positions = torch.arange(t, device=input_ids.device).expand(b, t)
        past_k = past_v = None
        outs = []
        for j in range(steps):
            mask = ttt_mask(t, j, valid, input_ids.device, docs)
            hidden, k, v = self.step(padded[:, j + 1 : j + 1 + t], hidden, positions + j, past_k, past_v, mask)
            past_k = k if past_k is None else torch.cat([past_k, k], dim=2)
            past_v = v if past_v is None else torch.cat([past_v, v], dim=2)
            outs.append(hidden)
        return outs


@dataclass
class EagleScratch:
    """One round's drafted nodes: their output hidden states and keys/values (discarded after the round)."""

    hidden: dict[int, torch.Tensor]
    """node (-1 = root) -> (1, 1, H) layer output, the input feature of its children."""
    slot: dict[int, int] = field(default_factory=dict)
    """node -> its index in keys/values."""
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None


class EagleDrafter(TreeDrafter):
    """The verifier's view of an ``EagleModel``: chain or tree drafting with its own KV cache."""

    needs_features = True
    hidden_in_scratch = True

    def __init__(self, model: EagleModel, topk_accuracy: list[list[float]] | None = None) -> None:
        self.model = model.eval()
        self.vocab_size = model.cfg.vocab_size
        self.feature_layers = model.cfg.feature_layers
        self.topk_accuracy = topk_accuracy

    @torch.no_grad()
    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> FeatureState:
        return FeatureState(tokens.tolist(), self.model.fuse(target_out.features))

    @torch.no_grad()
    def advance(self, state: FeatureState, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        state.commit(tokens, self.model.fuse(target_out.features))

    def _full_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(n, H) -> (n, V) logits over the target vocabulary (-inf outside the draft vocabulary)."""
        draft = self.model.logits(hidden).float()
        if not self.model.cfg.own_head:
            return draft
        full = torch.full((len(draft), self.vocab_size), float("-inf"), device=draft.device)
        return full.index_copy_(1, self.model.draft_ids, draft)

    def root(self, state: FeatureState) -> tuple[EagleScratch, torch.Tensor]:
        """Run the anchors committed since the last round with their real features (cached for good)."""
        model, device = self.model, state.features.device
        start, end = state.cached, len(state.tokens) - 1  # anchors start..end-1 are pending
        m = end - start
        tokens = torch.tensor([state.tokens[start + 1 : end + 1]], device=device)
        positions = torch.arange(start, end, device=device)[None]
        mask = torch.arange(start + m, device=device)[None, :] <= (start + torch.arange(m, device=device))[:, None]
        out, k_new, v_new = model.step(
            tokens, state.features[None, start:end], positions, state.past_k, state.past_v, mask[None, None]
        )
        state.past_k = k_new if state.past_k is None else torch.cat([state.past_k, k_new], dim=2)
        state.past_v = v_new if state.past_v is None else torch.cat([state.past_v, v_new], dim=2)
        hidden = out[:, -1:]  # (1, 1, H)
        return EagleScratch({-1: hidden}), self._full_logits(hidden[0])[0]

    def grow(self, state: FeatureState, scratch: EagleScratch, tokens, parents, new) -> torch.Tensor:
        """Run the new nodes in one step: each attends to the context, its drafted ancestors and itself."""
        model, device = self.model, state.features.device
        end, context, drafted = len(state.tokens) - 1, state.cached, len(scratch.slot)
        depth, rows = [], []
        for n in new:
            ancestors, p = [], parents[n]
            while p >= 0:
                ancestors.append(p)
                p = parents[p]
            depth.append(len(ancestors) + 1)
            row = torch.zeros(drafted, dtype=torch.bool)
            row[[scratch.slot[a] for a in ancestors]] = True
            rows.append(row)
        mask = torch.cat(
            [torch.ones(len(new), context, dtype=torch.bool), torch.stack(rows), torch.eye(len(new), dtype=torch.bool)],
            dim=1,
        ).to(device)
        past_k = state.past_k if scratch.keys is None else torch.cat([state.past_k, scratch.keys], dim=2)
        past_v = state.past_v if scratch.values is None else torch.cat([state.past_v, scratch.values], dim=2)
        hidden_in = torch.cat([scratch.hidden[parents[n]] for n in new], dim=1)  # (1, F, H)
        ids = torch.tensor([[tokens[n] for n in new]], device=device)
        pos = (end - 1 + torch.tensor(depth, device=device))[None]
        out, k, v = model.step(ids, hidden_in, pos, past_k, past_v, mask[None, None])
        scratch.keys = k if scratch.keys is None else torch.cat([scratch.keys, k], dim=2)
        scratch.values = v if scratch.values is None else torch.cat([scratch.values, v], dim=2)
        for i, n in enumerate(new):
            scratch.slot[n] = drafted + i
            scratch.hidden[n] = out[:, i : i + 1]
        return self._full_logits(out[0])
