"""Batch-invariant numerics: a target whose every row comes out bit for bit the same whether it is computed alone
(a plain decode step) or beside others (the verification forward of a draft).

In float32 the kernels' results hardly depend on the number of rows. In bfloat16 they do, by a rounding step: a
CPU's bf16 matmul kernels (oneDNN) may compute one row on another path than several, and split a row's sums
differently with the number of queries and of keys, in a Linear, in ``scaled_dot_product_attention``, even in HF's
eager attention. Each difference is one bf16 rounding, but it grows through the layers into logit changes that a
large vocabulary's near-ties turn into other greedy tokens: greedy speculative decoding then leaves plain greedy
decoding. Which kernels differ on which CPU, by how much, and what the fix costs: docs/results.md, "Batch-invariant
numerics".

``make_batch_invariant`` removes these sources: every one-row Linear (and GPT-2 ``Conv1D``) call runs as two rows
(the row twice; the first result is kept) unless this CPU's kernel was probed to round one row as it rounds it
among others (``_one_row_as_many``: bf16 without oneDNN bf16 kernels, e.g. on an AVX2-only CPU), a bf16 CPU
Linear on its weight pre-packed once for oneDNN where it has bf16 kernels (the bits of ``F.linear`` at 2 to 32
rows, about half its cost, row-invariant), and attention runs as ``invariant_attention``:
every query's attention computed at the same shapes whatever the call: ``QUERY_ROWS`` queries (zero-padded) over keys
padded to the next multiple of ``KEY_BLOCK`` after the query's own position, so a query of a verification block is
computed exactly as the one-token step at its position computes it; on a CPU through PyTorch's fused SDPA kernel at
those shapes (float32 scores and softmax), with a soft-cap or on another device in HF's eager order. Each keyword
a model passes its attention (Gemma-2's ``softcap``, ``sliding_window``, ...) is applied as HF's eager attention
applies it, or refused in one line (``check_attention_kwargs``). Plain decoding pays for it (a one-token
step computes two rows; attention runs in small padded groups whose masks each model's ``MaskCache`` builds once a
forward, not in every layer). Serving engines make the same trade: vLLM and SGLang are not batch-invariant in bf16
by default and offer a slower batch-invariant mode.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from types import MethodType

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.pytorch_utils import Conv1D

from draftsmith.errors import DraftsmithError

INVARIANT_ATTENTION = "draftsmith_invariant"
QUERY_ROWS = 8
"""Queries per attention matmul: a call's queries run in groups of this many, the last group zero-padded."""
KEY_BLOCK = 64
"""Keys per block: a query attends over the keys up to its own position, padded to a multiple of this many."""


def _packs_bf16(weight: torch.Tensor) -> bool:
    """Whether a Linear with ``weight`` runs on a pre-packed oneDNN bf16 weight: bf16 on a CPU whose oneDNN has
    bf16 kernels, and no gradient asked of it (the packed call has no backward)."""
    return (
        weight.dtype == torch.bfloat16
        and weight.device.type == "cpu"
        and not (torch.is_grad_enabled() and weight.requires_grad)
        and _onednn_bf16()
    )


@functools.cache
def _onednn_bf16() -> bool:
    """Whether this CPU's oneDNN has bf16 kernels (asked once, not in every Linear call)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _packed_weight(module: torch.nn.Linear) -> torch.Tensor:
    """``module.weight`` reordered once into oneDNN's blocked layout (what inductor's freezing does), packed again
    only when the weight changed: another tensor (even one the allocator put at the freed old one's address, with
    the same version count: the tensor itself is compared), new storage, or written in place (its version moved)."""
    weight = module.weight
    key = (weight.data_ptr(), weight._version, tuple(weight.shape))
    kept = _PACKED.get(module)
    if kept is None or kept[0]() is not weight or kept[1] != key:
        kept = (weakref.ref(weight), key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1))
        _PACKED[module] = kept
    return kept[2]


_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Each batch-invariant bf16 Linear's packed weight, beside the module rather than in it: ``state_dict``, copies
and pickles of a model never see an opaque oneDNN tensor, and it dies with its module."""


PROBED_ROWS = (*range(2, 18), 24, 32, 33, 48, 64, 65)
"""The row counts ``_one_row_as_many`` compares one row with: every chain block to K = 16 and the static trees'
blocks (``auto_k.TREE_SIZES`` + 1, 65 the widest), and the widths where kernels commonly change paths (32 / 33)."""


@functools.cache
def _one_row_as_many(in_features: int, out_features: int, bias: bool, dtype: torch.dtype) -> bool:
    """Whether this CPU's ``F.linear`` in ``dtype`` computes a row alone with the bits it gives that row among
    ``PROBED_ROWS`` rows, for a Linear of this shape: probed once per shape and process on random rows and weights
    (a kernel that takes another path for one row rounds some of a random row's outputs differently). True where
    bf16 has no oneDNN kernels and PyTorch computes each output as one float32-accumulated dot product at every
    width (the AMD EPYC with avx2 only, torch 2.13; SmolLM2's shapes take ~2 s, nearly all of it its 49k-token LM
    head's); then a one-row call needs no second row, which there doubles a bf16 Linear's cost
    (``benchmarks/results/step_profile_avx2.md``)."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=g).mul_(in_features**-0.5).to(dtype)
    b = torch.randn(out_features, generator=g).to(dtype) if bias else None
    x = torch.randn(max(PROBED_ROWS), in_features, generator=g).to(dtype)
    with torch.no_grad():
        alone = torch.cat([torch.nn.functional.linear(x[i : i + 1], weight, b) for i in range(len(x))])
        return all(torch.equal(torch.nn.functional.linear(x[:n], weight, b), alone[:n]) for n in PROBED_ROWS)


def _invariant_linear(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``self(x)`` with every row computed as it is among many: a single row runs as two (the row twice, the first
    result kept), since one-row kernels take another path, except where this CPU's one-row kernel was probed to
    round as the many-row one (``_one_row_as_many``). A bf16 CPU weight runs pre-packed (oneDNN's blocked
    layout, as inductor's freezing emits): at 2 to 32 rows it gives ``F.linear``'s bits at about half its cost
    (``benchmarks/results/linear_prepack_amx.md``, a retired study: ``benchmarks/RETIRED.md``; ``tests/test_bf16.py``
    checks both on the machine of the day), and it stays row-invariant past them up to the largest verification
    block (65 rows), where ``F.linear`` may change paths (the AMX Xeon: from 33 rows; the packed ``down_proj`` there
    from 150). At one row even the packed kernel may differ (``down_proj``, by up to 0.125)."""
    single = x.numel() == x.shape[-1]
    packed = _packs_bf16(self.weight) and x.dtype == torch.bfloat16
    one_row = single and not packed and x.device.type == "cpu"
    if one_row and _one_row_as_many(*self.weight.shape[::-1], self.bias is not None, x.dtype):
        return torch.nn.functional.linear(x, self.weight, self.bias)
    rows = torch.cat([x.reshape(1, -1)] * 2) if single else x  # (2, in) or x as it is
    if packed:
        out = torch.ops.mkldnn._linear_pointwise(rows, _packed_weight(self), self.bias, "none", [], "")
    else:
        out = torch.nn.functional.linear(rows, self.weight, self.bias)
    return out[:1].reshape(*x.shape[:-1], out.shape[-1]) if single else out


def _two_row_conv1d(self: Conv1D, x: torch.Tensor) -> torch.Tensor:
    """``self(x)`` for GPT-2's ``Conv1D`` (``x @ weight + bias``), computing a single row as two."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] == 1:
        return torch.addmm(self.bias, torch.cat([rows, rows]), self.weight)[:1].reshape(*x.shape[:-1], self.nf)
    return torch.addmm(self.bias, rows, self.weight).reshape(*x.shape[:-1], self.nf)


class MaskCache:
    """The query groups (``_group_masks``) ``invariant_attention`` built for each attention mask of a model that is
    still alive. Every layer of one forward passes the same mask tensor (one per layer type) over the same cache, so
    its groups are built once a forward, not in every layer; a new mask, even of the same shape (the next round's
    tree), gets its own. One per model (``make_batch_invariant``); nothing is shared between models."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[weakref.ref, tuple, list]] = {}  # id(mask) -> (mask, shapes, groups)

    def groups(self, attention_mask: torch.Tensor, shapes: tuple, build) -> list:
        """The groups of ``attention_mask`` at ``shapes``: kept ones, or ``build()`` kept (masks dead by now
        dropped)."""
        kept = self._kept.get(id(attention_mask))
        if kept is not None and kept[0]() is attention_mask and kept[1] == shapes:
            return kept[2]
        groups = build()
        self._kept = {i: k for i, k in self._kept.items() if k[0]() is not None}
        self._kept[id(attention_mask)] = (weakref.ref(attention_mask), shapes, groups)
        return groups

    def clear(self) -> None:
        self._kept.clear()

    def __getstate__(self) -> dict:  # a pickled or copied model keeps none (weak references do not pickle)
        return {}

    def __setstate__(self, state: dict) -> None:
        self._kept = {}


MASK_CACHE = "_draftsmith_masks"
"""The attribute under which each module of a batch-invariant model holds the model's ``MaskCache``: HF passes
``invariant_attention`` the calling attention module, and which of a model's modules that is, is the
architecture's business."""


def forget_masks(model: torch.nn.Module) -> None:
    """Drop the masks kept for ``model`` (or any of its modules): the next ``invariant_attention`` call builds its
    own (what the retired ``benchmarks/invariant_masks.py`` did before every call to measure building them in every
    layer: ``benchmarks/RETIRED.md``)."""
    cache = getattr(model, MASK_CACHE, None)
    if cache is not None:
        cache.clear()


def make_batch_invariant(model: torch.nn.Module) -> None:
    """Make ``model``'s rows independent of how many rows share a forward (in place): ``invariant_attention``
    (with a ``MaskCache`` of its own) and two-row Linear (and ``Conv1D``) calls. Weights are untouched; only how its
    Linears and attention compute changes."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(INVARIANT_ATTENTION)
    masks = MaskCache()
    for module in model.modules():
        setattr(module, MASK_CACHE, masks)
        if isinstance(module, torch.nn.Linear):
            module.forward = MethodType(_invariant_linear, module)
        elif isinstance(module, Conv1D):
            module.forward = MethodType(_two_row_conv1d, module)


def is_batch_invariant(model: torch.nn.Module) -> bool:
    """Whether ``make_batch_invariant`` was applied to ``model``."""
    return any(
        isinstance(m, torch.nn.Linear) and getattr(m.forward, "__func__", None) is _invariant_linear
        for m in model.modules()
    )


HONOURED = ("scaling", "dropout", "softcap", "sliding_window")
"""The keywords ``invariant_attention`` applies as HF's eager attention does (``sliding_window``: through the mask,
which carries each layer's window, as in eager attention; on a call without a mask, by ``_group_masks``)."""
IGNORED = (
    "position_ids",
    "cache_position",
    "use_cache",
    "output_hidden_states",
    "output_router_logits",
    "is_causal",
    "cu_seq_lens_q",
    "cu_seq_lens_k",
    "max_length_q",
    "max_length_k",
    "num_items_in_batch",
)
"""Keywords a model's forward passes on to its attention that HF's eager attention ignores too (the mask carries
what they say, or they are for other kernels or the loss): they change nothing in what attention computes."""


def check_attention_kwargs(module: torch.nn.Module, dropout: float, kwargs: dict) -> None:
    """Refuse in one line, naming the keyword and the model, what ``invariant_attention`` would otherwise silently
    compute differently from the architecture's eager attention: a keyword it does not implement (gpt-oss's
    attention sinks ``s_aux``, anything a later transformers adds), dropout in training, returned attention
    weights, or GPT-2's ``reorder_and_upcast_attn``, which HF applies only under ``eager``."""
    arch = type(module).__name__
    why = None
    unknown = [k for k in kwargs if k not in HONOURED and k not in IGNORED and k != "output_attentions"]
    if unknown:
        why = f"passes its attention the keyword {unknown[0]!r}, which batch-invariant attention does not implement"
    elif dropout and module.training:
        why = f"runs attention dropout {dropout} in training, which draftsmith's batch-invariant attention omits"
    elif kwargs.get("output_attentions"):
        why = "asks for attention weights (output_attentions), which draftsmith's batch-invariant attention omits"
    elif getattr(module, "reorder_and_upcast_attn", False):
        why = "has reorder_and_upcast_attn (float32 attention scores), which batch-invariant attention omits"
    if why:
        raise DraftsmithError(
            f"target: {arch} {why}; use the target with --batch_invariant false (its own kernels) or in float32"
        )


def invariant_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, softcap=None, **kwargs):
    """The architecture's attention (``q @ k^T * scaling``, Gemma-2's ``tanh(w / softcap) * softcap``, the additive
    mask, a float32 softmax, ``@ v``) with each query's computation of one shape whatever the call: the ``n``
    queries are the last ``n`` positions of the ``kv`` keys (a decode step, a verification chain or tree), and the
    query at position ``p`` runs in a group of ``QUERY_ROWS`` queries (zero-padded) over the first
    ``ceil((p + 1) / KEY_BLOCK) * KEY_BLOCK`` keys (keys past ``kv`` zero and masked). The keys it drops lie after
    ``p``, which a causal or tree mask hides from it anyway; the keys it masks weigh exactly 0 after the softmax,
    whatever they hold. Each group runs through ``_attend``. Keywords it cannot honour are refused
    (``check_attention_kwargs``)."""
    check_attention_kwargs(module, dropout, kwargs)
    groups = getattr(module, "num_key_value_groups", 1)  # GPT-2, GPT-NeoX: one key head per query head
    b, h, n, _ = query.shape
    kv = key.shape[2]
    window = kwargs.get("sliding_window")
    out = query.new_empty(b, h, n, value.shape[-1])
    cache = getattr(module, MASK_CACHE, None)
    for group in _group_masks(attention_mask, b, n, kv, query.dtype, query.device, window, cache):
        if isinstance(group, TreeGroups):
            out[:, :, group.queries] = _tree_attention(query, key, value, group, scaling, softcap, groups)
            continue
        start, end, width, mask = group
        m = end - start
        q = torch.nn.functional.pad(query[:, :, start:end], (0, 0, 0, QUERY_ROWS - m))
        k = torch.nn.functional.pad(key[:, :, :width], (0, 0, 0, max(0, width - kv)))
        v = torch.nn.functional.pad(value[:, :, :width], (0, 0, 0, max(0, width - kv)))
        out[:, :, start:end] = _attend(q, k, v, mask, scaling, softcap, groups)[:, :, :m]
    return out.transpose(1, 2).contiguous(), None


def _attend(query, key, value, mask, scaling: float, softcap: float | None, groups: int) -> torch.Tensor:
    """One call's attention at its fixed shapes: ``query`` (B, h, QUERY_ROWS, d) over ``key`` and ``value``
    (B, h / groups, width, d) under the additive ``mask`` (B, 1, QUERY_ROWS, width). On a CPU without a soft-cap:
    PyTorch's fused ``scaled_dot_product_attention`` (its CPU flash kernel: float32 scores and softmax, one pass, no
    key heads repeated), whose blocking depends only on these shapes, so a row gets the same bits in every call.
    Else HF's eager order (``repeat_kv``, bf16 scores, the cap, then the mask, a float32 softmax cast back, ``@ v``)."""
    if softcap is None and query.device.type == "cpu":
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scaling, enable_gqa=groups > 1
        )
    from transformers.models.llama.modeling_llama import repeat_kv

    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    w = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, h, QUERY_ROWS, width)
    if softcap is not None:  # in eager's order: capped scores, then the mask
        w = torch.tanh(w / softcap) * softcap
    w = torch.nn.functional.softmax(w + mask, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(w, value)


@dataclass(frozen=True)
class TreeGroups:
    """Query groups of a tree block whose keys all have one width, each laid out as a chain (``_tree_groups``):
    ``G`` groups of ``QUERY_ROWS`` query rows (block indices; padded rows repeat a real one and are dropped) over
    ``width`` gathered keys each, with the additive mask of each group's rows."""

    rows: torch.Tensor  # (G, QUERY_ROWS) block indices of the queries, padded
    real: torch.Tensor  # (G, QUERY_ROWS) bool: a real query row
    keys: torch.Tensor  # (G, width) key indices, padded
    mask: torch.Tensor  # (G, 1, QUERY_ROWS, width) additive, each group's as ``_attend`` takes it
    queries: torch.Tensor  # (real rows,) the block indices the real rows compute, in the order of rows[real]


def _tree_attention(query, key, value, group: TreeGroups, scaling: float, softcap, groups: int) -> torch.Tensor:
    """The real rows of ``group``, each computed over its chain layout of keys with the shapes of a chain's
    group (``_attend``'s, the tree's ``G`` groups stacked along the batch): (b, h, real rows, head dim)."""
    b, h, d = query.shape[0], query.shape[1], query.shape[-1]
    g = group.rows.shape[0]
    q = torch.where(group.real[:, :, None], query[:, :, group.rows], 0)  # (b, h, G, QUERY_ROWS, d): padded rows 0
    k, v = key[:, :, group.keys], value[:, :, group.keys]  # (b, h / groups, G, width, d)

    def stacked(x: torch.Tensor) -> torch.Tensor:  # (b, heads, G, s, d) -> (b * G, heads, s, d)
        return x.transpose(1, 2).reshape(b * g, x.shape[1], x.shape[3], d)

    mask = group.mask.repeat(b, 1, 1, 1) if b > 1 else group.mask  # built once a forward, in _attend's shape
    out = _attend(stacked(q), stacked(k), stacked(v), mask, scaling, softcap, groups)
    return out.reshape(b, g, h, QUERY_ROWS, d).transpose(1, 2)[:, :, group.real]  # (b, h, real rows, d)


def _tree_groups(seen: torch.Tensor, n: int, kv: int, dtype, device) -> list[TreeGroups] | None:
    """A tree block's queries grouped so each computes over its keys laid out as the one-token step at its
    position lays them out; None when the block is a chain (each query sees every earlier block query).

    ``seen`` (n, kv) bool: which keys each of the block's ``n`` queries (the last ``n`` of ``kv`` keys) sees. A
    tree query sees the cache and its ancestors in the block (listed before it, as a tree's nodes are), so its
    one-token step would see the cache and the same ancestors at consecutive positions after it: that layout is
    gathered (``[0, kv - n)`` and the ancestors' block keys in order), and padded as ``_group_masks`` pads a
    step's keys (to the next multiple of ``KEY_BLOCK``, masked). Queries along one path share the layout of its
    deepest member, so a query joins its parent's group while that group ends at its parent, holds fewer than
    ``QUERY_ROWS`` and has the same width (a chain's grouping, per path); its other children start groups of their
    own. Groups of one width are stacked, so each matmul has a chain group's shape, batched."""
    block = seen[:, kv - n :].cpu()

    def contiguous(j: int) -> bool:  # a chain's (or a sliding window's) keys: one run of block keys ending at j
        keys = block[j, : j + 1].nonzero().flatten().tolist()
        return not keys or (keys[-1] == j and keys[-1] - keys[0] == len(keys) - 1)

    if all(contiguous(j) for j in range(n)):
        return None
    ancestors = [[i for i in range(j + 1) if block[j, i]] for j in range(n)]
    members: list[list[int]] = []
    widths: list[int] = []
    open_at: dict[int, int] = {}  # block index -> the group that ends there
    for j in range(n):
        width = -(-(kv - n + len(ancestors[j])) // KEY_BLOCK) * KEY_BLOCK
        parent = ancestors[j][-2] if len(ancestors[j]) > 1 else None
        g = open_at.pop(parent, None) if parent is not None else None
        if g is not None and (len(members[g]) == QUERY_ROWS or widths[g] != width):
            g = None
        if g is None:
            members.append([])
            widths.append(width)
            g = len(members) - 1
        members[g].append(j)
        open_at[j] = g
    lowest = torch.finfo(dtype).min
    out = []
    for width in sorted(set(widths)):
        rows, real, keys, masks = [], [], [], []
        for g in (g for g, w in enumerate(widths) if w == width):
            layout = list(range(kv - n)) + [kv - n + i for i in ancestors[members[g][-1]]]
            index = torch.tensor(layout + [0] * (width - len(layout)))
            mask = torch.full((QUERY_ROWS, width), 0.0)
            for r, j in enumerate(members[g]):
                mask[r] = torch.where(seen[j].cpu()[index], 0.0, lowest)
                mask[r, len(layout) :] = lowest
            rows.append(members[g] + [members[g][0]] * (QUERY_ROWS - len(members[g])))
            real.append([r < len(members[g]) for r in range(QUERY_ROWS)])
            keys.append(index)
            masks.append(mask)
        real_t = torch.tensor(real, device=device)
        rows_t = torch.tensor(rows, device=device)
        out.append(
            TreeGroups(
                rows=rows_t,
                real=real_t,
                keys=torch.stack(keys).to(device),
                mask=torch.stack(masks).to(dtype=dtype, device=device)[:, None],
                queries=rows_t[real_t],
            )
        )
    return out


def _group_masks(
    attention_mask, b: int, n: int, kv: int, dtype, device, window: int | None = None, cache: MaskCache | None = None
) -> list[tuple[int, int, int, torch.Tensor]]:
    """``invariant_attention``'s query groups, ``(start, end, key width, additive mask)``: runs of queries with the
    same key block, ``QUERY_ROWS`` at a time; each mask ``(b, 1, QUERY_ROWS, width)``, padded keys and queries
    masked and seeing every key respectively. Without ``attention_mask``: causal, within ``window`` keys if given
    (a given mask already carries the layer's window, as in eager attention). A given mask's groups are kept in
    ``cache`` (a model's ``MaskCache``), if any."""
    if attention_mask is not None and cache is not None:
        build = functools.partial(_group_masks, attention_mask, b, n, kv, dtype, device, window)
        return cache.groups(attention_mask, (b, n, kv, dtype, device), build)
    lowest = torch.finfo(dtype).min
    if attention_mask is not None and b == 1 and n > 1:  # a tree's block: its queries laid out per path
        seen = attention_mask[0, 0, :, :kv]
        trees = _tree_groups(seen if seen.dtype == torch.bool else seen == 0, n, kv, dtype, device)
        if trees is not None:
            return trees
    blocks = [-(-(kv - n + j + 1) // KEY_BLOCK) * KEY_BLOCK for j in range(n)]
    groups, start = [], 0
    while start < n:
        end = start + 1
        while end < n and end - start < QUERY_ROWS and blocks[end] == blocks[start]:
            end += 1
        width, m = blocks[start], end - start
        if attention_mask is None:  # causal: the query at position p sees the keys up to p (within the window)
            positions = torch.arange(kv - n + start, kv - n + end, device=device)[:, None]
            keys = torch.arange(min(width, kv), device=device)
            seen = (keys <= positions) & (keys > positions - (kv + 1 if window is None else window))
        else:
            seen = attention_mask[:, :, start:end, : min(width, kv)]
        mask = torch.where(seen if seen.dtype == torch.bool else seen == 0, 0.0, lowest).to(dtype)
        mask = mask.expand(b, 1, m, mask.shape[-1])
        mask = torch.nn.functional.pad(mask, (0, max(0, width - kv)), value=lowest)
        mask = torch.nn.functional.pad(mask, (0, 0, 0, QUERY_ROWS - m))  # the padded queries see every key
        groups.append((start, end, width, mask))
        start = end
    return groups


AttentionInterface.register(INVARIANT_ATTENTION, invariant_attention)
AttentionMaskInterface.register(INVARIANT_ATTENTION, eager_mask)
