"""draftsmith's exports loaded by the peers' own code: speculators (``Eagle3DraftModel.from_pretrained`` of the
speculators export) and SpecForge (``LlamaForCausalLMEagle3.from_pretrained`` of the SGLang export), each in its
own venv (``engines/peer_venv.sh``).

An EAGLE-3 drafter with a reduced, scattered draft vocabulary and perturbed weights (norms away from 1, so a
dropped or doubled norm shows) runs its training-time test for 3 steps on a tiny target's real features, in
draftsmith and in the peer's class: the logits must agree (float32, max abs difference <= 1e-4 of the logits'
scale) and the target tokens they pick through each side's ``d2t`` must be equal. A broken export (a transposed
fc block, d2t off by one, a norm flag flipped) must fail the same comparison. P-EAGLE (both peers' ``PEagleDraftModel``:
speculators' on its export, SpecForge's on the vLLM export) and DFlash (both peers' ``DFlashDraftModel``) likewise,
at every depth or mask; and checkpoints each peer's own code writes import and decode exactly. Where a peer cannot
be installed its tests skip, saying why.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import eagle3_case
from safetensors.torch import load_file, save_file

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.export.imports import import_drafter
from draftsmith.export.registry import write_export
from draftsmith.families.registry import load_network, load_trained
from engines import peer_check

pytestmark = [pytest.mark.slow, pytest.mark.engine]
STEPS, T, LAYERS = 3, 24, [1, 2, 3]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def drafter(tmp_path_factory) -> dict:
    case = eagle3_case(tmp_path_factory.mktemp("peers"), draft_vocab=48, length=T, layers=tuple(LAYERS))
    return case | {"ours": peer_check.draftsmith_logits(case["network"], case["x"], case["features"], STEPS)}


def peer_python(peer: str) -> Path:
    python, why = peer_check.ensure_venv(peer, ROOT / f".venv-{peer}")
    if python is None:
        print(f"SKIP {peer}: {why}")
        pytest.skip(why)
    return python


def run_peer(case: dict, peer: str, export: Path, work: str, steps: int = STEPS) -> peer_check.StepLogits:
    """The peer's class over one export (SpecForge's DFlash given the target's embedding and LM head)."""
    features, root = torch.cat(case["features"], dim=-1), case["root"]
    target = root / "target" if peer == "specforge" else None
    return peer_check.peer_logits(peer_python(peer), peer, export, case["x"], features, steps, root / work, target)


def peer_runs(case: dict, peer: str, family: str, export: Path, breakages: list, steps: int) -> dict:
    """The peer's class over the good export (``ok``) and a broken copy per breakage, all in one process of its venv
    (its imports cost more than the forwards), computed once per family and peer: per name, the logits or the
    peer's refusal (a string)."""
    runs = case.setdefault("runs", {})
    if (family, peer) not in runs:
        root = case["root"]
        folder = root / "broken" / f"{family}-{peer}"
        exports = {"ok": export} | {b.__name__: broken_copy(export, b, folder / b.__name__) for b in breakages}
        features = torch.cat(case["features"], dim=-1)
        target = root / "target" if peer == "specforge" else None
        runs[family, peer] = peer_check.peer_logits_many(
            peer_python(peer), peer, exports, case["x"], features, steps, root / f"{family}-{peer}", target
        )
    return runs[family, peer]


def good(runs: dict, peer: str) -> peer_check.StepLogits:
    if isinstance(runs["ok"], str):
        pytest.fail(f"{peer} refused draftsmith's export: {runs['ok']}")
    return runs["ok"]


HARNESS_ERRORS = {
    "ImportError",
    "ModuleNotFoundError",
    "FileNotFoundError",
    "PermissionError",
    "NameError",
    "SyntaxError",
}
"""Exceptions that say the harness did not get the peer's class to the export (a module or file missing, a typo in
``peer_forward.py``): never the peer refusing what was broken."""

NAMES = {
    "transposed_fc_block": ("fc",),
    "d2t_off_by_one": ("d2t",),
    "norm_flag_flipped": ("norm_before_residual", "norm_output"),
    "mask_token_off_by_one": ("mask_token",),
    "mask_hidden_dropped": ("mask_hidden",),
    "dflash_mask_token_off_by_one": ("mask_token",),
    "hidden_norm_dropped": ("hidden_norm",),
}
"""Per breakage, the weight or config field a peer's refusal must name to count as refusing that breakage."""


def exception(traceback_tail: str) -> tuple[str, str]:
    """(exception class, message) of the last exception in a traceback's tail ("" when it shows none)."""
    found = list(re.finditer(r"^([A-Za-z_][\w.]*?(?:Error|Exception|Exit|Interrupt))(?::(.*))?$", traceback_tail, re.M))
    if not found:
        return "", ""
    last = found[-1]
    return last[1].rsplit(".", 1)[-1], traceback_tail[last.start(2) if last[2] is not None else last.end() :].strip()


def fails(case: dict, runs: dict, breakage, label: str) -> None:
    """A broken export must give other outputs than draftsmith's drafter, or be refused by the peer for what was
    broken: in the process that loaded the good export (so the harness reaches the peer's class), with an exception
    that is not the harness's (``HARNESS_ERRORS``) and a message naming the broken weight or field (``NAMES``)."""
    good(runs, label)
    theirs = runs[breakage.__name__]
    if isinstance(theirs, str):
        kind, message = exception(theirs)
        print(f"{label} {breakage.__name__}: refused: {kind}: {message}")
        assert kind and kind not in HARNESS_ERRORS, (
            f"{label} {breakage.__name__}: a harness error, no refusal: {theirs}"
        )
        assert any(name in message for name in NAMES[breakage.__name__]), (
            f"{label} {breakage.__name__}: refused for something else than the breakage: {kind}: {message}"
        )
        return
    ok, why = agree(case["ours"], theirs)
    print(f"{label} {breakage.__name__}: {why}")
    assert not ok, f"{breakage.__name__} went unnoticed by the {label} comparison"


def agree(ours: peer_check.StepLogits, theirs: peer_check.StepLogits) -> tuple[bool, str]:
    for j, (a, b) in enumerate(zip(ours.logits, theirs.logits, strict=True)):
        if a.shape != b.shape:
            return False, f"step {j}: shapes {tuple(a.shape)} vs {tuple(b.shape)}"
        gap = float((a - b).abs().max() / a.abs().max())
        if not gap <= 1e-4:  # NaN fails too
            return False, f"step {j}: logits differ by {gap:.2e} of their scale"
    for j, (a, b) in enumerate(zip(ours.target_tokens(), theirs.target_tokens(), strict=True)):
        if not torch.equal(a, b):
            return False, f"step {j}: target tokens differ at {int((a != b).sum())} of {a.numel()} positions"
    return True, "equal"


def test_only_a_refusal_naming_the_breakage_counts_as_the_peer_refusing_it():
    """``fails`` on made-up runs (no venv needed): a missing module, a refusal of the good export too or one naming
    something else is no refusal of the breakage; a peer naming the dropped weight is; equal outputs are unnoticed."""
    ours = peer_check.StepLogits([torch.arange(6.0).view(1, 2, 3)], torch.zeros(3, dtype=torch.long))
    case, at = (
        {"ours": ours},
        'Traceback (most recent call last):\n  File "peer_forward.py", line 62, in peagle_logits\n',
    )
    missing = at + "ModuleNotFoundError: No module named 'speculators.models.peagle'"
    named = at + 'RuntimeError: Error(s) in loading state_dict for PEagleDraftModel:\n\tMissing key(s): "mask_hidden".'
    other = at + "RuntimeError: shape mismatch: value tensor of shape [2] cannot be broadcast to [3]"
    fails(case, {"ok": ours, "mask_hidden_dropped": named}, mask_hidden_dropped, "peer")
    for refusal in (missing, other):
        with pytest.raises(AssertionError, match="a harness error|something else"):
            fails(case, {"ok": ours, "mask_hidden_dropped": refusal}, mask_hidden_dropped, "peer")
    with pytest.raises(pytest.fail.Exception, match="refused draftsmith's export"):
        fails(case, {"ok": missing, "mask_hidden_dropped": named}, mask_hidden_dropped, "peer")
    with pytest.raises(AssertionError, match="went unnoticed"):
        fails(case, {"ok": ours, "d2t_off_by_one": ours}, d2t_off_by_one, "peer")


def exported(case: dict, native: str, peer: str) -> Path:
    """The native drafter ``native`` exported (once) in the format ``peer``'s code loads."""
    out = case["root"] / "export" / f"{native}-{peer}"
    if not (out / "config.json").is_file():
        write_export(case["root"] / native, peer_check.FORMATS[peer], out)
    return out


def eagle3_runs(drafter: dict, peer: str) -> dict:
    return peer_runs(drafter, peer, "eagle3", exported(drafter, "native", peer), EAGLE3_BREAKAGES, STEPS)


@pytest.mark.parametrize("peer", ["speculators", "specforge"])
def test_the_peers_own_class_gives_draftsmiths_logits_and_tokens(drafter, peer):
    theirs = good(eagle3_runs(drafter, peer), peer)
    ok, why = agree(drafter["ours"], theirs)
    print(f"{peer}: {why}")
    assert ok, f"{peer} loads draftsmith's {peer_check.FORMATS[peer]} export with other outputs: {why}"


def transposed_fc_block(state: dict, config: dict) -> None:
    """The first feature layer's fc block transposed (square, so it still loads)."""
    h = state["fc.weight"].shape[0]
    state["fc.weight"][:, :h] = state["fc.weight"][:, :h].t().clone()


def d2t_off_by_one(state: dict, config: dict) -> None:
    state["d2t"] = state["d2t"] + 1


def norm_flag_flipped(state: dict, config: dict) -> None:
    """The flag that says which feature the layer keeps as its residual (speculators) / where logits are normed."""
    if "norm_before_residual" in config and "speculators_model_type" in config:
        config["norm_before_residual"] = not config["norm_before_residual"]
    else:
        config["norm_output"] = False  # SpecForge's class then reads logits off the un-normed state


def broken_copy(good: Path, breakage, broken: Path) -> Path:
    """A copy of the export dir ``good`` with ``breakage(state, config)`` applied to its weights and config."""
    broken.mkdir(parents=True)
    for f in good.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    state = load_file(broken / "model.safetensors")
    config = json.loads((broken / "config.json").read_text())
    breakage(state, config)
    save_file(state, broken / "model.safetensors", metadata={"format": "pt"})
    (broken / "config.json").write_text(json.dumps(config))
    return broken


EAGLE3_BREAKAGES = [transposed_fc_block, d2t_off_by_one, norm_flag_flipped]


@pytest.mark.parametrize("peer", ["speculators", "specforge"])
@pytest.mark.parametrize("breakage", EAGLE3_BREAKAGES)
def test_a_broken_export_fails_the_comparison(drafter, peer, breakage):
    fails(drafter, eagle3_runs(drafter, peer), breakage, peer)


@pytest.mark.parametrize("peer", ["speculators", "specforge"])
def test_a_checkpoint_the_peer_wrote_imports_and_drafts_as_the_peer_computes(drafter, peer):
    """Randomly initialised and saved by the peer's own code (grouped-query attention, scattered draft vocabulary):
    imported, it gives the peer's logits and tokens, and decodes exactly (greedy = plain greedy) under the verifier."""
    python, root = peer_python(peer), drafter["root"]
    ckpt = peer_check.peer_checkpoint(python, peer, root / "target", root / "written" / peer)
    import_drafter(ckpt, str(root / "target"), root / "imported" / peer)
    network, info = load_network(root / "imported" / peer)
    assert info["imported_from"]["layout"] == peer_check.FORMATS[peer]
    ours = peer_check.draftsmith_logits(network.eval(), drafter["x"], drafter["features"], STEPS)
    ok, why = agree(ours, run_peer(drafter, peer, ckpt, f"{peer}-written"))
    print(f"{peer}-written checkpoint: {why}")
    assert ok, f"the {peer}-written checkpoint drafts otherwise once imported: {why}"
    target = Target.from_pretrained(root / "target")
    decoder = SpeculativeDecoder(target, load_trained(root / "imported" / peer, target), k=3, sampling=Sampling(0.0))
    for prompt in ([5, 9, 14, 2], [7, 7, 30, 41, 3, 60]):
        assert decoder.generate(prompt, 16).tokens == plain_decode(target, prompt, 16, Sampling(0.0), None).tokens


DEPTH = 4


@pytest.fixture(scope="module")
def peagle(drafter) -> dict:
    """A P-EAGLE drafter for the same target (scattered draft vocabulary, weights and placeholder feature perturbed),
    and its logits over every anchor's placeholder chain."""
    from conftest import VOCAB

    from draftsmith.core.native import save_native
    from draftsmith.families.eagle.peagle.module import PEagleModule

    root = drafter["root"]
    module = PEagleModule(str(root / "target"), LAYERS, draft_vocab_size=48, depth=DEPTH, mask_token_id=VOCAB - 3)
    network = module.drafter
    torch.manual_seed(1)
    with torch.no_grad():
        network.set_draft_vocab(torch.rand(VOCAB))
        for name, p in network.named_parameters():
            if name != "embed_tokens.weight":
                p.add_(0.3 * torch.randn_like(p)) if "norm" in name or name == "mask_hidden" else p.mul_(3.0)
    save_native(network, module.target, root / "native-peagle")
    ours = peer_check.draftsmith_parallel_logits(network.eval(), drafter["x"], drafter["features"], DEPTH)
    return {"root": root, "x": drafter["x"], "features": drafter["features"], "ours": ours}


PEAGLE_FORMATS = {"speculators": "speculators", "specforge": "vllm"}
"""The export each peer's P-EAGLE class loads: speculators' ``PEagleDraftModel`` its own format, SpecForge's
``PEagleDraftModel`` the vLLM dir (the same layout, with SpecForge's keys beside vLLM's)."""


def peagle_export(case: dict, peer: str) -> Path:
    out = case["root"] / "export" / f"native-peagle-{peer}"
    if not (out / "config.json").is_file():
        write_export(case["root"] / "native-peagle", PEAGLE_FORMATS[peer], out)
    return out


@pytest.mark.parametrize("peer", ["speculators", "specforge"])
def test_the_peers_peagle_class_gives_draftsmiths_logits_at_every_depth(peagle, peer):
    """The peer's PEagleDraftModel loads the P-EAGLE export; every anchor's placeholders at depths 1..3 (and the
    anchors themselves) give draftsmith's logits and tokens (SpecForge: through its training forward,
    ``OnlinePEagleModel``, with every anchor at every depth)."""
    theirs = good(peagle_runs(peagle, peer), peer)
    assert [tuple(x.shape[:2]) for x in theirs.logits] == [(1, T - d) for d in range(DEPTH)]
    ok, why = agree(peagle["ours"], theirs)
    print(f"{peer} peagle: {why}")
    assert ok, f"{peer} loads draftsmith's P-EAGLE export with other outputs: {why}"


def mask_token_off_by_one(state: dict, config: dict) -> None:
    config["mask_token_id"] += 1


def mask_hidden_dropped(state: dict, config: dict) -> None:
    """The placeholder feature lost (the peer then initialises it at random): only the placeholders change."""
    del state["mask_hidden"]


PEAGLE_BREAKAGES = [mask_token_off_by_one, mask_hidden_dropped, transposed_fc_block]


def peagle_runs(case: dict, peer: str) -> dict:
    return peer_runs(case, peer, "peagle", peagle_export(case, peer), PEAGLE_BREAKAGES, DEPTH)


@pytest.mark.parametrize("peer", ["speculators", "specforge"])
@pytest.mark.parametrize("breakage", PEAGLE_BREAKAGES)
def test_a_broken_peagle_export_fails_the_comparison(peagle, peer, breakage):
    fails(peagle, peagle_runs(peagle, peer), breakage, f"{peer} P-EAGLE")


@pytest.mark.parametrize("peer", ["speculators", "specforge"])
def test_a_peagle_checkpoint_the_peer_wrote_imports_and_drafts_exactly(peagle, peer):
    """A P-EAGLE randomly initialised and saved by the peer's own code (speculators: ``from_training_args`` +
    ``save_pretrained``; SpecForge: ``PEagleDraftModel`` with its own, trained token embedding + ``save_pretrained``)
    -> ``draftsmith import`` -> a native peagle drafter with the peer's logits at every depth, decoding exactly under
    the verifier."""
    python, root = peer_python(peer), peagle["root"]
    ckpt = peer_check.peer_checkpoint(python, f"{peer}-peagle", root / "target", root / "written" / f"{peer}-peagle")
    imported = root / "imported" / f"{peer}-peagle"
    import_drafter(ckpt, str(root / "target"), imported)
    network, info = load_network(imported)
    assert network.method == "peagle" and network.cfg.depth == DEPTH and info["imported_from"]["layout"] == peer
    ours = peer_check.draftsmith_parallel_logits(network.eval(), peagle["x"], peagle["features"], DEPTH)
    ok, why = agree(ours, run_peer(peagle, peer, ckpt, f"{peer}-peagle-written", DEPTH))
    print(f"{peer}-written P-EAGLE: {why}")
    assert ok, f"the {peer}-written P-EAGLE drafts otherwise once imported: {why}"
    target = Target.from_pretrained(root / "target")
    decoder = SpeculativeDecoder(target, load_trained(imported, target), k=DEPTH, sampling=Sampling(0.0))
    for prompt in ([5, 9, 14, 2], [7, 7, 30, 41, 3, 60]):
        assert decoder.generate(prompt, 16).tokens == plain_decode(target, prompt, 16, Sampling(0.0), None).tokens


@pytest.fixture(scope="module")
def dflash(drafter) -> dict:
    """A two-layer DFlash for the same target whose masks are the target's embedding of a token (what the peers'
    DFlash classes compute), weights perturbed, and its logits at every anchor's masks."""
    from conftest import VOCAB

    from draftsmith.core.native import save_native
    from draftsmith.families.dflash.module import DFlashModule

    root = drafter["root"]
    module = DFlashModule(
        str(root / "target"), LAYERS, depth=DEPTH, num_layers=2, mask_token_id=VOCAB - 3, mask_from_token=True
    )
    network = module.drafter
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in network.named_parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn_like(p)) if "norm" in name else p.mul_(3.0)
    save_native(network, module.target, root / "native-dflash")
    ours = peer_check.draftsmith_dflash_logits(network.eval(), drafter["x"], drafter["features"], DEPTH)
    return {"root": root, "x": drafter["x"], "features": drafter["features"], "ours": ours}


def dflash_runs(case: dict, peer: str) -> dict:
    """speculators' class on the speculators export, SpecForge's on the SGLang one (z-lab's layout)."""
    return peer_runs(case, peer, "dflash", exported(case, "native-dflash", peer), DFLASH_BREAKAGES, DEPTH)


@pytest.mark.parametrize("peer", ["speculators", "specforge"])
def test_the_peers_dflash_class_gives_draftsmiths_logits_at_every_mask(dflash, peer):
    """speculators' DFlashDraftModel (its embedding reloaded from the target) and SpecForge's (z-lab's layout, as
    SGLang serves it) load the DFlash export; every anchor's block gives draftsmith's logits and tokens at each
    mask."""
    theirs = good(dflash_runs(dflash, peer), peer)
    assert [tuple(x.shape[:2]) for x in theirs.logits] == [(1, T - DEPTH - 1)] * DEPTH
    ok, why = agree(dflash["ours"], theirs)
    print(f"{peer} dflash: {why}")
    assert ok, f"{peer} loads draftsmith's DFlash export with other outputs: {why}"


def dflash_mask_token_off_by_one(state: dict, config: dict) -> None:
    (config.get("dflash_config") or config)["mask_token_id"] += 1


def hidden_norm_dropped(state: dict, config: dict) -> None:
    """The context's norm lost (the peer then starts it at ones)."""
    del state["hidden_norm.weight"]


DFLASH_BREAKAGES = [dflash_mask_token_off_by_one, hidden_norm_dropped, transposed_fc_block]


@pytest.mark.parametrize("peer", ["speculators", "specforge"])
@pytest.mark.parametrize("breakage", DFLASH_BREAKAGES)
def test_a_broken_dflash_export_fails_the_comparison(dflash, peer, breakage):
    fails(dflash, dflash_runs(dflash, peer), breakage, f"{peer} DFlash")


@pytest.mark.parametrize("peer", ["speculators", "specforge"])
def test_a_dflash_checkpoint_the_peer_wrote_imports_and_drafts_exactly(dflash, peer):
    """A two-layer DFlash with grouped-query attention, randomly initialised and saved by the peer's own code
    (speculators: ``DFlashDraftModel.from_training_args`` + ``save_pretrained``; SpecForge: ``DFlashDraftModel`` +
    ``save_pretrained``, z-lab's layout) -> ``draftsmith import`` -> a native dflash drafter with the peer's logits
    at every mask, decoding exactly under the verifier."""
    python, root = peer_python(peer), dflash["root"]
    ckpt = peer_check.peer_checkpoint(python, f"{peer}-dflash", root / "target", root / "written" / f"dflash-{peer}")
    import_drafter(ckpt, str(root / "target"), root / "imported" / f"dflash-{peer}")
    network, info = load_network(root / "imported" / f"dflash-{peer}")
    assert network.method == "dflash" and network.cfg.depth == DEPTH and network.cfg.num_layers == 2
    assert info["imported_from"]["layout"] == {"speculators": "speculators", "specforge": "z-lab"}[peer]
    ours = peer_check.draftsmith_dflash_logits(network.eval(), dflash["x"], dflash["features"], DEPTH)
    ok, why = agree(ours, run_peer(dflash, peer, ckpt, f"dflash-{peer}-written", DEPTH))
    print(f"{peer}-written DFlash: {why}")
    assert ok, f"the {peer}-written DFlash drafts otherwise once imported: {why}"
    target = Target.from_pretrained(root / "target")
    drafter = load_trained(root / "imported" / f"dflash-{peer}", target)
    decoder = SpeculativeDecoder(target, drafter, k=DEPTH, sampling=Sampling(0.0))
    for prompt in ([5, 9, 14, 2], [7, 7, 30, 41, 3, 60]):
        assert decoder.generate(prompt, 16).tokens == plain_decode(target, prompt, 16, Sampling(0.0), None).tokens
