"""Sequence packing (``data.pack``): documents laid end to end in rows train EAGLE exactly as one document a row.

The decisive check: a packed batch gives each document the loss, and the drafter the gradients, that the same
documents give right-padded one a row, with the target's features computed online (its forward under a block-causal
boolean mask) and read from a feature cache; each broken variant (the drafter's or the target's mask letting
documents see each other, labels crossing a boundary) fails it.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import VOCAB, make_llama, make_tokenizer

import draftsmith.families.eagle.network as eagle_network
import draftsmith.layers.module as layers_module
from draftsmith.data.generate import generate
from draftsmith.errors import DraftsmithError
from draftsmith.families.eagle.module import EagleModule, unroll
from draftsmith.families.medusa.module import MedusaModule
from draftsmith.layers.attention import document_mask
from draftsmith.layers.module import shift
from draftsmith.targets import resolve_target
from draftsmith.train.data import GeneratedDataModule, PackedBatchSampler, collate, collate_packed, pack_first_fit

pytestmark = pytest.mark.usefixtures("one_thread")

LENGTHS = (9, 5, 12, 7, 4, 10)
"""The documents' lengths; each generated (loss_mask 1) from its second token on, so a label that crossed into the
next document would count."""
LAYOUT = ([0, 1], [2], [3, 4, 5])
"""The packed rows: the documents of each (rows of 14, 12 and 21 tokens)."""
MAX_LENGTH = 24


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("packing")
    make_llama(seed=0, layers=4).save_pretrained(root / "target")
    make_tokenizer().save_pretrained(root / "target")
    return str(root / "target")


def documents() -> list[dict]:
    g = torch.Generator().manual_seed(0)
    return [
        {"input_ids": torch.randint(0, VOCAB - 2, (n,), generator=g).tolist(), "loss_mask": [0] + [1] * (n - 1)}
        for n in LENGTHS
    ]


def eagle(target: str, version: int = 3) -> EagleModule:
    torch.manual_seed(0)
    if version == 1:
        return EagleModule(target, 1)
    return EagleModule(target, 3, [1, 2, 3], draft_vocab_size=48, ttt_steps=3)


def with_cached_features(module: EagleModule, docs: list[dict]) -> list[dict]:
    """The documents with their target hidden states, each computed alone (as ``cache_features`` stores them)."""
    t = module.target
    layers = (*t.feature_layers, t.num_layers)
    out = []
    for d in docs:
        res = t(torch.tensor([d["input_ids"]]), feature_layers=layers, last_logits_only=True)
        out.append({**d, "hidden": {layer: f[0] for layer, f in zip(layers, res.features, strict=True)}})
    return out


def per_document(module: EagleModule, batch: dict, where: list[tuple[int, slice]]):
    """Each document's loss (the batch's loss with only that document's tokens counted) and the drafter's gradients
    of the loss over all of them."""
    values = []
    for row, span in where:
        only = torch.zeros_like(batch["loss_mask"])
        only[row, span] = batch["loss_mask"][row, span]
        with torch.no_grad():
            out = module.target_forward({**batch, "loss_mask": only}, module.loss_vocab())
            values.append(module.losses({**batch, "loss_mask": only}, out)["loss"])
    module.drafter.zero_grad()
    loss = module.losses(batch, module.target_forward(batch, module.loss_vocab()))["loss"]
    loss.backward()
    grads = {n: p.grad.clone() for n, p in module.drafter.named_parameters() if p.grad is not None}
    return torch.stack(values), loss.detach(), grads


def padded_and_packed(module: EagleModule, docs: list[dict]):
    """(per-document losses, loss, gradients) of the documents right-padded one a row, and packed by ``LAYOUT``."""
    padded = collate(docs, MAX_LENGTH)
    where = [(i, slice(0, len(d["input_ids"]))) for i, d in enumerate(docs)]
    a = per_document(module, padded, where)
    packed = collate_packed([[docs[i] for i in row] for row in LAYOUT], MAX_LENGTH)
    spans = {}
    for r, row in enumerate(LAYOUT):
        at = 0
        for i in row:
            spans[i] = (r, slice(at, at + LENGTHS[i]))
            at += LENGTHS[i]
    b = per_document(module, packed, [spans[i] for i in range(len(docs))])
    return a, b, packed


def assert_same_training(a, b) -> None:
    torch.testing.assert_close(b[0], a[0], rtol=1e-4, atol=1e-6)  # each document's loss
    torch.testing.assert_close(b[1], a[1], rtol=1e-4, atol=1e-6)
    assert a[2].keys() == b[2].keys() and a[2]
    for name in a[2]:
        torch.testing.assert_close(b[2][name], a[2][name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("features", ["online", "cached"])
@pytest.mark.parametrize("version", [3, 1])
def test_a_packed_batch_trains_each_document_as_a_padded_row(target, features, version):
    """Per-document losses, the batch loss and every gradient of packed rows equal those of the same documents
    right-padded one a row: online (the target's forward under ``document_mask``) and from cached features."""
    module = eagle(target, version)
    docs = documents() if features == "online" else with_cached_features(module, documents())
    a, b, packed = padded_and_packed(module, docs)
    assert packed["input_ids"].shape == (3, 21) and ("hidden" in packed) == (features == "cached")
    assert_same_training(a, b)


def no_document_mask(t, step, valid, device, docs=None):
    return ORIGINAL_TTT_MASK(t, step, valid, device, None)


ORIGINAL_TTT_MASK = eagle_network.ttt_mask


def causal_only(doc_ids):
    return document_mask(torch.ones_like(doc_ids))


@pytest.mark.parametrize("broken", ["drafter_mask", "target_mask", "labels"])
def test_the_equality_fails_on_each_broken_packing(target, broken, monkeypatch):
    """What the equality above guards: each of these, alone, makes a packed batch train otherwise. (Positions that do
    not restart at each document are not among them: the toy target and the drafter use RoPE, whose attention sees
    relative positions only, so the equality holds with them; ``collate_packed``'s positions are checked below.)"""
    module = eagle(target)
    docs = documents()
    if broken == "drafter_mask":  # the TTT mask's step-0 keys span the row: documents see each other
        monkeypatch.setattr(eagle_network, "ttt_mask", no_document_mask)
    elif broken == "target_mask":  # the target's forward causal over the whole row
        monkeypatch.setattr(layers_module, "document_mask", causal_only)
    else:  # labels: EAGLE's loss mask without the document check
        docs = with_cached_features(module, docs)  # the features alone right: only the labels wrong

        def labels_crossing(network, batch, out, steps):
            for j, hidden, _ in unroll(network, batch, out, steps):
                yield j, hidden, shift(batch["loss_mask"], j + 2).bool()

        monkeypatch.setattr("draftsmith.families.eagle.module.unroll", labels_crossing)
    a, b, _ = padded_and_packed(module, docs)
    with pytest.raises(AssertionError):
        assert_same_training(a, b)


def test_no_label_crosses_a_document_boundary(target):
    """Every anchor EAGLE's loss counts at step j predicts a token of its own document (x_{i+j+2}), and every
    generated token of a document that has one to predict it is counted (the mask is the padded rows' own)."""
    module = eagle(target)
    packed = collate_packed([[documents()[i] for i in row] for row in LAYOUT], MAX_LENGTH)
    with torch.no_grad():
        out = module.target_forward(packed, module.loss_vocab())
        steps = list(unroll(module.drafter, packed, out, 3))
    docs, t = packed["doc_ids"], packed["input_ids"].shape[1]
    for j, _, mask in steps:
        rows, anchors = mask.nonzero(as_tuple=True)
        assert (anchors + j + 2 < t).all()
        assert torch.equal(docs[rows, anchors + j + 2], docs[rows, anchors])
        assert (docs[rows, anchors] > 0).all()
        # per document of n tokens, generated from token 1: anchors 0 .. n - j - 3 count
        assert int(mask.sum()) == sum(max(0, n - j - 2) for n in LENGTHS)


def test_collate_packed_restarts_positions_and_numbers_documents():
    docs = documents()
    packed = collate_packed([[docs[0], docs[1]], [docs[2]]], MAX_LENGTH)
    assert packed["doc_ids"][0].tolist() == [1] * 9 + [2] * 5
    assert packed["doc_ids"][1].tolist() == [1] * 12 + [0] * 2
    assert packed["position_ids"][0].tolist() == list(range(9)) + list(range(5))
    assert packed["position_ids"][1, :12].tolist() == list(range(12))
    assert packed["input_ids"][0].tolist() == docs[0]["input_ids"] + docs[1]["input_ids"]
    assert packed["attention_mask"].sum() == 26


def test_first_fit_decreasing_and_the_packed_sampler_cover_every_document_once_within_the_budget():
    lengths = [(37 * i) % 61 + 3 for i in range(203)]
    rows = pack_first_fit(lengths, 64)
    assert sorted(i for r in rows for i in r) == list(range(203))
    assert all(sum(lengths[i] for i in r) <= 64 for r in rows)
    assert len(rows) <= -(-sum(lengths) // 64) * 1.1  # FFD: within 10% of the bound
    ranks = [PackedBatchSampler(lengths, 64, 4, seed=1, num_replicas=2, rank=r) for r in (0, 1)]
    seen = [[i for batch in s for row in batch for i in row] for s in ranks]
    assert len(ranks[0]) == len(ranks[1]) == len(list(ranks[0]))
    assert set(seen[0]) | set(seen[1]) == set(range(203))
    single = PackedBatchSampler(lengths, 64, 4, seed=1)
    order = list(single)
    assert all(len(b) == 4 for b in order[:-1]) and all(sum(lengths[i] for i in r) <= 64 for b in order for r in b)
    single.resume_at = (0, 3)
    assert list(single) == order[3:]
    single.set_epoch(1)
    assert list(single) != order


@pytest.fixture(scope="module")
def data(target, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packing-data")
    g = torch.Generator().manual_seed(0)
    for name, n in [("train", 24), ("val", 8)]:
        words = (
            " ".join(f"w{i}" for i in torch.randint(0, VOCAB - 2, (2 + k % 5,), generator=g).tolist()) for k in range(n)
        )
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": w}) + "\n" for w in words))
        common = {"max_new_tokens": 12, "device": "cpu", "shard_size": 64}
        generate(
            resolve_target(target),
            str(root / f"{name}.jsonl"),
            root / name,
            temperature=1.0 if name == "train" else 0.0,
            **common,
        )
    return {"train": root / "train", "val": root / "val"}


def test_a_packed_fit_trains_eagle_and_another_family_refuses_pack_in_one_line(target, data, tmp_path):
    dm = GeneratedDataModule(str(data["train"]), str(data["val"]), max_length=32, pack=True, tokens_per_batch=64)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[0] == 2 and batch["doc_ids"].max() > 1  # 2 rows of 32, several documents a row
    assert "doc_ids" not in next(iter(dm.val_dataloader()))  # validation: one document a row
    module = eagle(target)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=1,
                        default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(module, dm)
    assert trainer.global_step == 3
    torch.manual_seed(0)
    medusa = MedusaModule(target, num_heads=2)
    with pytest.raises(DraftsmithError, match="data.pack: MedusaModule does not train on packed batches"):
        L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False).fit(medusa, dm)


@pytest.mark.parametrize("loss", ["kl", "nla", "lk_hybrid"])
def test_the_dense_loss_a_gpu_uses_equals_the_selected_one(target, loss):
    """``eagle_losses(dense=True)`` (the default on a GPU: the head over every position, the uncounted ones weighted
    0, so no data-dependent shape waits for the device) gives the losses and gradients of the CPU's default, the
    head over the counted positions only, on a packed batch and a padded one."""
    from draftsmith.families.eagle.module import eagle_losses

    module = eagle(target)
    docs = documents()
    for batch in (collate(docs, MAX_LENGTH), collate_packed([[docs[i] for i in row] for row in LAYOUT], MAX_LENGTH)):
        with torch.no_grad():
            out = module.target_forward(batch, module.loss_vocab())
        runs = []
        for dense in (False, True):
            module.drafter.zero_grad()
            logs = eagle_losses(module.drafter, batch, out, 3, loss=loss, dense=dense)
            logs["loss"].backward()
            grads = {n: p.grad.clone() for n, p in module.drafter.named_parameters() if p.grad is not None}
            runs.append(({k: v.detach() for k, v in logs.items()}, grads))
        (selected, g_sel), (dense, g_dense) = runs
        assert selected.keys() == dense.keys() and g_sel.keys() == g_dense.keys() and g_sel
        for k in selected:
            torch.testing.assert_close(dense[k], selected[k], rtol=1e-5, atol=1e-6, msg=k)
        for n in g_sel:
            torch.testing.assert_close(g_dense[n], g_sel[n], rtol=1e-4, atol=1e-6, msg=n)
