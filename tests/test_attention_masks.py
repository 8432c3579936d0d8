"""Every attention call of every drafter's training step passes ``scaled_dot_product_attention`` a boolean mask or
``is_causal`` (or no mask), never a float additive mask, and no query row of a mask that carries gradients sees no
key (``layers/attention.py``); a boolean mask gives the values and gradients of the additive ``finfo.min`` mask it
stands for, and no NaN.

Each family's module is built on the toy target and its training step run under bf16 autocast, as a GPU's
``bf16-mixed`` fit runs it. ``scaled_dot_product_attention`` is wrapped by a function that records each call and
then makes it: the model is not mocked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from conftest import VOCAB, make_llama, make_tokenizer

from draftsmith.core.native import save_native
from draftsmith.families.acceptance_head.module import AcceptanceHeadModule
from draftsmith.families.clover.module import CloverModule
from draftsmith.families.dflash.dspark.module import DSparkModule
from draftsmith.families.dflash.module import DFlashModule
from draftsmith.families.draft_lm.module import DraftLMModule
from draftsmith.families.eagle.falcon.module import FalconModule
from draftsmith.families.eagle.falcon.network import block_mask
from draftsmith.families.eagle.module import EagleModule
from draftsmith.families.eagle.network import ttt_mask
from draftsmith.families.eagle.peagle.module import PEagleModule
from draftsmith.families.hydra.module import HydraModule
from draftsmith.families.kangaroo.module import KangarooModule
from draftsmith.families.medusa.module import MedusaModule
from draftsmith.families.pard.module import PardModule
from draftsmith.families.s2d.module import S2DModule
from draftsmith.families.student import StudentShape
from draftsmith.families.xvocab.module import XVocabModule
from draftsmith.layers.attention import sees_itself
from draftsmith.layers.lora import Lora

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
TINY = StudentShape(1, 64, 2, 128)
MASK_TOKEN = VOCAB - 3
LENGTHS, PROMPTS = (12, 8, 5), (3, 2, 4)
"""The batch's rows: right-padded to 12 tokens, each with its own prompt length (on-policy generation left-pads)."""
SDPA = torch.nn.functional.scaled_dot_product_attention
"""The function itself, for the tests' own reference calls (not recorded)."""


@dataclass
class Call:
    """One recorded ``scaled_dot_product_attention`` call: its inputs (detached copies) and whether it carried
    gradients."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: torch.Tensor | None
    is_causal: bool
    grad: bool


@pytest.fixture
def recorded(monkeypatch) -> list[Call]:
    """Every ``torch.nn.functional.scaled_dot_product_attention`` call from here on, recorded, then made."""
    calls = []

    def record(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        mask = None if attn_mask is None else attn_mask.detach().clone()
        copies = (t.detach().clone() for t in (query, key, value))
        calls.append(Call(*copies, mask, is_causal, torch.is_grad_enabled() and query.requires_grad))
        return SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", record)
    return calls


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, str]:
    """A saved 4-layer toy target, a 1-layer LM sharing its tokenizer, and an EAGLE-1 drafter of the target."""
    root = tmp_path_factory.mktemp("attention")
    for name, model in [("target", make_llama(seed=0, layers=4)), ("draft", make_llama(seed=3, layers=1))]:
        model.save_pretrained(root / name)
        make_tokenizer().save_pretrained(root / name)
    torch.manual_seed(0)
    eagle1 = EagleModule(str(root / "target"), 1)
    save_native(eagle1.drafter, eagle1.target, root / "eagle1")
    return {k: str(root / k) for k in ("target", "draft", "eagle1")}


FAMILIES: dict[str, Callable[[dict], torch.nn.Module]] = {
    "eagle1": lambda d: EagleModule(d["target"], 1),
    "eagle3": lambda d: EagleModule(d["target"], 3, [1, 2, 3], draft_vocab_size=48, ttt_steps=3),
    "eagle3_31": lambda d: EagleModule(
        d["target"], 3, [1, 2, 3], draft_vocab_size=48, ttt_steps=3, fc_norm=True, norm_output=True, num_layers=2
    ),
    "medusa1": lambda d: MedusaModule(d["target"], num_heads=3),
    "medusa2": lambda d: MedusaModule(d["target"], num_heads=3, lora=Lora(r=4, alpha=8), lm_weight=1.0),
    "hydra": lambda d: HydraModule(d["target"], num_heads=3),
    "hydrapp": lambda d: HydraModule(d["target"], num_heads=3, num_layers=2, prefix_attention=True, distill=True),
    "clover": lambda d: CloverModule(d["target"], num_heads=3, distill=True),
    "falcon": lambda d: FalconModule(d["target"], block=2),
    "kangaroo": lambda d: KangarooModule(d["target"], exit_layer=1, threshold=0.3),
    "pard": lambda d: PardModule(d["target"], shape=TINY, depth=3, mask_token_id=MASK_TOKEN),
    "peagle": lambda d: PEagleModule(d["target"], [1, 2, 3], draft_vocab_size=48, depth=3, mask_token_id=MASK_TOKEN),
    "dflash": lambda d: DFlashModule(d["target"], [1, 2, 3], depth=3, anchors=4, mask_token_id=MASK_TOKEN),
    "dspark": lambda d: DSparkModule(
        d["target"], [1, 2, 3], depth=3, anchors=4, markov_rank=8, mask_token_id=MASK_TOKEN
    ),
    "draft_lm": lambda d: DraftLMModule(d["target"], shape=TINY, on_policy=1.0),  # its own generation walked too
    "draft_lm_lora": lambda d: DraftLMModule(d["target"], init=d["draft"], lora=Lora(r=4, alpha=8)),
    "acceptance_head": lambda d: AcceptanceHeadModule(d["target"], drafter=d["eagle1"], steps=3),
    "s2d": lambda d: S2DModule([d["target"]], shape=StudentShape(2, 64, 2, 128)),
    "xvocab": lambda d: XVocabModule(d["target"], draft=d["draft"]),
}
"""Each family's training module on the toy target, in every variant whose attention differs."""


def batch(empty_row: bool = False) -> dict:
    """Right-padded rows of ``LENGTHS`` tokens (prompts of ``PROMPTS``); ``empty_row``: one more row of padding only
    (no real token), which no collate makes today and a packed or sharded batch might."""
    lengths, prompts = (*LENGTHS, 0) if empty_row else LENGTHS, (*PROMPTS, 0) if empty_row else PROMPTS
    ids = torch.randint(0, MASK_TOKEN, (len(lengths), max(LENGTHS)), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(ids.shape[1])
    valid = (positions[None] < torch.tensor(lengths)[:, None]).long()
    loss_mask = valid * (positions[None] >= torch.tensor(prompts)[:, None]).long()
    return {"input_ids": ids * valid, "attention_mask": valid, "loss_mask": loss_mask}


def xvocab_batch(rows: dict) -> dict:
    """The cross-vocabulary module's rows: labels on the generated tokens, no token alignment."""
    labels = rows["input_ids"].masked_fill(rows["loss_mask"] == 0, -100)
    return {**rows, "labels": labels, "aligned": [[] for _ in rows["input_ids"]]}


def train_step(name: str, module, rows: dict) -> torch.Tensor:
    """The module's training step on ``rows`` under bf16 autocast (what ``bf16-mixed`` runs), then its backward."""
    module.train()
    step_input = [rows] if name == "s2d" else xvocab_batch(rows) if name == "xvocab" else rows
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = module.training_step(step_input, 0)
    loss.backward()
    return loss


def blind_rows(call: Call) -> torch.Tensor:
    """(B, nh, Q) the queries of a boolean-masked call that see no key."""
    b, h, q, _ = call.query.shape
    return ~call.mask.expand(b, h, q, call.key.shape[2]).any(-1)


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The float additive mask a boolean one stands for: 0 where attended, ``finfo.min`` elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)


def boolean_and_additive(call: Call) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(output, dq, dk, dv) of the call made in float32 with its boolean mask, and with the additive one."""
    results = []
    weights = torch.randn(call.query.shape[:-1] + call.value.shape[-1:], generator=torch.Generator().manual_seed(0))
    for mask in (call.mask, additive(call.mask, torch.float32)):
        q, k, v = (t.float().requires_grad_() for t in (call.query, call.key, call.value))
        gqa = q.shape[1] != k.shape[1]
        out = SDPA(q, k, v, attn_mask=mask, enable_gqa=gqa)
        (out * weights).sum().backward()
        results.append([out.detach(), q.grad, k.grad, v.grad])
    return results[0], results[1]


def check_boolean_equals_additive(call: Call) -> None:
    """The boolean mask's values and gradients are finite and equal the additive mask's wherever a query sees a key
    (a query that sees none: the additive mask averages every value, the boolean one depends on the kernel)."""
    new, reference = boolean_and_additive(call)
    assert all(torch.isfinite(t).all() for t in new)
    blind = blind_rows(call)
    if blind.any():
        return  # the reference spreads a blind query's gradient over every key: only the test below compares them
    for a, b in zip(new, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def assert_no_float_mask_and_no_blind_row(calls: list[Call]) -> None:
    for i, call in enumerate(calls):
        assert call.mask is None or call.mask.dtype == torch.bool, f"call {i}: a {call.mask.dtype} attn_mask"
        if call.mask is not None and call.grad:
            assert not blind_rows(call).any(), f"call {i}: a query that sees no key, in a call carrying gradients"


def test_every_shipped_recipe_family_is_walked():
    """A new family's module must join ``FAMILIES`` (its attention is then checked)."""
    shipped = {
        yaml.safe_load(p.read_text())["model"]["class_path"].rsplit(".", 1)[1]
        for p in (ROOT / "configs").rglob("*.yaml")
        if p.parent.name != "strategy"
    }
    walked = {
        "EagleModule", "MedusaModule", "HydraModule", "CloverModule", "FalconModule", "KangarooModule", "PardModule",
        "PEagleModule", "DFlashModule", "DSparkModule", "DraftLMModule", "AcceptanceHeadModule",
        "S2DModule", "XVocabModule",
    }  # fmt: skip
    assert shipped <= walked, f"not walked here: {sorted(shipped - walked)}"


@pytest.mark.parametrize("name", FAMILIES)
def test_training_step_passes_sdpa_a_boolean_mask_or_is_causal(name, dirs, recorded):
    """The target's forward (HF's own mask from the padding mask), the drafter's attention and a draft LM's
    on-policy generation: no float mask, no query that sees no key where gradients flow, the boolean mask's values
    and gradients those of the additive one, and a finite loss and gradients."""
    torch.manual_seed(0)
    module = FAMILIES[name](dirs)
    recorded.clear()  # building a module may run its networks (an init's check): only the step counts
    loss = train_step(name, module, batch())
    assert recorded, "no attention call recorded"
    assert_no_float_mask_and_no_blind_row(recorded)
    for call in recorded:
        if call.mask is not None:
            check_boolean_equals_additive(call)
    assert torch.isfinite(loss)
    grads = [p.grad for p in module.trainable_parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize(
    "name", ["eagle3", "eagle3_31", "hydrapp", "clover", "falcon", "kangaroo", "pard", "peagle", "dflash", "dspark"]
)
def test_a_row_with_no_real_token_leaves_no_query_blind_in_the_drafters_attention(name, dirs, recorded):
    """With a row of padding only in the batch, every query of the drafter's own attention (the calls that carry
    gradients) still sees a key (its own), the loss and gradients are finite, and the real rows' values and
    gradients are those of the additive mask. (EAGLE's TTT, Falcon's, Hydra++'s and Clover's masks left that row's
    queries blind.)"""
    torch.manual_seed(0)
    module = FAMILIES[name](dirs)
    recorded.clear()
    loss = train_step(name, module, batch(empty_row=True))
    drafter = [call for call in recorded if call.grad]
    assert drafter
    assert_no_float_mask_and_no_blind_row(drafter)
    for call in drafter:
        check_boolean_equals_additive(call)
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in module.trainable_parameters() if p.grad is not None)


@pytest.mark.parametrize(
    "build",
    [
        lambda valid: ttt_mask(valid.shape[1], 2, valid, "cpu"),
        lambda valid: block_mask(valid.shape[1], 2, 1, 1, valid, "cpu"),
        lambda valid: sees_itself(torch.ones(6, 6, dtype=torch.bool).tril() & valid[:, None, None, :].bool()),
    ],
    ids=["eagle_ttt", "falcon_block", "causal_padding"],
)
def test_sees_itself_changes_only_the_blind_rows_and_their_values_become_finite(build):
    """A blind query's row is its own key only; every other row is the mask as it was; SDPA over it equals the
    additive mask on the rows that saw a key, and is finite everywhere."""
    valid = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
    mask = build(valid)  # (B, 1, Q, S)
    q, s = mask.shape[-2:]
    assert mask.any(-1).all()
    own = torch.cat([torch.zeros(q, s - q, dtype=torch.bool), torch.eye(q, dtype=torch.bool)], dim=1)
    assert torch.equal(mask[1, 0], own)  # the row of padding: each query its own key only
    g = torch.Generator().manual_seed(0)
    qkv = [torch.randn(2, 2, n, 8, generator=g) for n in (q, s, s)]
    call = Call(*qkv, mask, False, True)
    new, reference = boolean_and_additive(call)
    for a, b in zip(new, reference, strict=True):  # output, dq, dk, dv
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-6)  # the row with real tokens


@pytest.mark.parametrize("name", ["eagle1", "eagle3", "eagle3_31"])
def test_a_packed_training_step_passes_sdpa_boolean_masks_only(name, dirs, recorded):
    """A packed batch (``data.pack``, documents end to end in a row): the target's forward under its block-causal
    mask (``document_mask``) and the drafter's TTT masks are boolean, no query carrying gradients is blind, and the
    boolean masks give the additive ones' values and gradients."""
    from draftsmith.train.data import collate_packed

    rows = batch()
    docs = [
        {"input_ids": ids[:n].tolist(), "loss_mask": mask[:n].tolist()}
        for ids, mask, n in zip(rows["input_ids"], rows["loss_mask"], LENGTHS, strict=True)
    ]
    packed = collate_packed([[docs[0]], [docs[1], docs[2]]], 16)
    assert packed["doc_ids"][1].max() == 2
    torch.manual_seed(0)
    module = FAMILIES[name](dirs)
    recorded.clear()
    loss = train_step(name, module, packed)
    steps = [call for call in recorded if call.query.shape[0] == 2]  # the packed rows (not a one-row check's call)
    assert any(not call.grad for call in steps) and any(call.grad for call in steps)  # the target's and the drafter's
    assert all(call.mask is not None for call in steps)  # the target's too: its 4D block-causal mask
    assert_no_float_mask_and_no_blind_row(recorded)
    for call in steps:
        check_boolean_equals_additive(call)
    assert torch.isfinite(loss)
