"""S2D, the sorted draft LM: its sub-networks, the loss over (sub-network, target) pairs, the sub-network ``score``
picks per target by the cost model, exactness of every sub-network as a drafter, export of one as a draft LM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, make_llama, make_tokenizer
from test_verifier import SMALL_V, depth_pvalues, sampled_triples
from transformers import AutoModelForCausalLM

from draftsmith.cli import main
from draftsmith.core.draft import Draft
from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling, probs
from draftsmith.core.target import Target
from draftsmith.data.generate import generate
from draftsmith.decode.auto_k import chain_tau
from draftsmith.decode.metrics import drafter_metrics
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.eval.score import score_drafters
from draftsmith.families.registry import load_network, load_trained
from draftsmith.families.s2d.exits import pick_exit
from draftsmith.families.s2d.module import export_subnetwork, pair_losses, sorted_loss
from draftsmith.families.s2d.network import S2DConfig, S2DDrafter, S2DNetwork
from draftsmith.layers.losses import distillation_loss
from draftsmith.layers.module import shift
from draftsmith.targets import resolve_target
from draftsmith.train.fit import FitRun, fit

pytestmark = pytest.mark.usefixtures("one_thread")


def sorted_draft(layers: int = 3, seed: int = 5, vocab: int = VOCAB, hidden: int = 32) -> S2DNetwork:
    model = make_llama(seed=seed, layers=layers, hidden=hidden, vocab=vocab)
    return S2DNetwork(S2DConfig(model.config.to_dict(), tuple(range(1, layers + 1))), model)


@pytest.fixture(scope="module")
def family() -> list[Target]:
    """Three tiny targets of one family (2, 3 and 4 layers) sharing a tokenizer."""
    tok = make_tokenizer()
    return [Target(make_llama(seed=10 + n, layers=n, hidden=32), tok, name=f"tiny-{n}") for n in (2, 3, 4)]


def batch(seed: int, rows: int = 3, length: int = 12) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB - 2, (rows, length), generator=g)
    loss_mask = torch.zeros_like(ids)
    loss_mask[:, 4:] = 1  # a 4-token prompt, generated text after it
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}


def decode(target: Target, drafter, prompts: list[list[int]], k: int, n: int = 16):
    """Greedy speculative decoding of ``prompts`` with ``drafter`` as it is set (``score`` would choose a
    sub-network): (tokens per prompt, plain greedy tokens per prompt, τ)."""
    spec = [SpeculativeDecoder(target, drafter, k, Sampling()).generate(p, n) for p in prompts]
    plain = [plain_decode(target, p, n, Sampling()) for p in prompts]
    tau = drafter_metrics("d", k, spec, plain, True).tau
    return [r.tokens for r in spec], [r.tokens for r in plain], tau


# -- the sub-networks ---------------------------------------------------------------------------------
def test_each_exit_is_its_truncated_sub_network_run_as_a_model_of_its_own():
    network = sorted_draft().eval()
    ids = batch(0)["input_ids"]
    with torch.no_grad():
        exits = network.exit_logits(ids)
        for n in network.exits:
            own = network.subnetwork(n)
            assert own.model.config.num_hidden_layers == n
            assert torch.allclose(exits[n], own(ids), atol=1e-5), n
        assert torch.allclose(exits[3], network(ids), atol=1e-5)
        assert not torch.allclose(exits[1], exits[2], atol=1e-2)  # the exits are different models


def test_exits_must_end_at_the_whole_draft():
    model = make_llama(seed=5, layers=3, hidden=32)
    with pytest.raises(DraftsmithError, match=r"model.exits: exits \[1, 2\] must be layer counts in 1..3"):
        S2DNetwork(S2DConfig(model.config.to_dict(), (1, 2)), model)


# -- the loss over (sub-network, target) pairs --------------------------------------------------------
def test_sorted_loss_is_the_mean_over_every_sub_network_and_target_pair(family):
    network = sorted_draft()
    batches = [batch(t) for t in range(len(family))]
    teachers = [t(b["input_ids"]).logits for t, b in zip(family, batches, strict=True)]
    losses = pair_losses(network, batches, teachers, "fkl")
    assert set(losses) == {(n, t) for n in (1, 2, 3) for t in range(3)}
    # each pair's loss is that sub-network's, as an ordinary draft LM, against that target on that target's batch
    for (n, t), value in losses.items():
        own = network.subnetwork(n)
        mask = shift(batches[t]["loss_mask"], 1)
        expected = distillation_loss("fkl", own(batches[t]["input_ids"]), teachers[t], mask, 1.0, 0.5)
        assert float(value) == pytest.approx(float(expected), rel=1e-5), (n, t)
    assert len({round(float(v), 4) for v in losses.values()}) == 9  # nine different pairs
    total = sorted_loss(losses)
    assert float(total) == pytest.approx(sum(float(v) for v in losses.values()) / 9, rel=1e-6)

    # its gradient is each pair's weighted 1/9: pair (n, t) reaches layers 1..n, never a deeper one
    params = dict(network.named_parameters())
    layer = {i: [name for name in params if f"layers.{i - 1}." in name] for i in (1, 2, 3)}

    def grads(loss: torch.Tensor) -> dict[str, torch.Tensor]:
        got = torch.autograd.grad(loss, list(params.values()), retain_graph=True, allow_unused=True)
        return {name: torch.zeros_like(p) if g is None else g for (name, p), g in zip(params.items(), got, strict=True)}

    per_pair = {key: grads(v) for key, v in losses.items()}
    whole = grads(total)
    for name in params:
        assert torch.allclose(whole[name], sum(g[name] for g in per_pair.values()) / 9, atol=1e-7), name
    for (n, t), g in per_pair.items():
        for i in (1, 2, 3):
            assert any(g[name].abs().sum() > 0 for name in layer[i]) == (i <= n), (n, t, i)
        assert g["model.lm_head.weight"].abs().sum() > 0  # the shared head learns from every pair
    # so every sub-network gets gradient from the whole loss: layer i from exits i.. of every target
    for i in (1, 2, 3):
        assert all(whole[name].abs().sum() > 0 for name in layer[i]), i


def test_ce_pairs_read_each_targets_own_data(family):
    network = sorted_draft()
    batches = [batch(t) for t in range(3)]
    losses = pair_losses(network, batches, [None] * 3, "ce")
    swapped = pair_losses(network, batches[::-1], [None] * 3, "ce")
    assert float(losses[1, 0]) == pytest.approx(float(swapped[1, 2]))
    assert float(losses[1, 0]) != pytest.approx(float(losses[1, 2]))


# -- the sub-network choice ---------------------------------------------------------------------------
def speed(accept: list[float], cost: float, k: int, ratios: dict[int, float]) -> float:
    return chain_tau(accept, k) / (ratios[k + 1] + k * cost)


@pytest.mark.parametrize(
    ("costs", "ratios", "expected"),
    [
        ((0.05, 0.10, 0.60), {5: 1.1}, 2),  # drafting cheap, depth pays up to the middle exit
        ((0.05, 0.30, 0.60), {5: 1.1}, 1),  # the middle exit's acceptance no longer pays for its cost
        ((0.02, 0.03, 0.04), {5: 1.1}, 3),  # every exit costs little: the deepest accepts most
    ],
)
def test_the_sub_network_of_highest_predicted_speed_is_chosen(costs, ratios, expected):
    accepts = {1: [0.5], 2: [0.75], 3: [0.8]}
    profiles = {n: (accepts[n], costs[n - 1]) for n in (1, 2, 3)}
    choice = pick_exit(profiles, ratios, [4])
    speeds = {n: speed(accepts[n], costs[n - 1], 4, ratios) for n in (1, 2, 3)}
    assert choice.layers == max(speeds, key=speeds.get) == expected
    assert choice.predicted_speedup == pytest.approx(speeds[expected])
    assert [c["speedup"] for c in choice.candidates] == pytest.approx([speeds[n] for n in (1, 2, 3)])


def test_with_k_auto_each_sub_network_is_judged_at_its_own_best_k():
    ratios = {m: 1.0 + 0.05 * (m - 1) for m in range(2, 10)}
    profiles = {1: ([0.3], 0.02), 2: ([0.95], 0.2)}
    choice = pick_exit(profiles, ratios, range(1, 9))
    best = {n: max(range(1, 9), key=lambda k, n=n: speed(profiles[n][0], profiles[n][1], k, ratios)) for n in (1, 2)}
    assert [c["k"] for c in choice.candidates] == [best[1], best[2]] and best[1] < best[2]
    assert choice.layers == 2 and choice.k == best[2]


def test_equal_speeds_go_to_the_shallower_sub_network():
    choice = pick_exit({1: ([0.5], 0.1), 2: ([0.5], 0.1)}, {5: 1.0}, [4])
    assert choice.layers == 1


@pytest.mark.slow
def test_score_drafts_each_target_with_the_sub_network_its_measured_costs_favour(prompts):
    target = Target(make_llama(seed=21, layers=1, hidden=32), make_tokenizer())
    # a sorted draft whose first sub-network is the target itself (accepts every token) and whose second layer
    # spoils it: the shallow sub-network is both the cheaper and the better one, not the one drafting by default
    model = make_llama(seed=22, layers=2, hidden=32)
    model.load_state_dict(target.model.state_dict(), strict=False)
    with torch.no_grad():
        for name, w in model.model.layers[1].named_parameters():
            if "o_proj" in name or "down_proj" in name:
                w.mul_(8.0)
    drafter = S2DNetwork(S2DConfig(model.config.to_dict(), (1, 2)), model).as_drafter()
    assert drafter.layers == 2
    plain, rows = score_drafters(target, {"s2d": drafter}, prompts, 4, Sampling(), 16, progress=False)
    chosen = rows[0].extra["s2d"]
    # the recorded choice is the cost model's on the recorded measurements, and it is the one that drafted
    profiles = {c["layers"]: (c["accept"], c["cost"]) for c in chosen["candidates"]}
    ratios = {int(m): r for m, r in chosen["ratios"].items()}
    assert pick_exit(profiles, ratios, [4]).layers == chosen["layers"] == drafter.layers
    assert chosen["layers"] == 1
    assert chosen["candidates"][0]["accept"] == [1.0] * 4 and chosen["candidates"][1]["accept"][0] < 1
    alone = {}
    for n in (1, 2):
        drafter.use(n)
        alone[n] = decode(target, drafter, prompts, 4)[2]
    assert rows[0].tau == pytest.approx(alone[chosen["layers"]])
    assert alone[1] > alone[2]
    assert rows[0].greedy_exact == len(prompts)


def test_the_sub_network_is_chosen_on_the_first_held_out_prompts_not_one(monkeypatch):
    """S2D's sub-network choice measures each sub-network on the first ``CALIBRATION_PROMPTS`` prompts (as ``--k
    auto`` does): one prompt whose drafts were all accepted decided it alone before."""
    from draftsmith.eval import calibration
    from draftsmith.families.s2d import exits

    calibrated, generate = [], SpeculativeDecoder.generate

    def recording(self, prompt, max_new_tokens, generator=None):
        if max_new_tokens == exits.CALIBRATION_TOKENS:
            calibrated.append(list(prompt))
        return generate(self, prompt, max_new_tokens, generator)

    monkeypatch.setattr(SpeculativeDecoder, "generate", recording)
    target = Target(make_llama(seed=21, layers=1, hidden=32), make_tokenizer())
    drafter = S2DNetwork(S2DConfig(make_llama(seed=22, layers=2, hidden=32).config.to_dict(),
                                                       (1, 2)), make_llama(seed=22, layers=2, hidden=32)).as_drafter()  # fmt: skip
    prompts = [[3, 4, 5, 6], [7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18]]
    _, [row] = score_drafters(target, {"s2d": drafter}, prompts, 4, Sampling(), 8, progress=False)
    first = prompts[: calibration.CALIBRATION_PROMPTS]
    assert calibration.CALIBRATION_PROMPTS == 3
    assert calibrated == first * 2  # each of the two sub-networks, on each calibration prompt
    assert row.extra["s2d"]["layers"] in (1, 2)


# -- every sub-network is an exact drafter ------------------------------------------------------------
def test_greedy_output_of_every_sub_network_equals_plain_greedy(family, prompts):
    drafter = sorted_draft(seed=7).as_drafter()
    for target in family:
        for n in (1, 2, 3):
            drafter.use(n)
            spec, plain, _ = decode(target, drafter, prompts, 3, 20)
            assert spec == plain, (target.name, n)


class StaleQ(S2DDrafter):
    """Broken: drafts with sub-network 1 but reports the deepest sub-network's distribution as q (the q of the
    network it drafted with before switching)."""

    def propose(self, state, k, sampling, generator) -> Draft:
        draft = super().propose(state, k, sampling, generator)  # tokens and q of the sub-network in use (1)
        deep = self.subnetworks[max(self.subnetworks)]
        ids = torch.tensor([state.ids + draft.tokens.tolist()])
        with torch.no_grad():
            logits = deep(input_ids=ids).logits[0, len(state.ids) - 1 : -1]
        return Draft.chain(draft.tokens.tolist(), torch.stack([probs(x.float(), sampling) for x in logits]))


@pytest.mark.slow
def test_every_sub_network_samples_losslessly_and_a_stale_q_is_caught():
    torch.manual_seed(0)
    target = Target(make_llama(seed=11, layers=1, hidden=32, vocab=SMALL_V))
    target.model.lm_head.weight.data.mul_(0.15)  # soft: every pair of tokens gets real mass
    network = sorted_draft(layers=2, seed=12, vocab=SMALL_V)
    with torch.no_grad():  # layer 2 writes much to the residual: the sub-networks' q differ (total variation ~0.2)
        for name, w in network.model.model.layers[1].named_parameters():
            if "o_proj" in name or "down_proj" in name:
                w.mul_(4.0)
    sampling, prompt = Sampling(temperature=1.0), [1, 2, 3]
    drafter = network.as_drafter()
    for n in (1, 2):
        drafter.use(n)
        p = depth_pvalues(target, prompt, sampling, sampled_triples(target, drafter, prompt, sampling, 1500))
        assert min(p) > 1e-3, (n, p)
    broken = StaleQ(drafter.subnetworks)
    broken.use(1)
    p = depth_pvalues(target, prompt, sampling, sampled_triples(target, broken, prompt, sampling, 1500))
    assert min(p) < 1e-3, p


# -- export of a sub-network, training against several targets ---------------------------------------
@pytest.fixture(scope="module")
def saved(tmp_path_factory, family) -> dict:
    """The family saved as model dirs, and a sorted draft LM recorded for all three (a native dir)."""
    root = tmp_path_factory.mktemp("s2d")
    dirs = []
    for t in family:
        t.model.save_pretrained(root / t.name)
        t.tokenizer.save_pretrained(root / t.name)
        dirs.append(root / t.name)
    loaded = [Target.from_pretrained(d) for d in dirs]
    network = sorted_draft(seed=9)
    save_native(network, loaded[0], root / "sorted", {"targets": [t.fingerprint for t in loaded]})
    return {"root": root, "dirs": dirs, "network": network.eval(), "targets": loaded}


def test_a_sub_network_exports_as_an_ordinary_draft_lm_that_drafts_as_it_did(saved, prompts, tmp_path):
    target_dir, target = saved["dirs"][1], saved["targets"][1]
    main(["s2d", "export", f"--src={saved['root'] / 'sorted'}", "--depth=2", f"--target={target_dir}",
          f"--out={tmp_path / 'sub2'}"])  # fmt: skip
    info = json.loads((tmp_path / "sub2" / "config.json").read_text())
    assert info["method"] == "draft_lm" and info["config"]["hf_config"]["num_hidden_layers"] == 2
    assert info["target"] == target.fingerprint and info["s2d"]["layers"] == 2
    exported = load_trained(tmp_path / "sub2", target)
    inside = load_trained(saved["root"] / "sorted", target)
    inside.use(2)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "sub2" / "hf")  # what transformers and vLLM load
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            assert torch.allclose(exported.model(input_ids=ids).logits, inside.model(input_ids=ids).logits, atol=1e-5)
            assert torch.allclose(hf(input_ids=ids).logits, inside.model(input_ids=ids).logits, atol=1e-5)
    exported_run, inside_run = (decode(target, d, prompts, 3, 12) for d in (exported, inside))
    assert exported_run == inside_run and exported_run[0] == exported_run[1]  # the same drafts, exact greedy output
    assert (tmp_path / "sub2" / "hf" / "tokenizer_config.json").is_file()


def test_an_s2d_drafter_is_refused_for_a_target_it_was_not_trained_for(saved, tmp_path):
    other = tmp_path / "other"
    make_llama(seed=99, layers=5, hidden=32).save_pretrained(other)  # a family member it was not trained for
    make_tokenizer().save_pretrained(other)
    with pytest.raises(DraftsmithError, match="was made for target"):
        load_trained(saved["root"] / "sorted", Target.from_pretrained(other))
    for target in saved["targets"]:  # and taken for each target it was
        assert isinstance(load_trained(saved["root"] / "sorted", target), S2DDrafter)
    with pytest.raises(DraftsmithError, match=r"--depth 4: .* have \[1, 2, 3\] layers"):
        export_subnetwork(saved["root"] / "sorted", 4, resolve_target(str(saved["dirs"][0])), tmp_path / "x")


def test_a_drafter_saved_under_the_former_method_name_sorted_draft_lm_still_loads(saved, tmp_path):
    """S2D was registered as ``sorted_draft_lm`` before it took one name; the drafters saved then say so in their
    ``config.json`` and load as ``s2d`` drafters."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(saved["root"] / "sorted", old)
    record = json.loads((old / "config.json").read_text())
    assert record["method"] == "s2d"
    (old / "config.json").write_text(json.dumps({**record, "method": "sorted_draft_lm"}))
    network, info = load_network(old, saved["targets"][0])
    assert info["method"] == "s2d" and isinstance(network, S2DNetwork)
    for target in saved["targets"]:
        assert isinstance(load_trained(old, target), S2DDrafter)
    export_subnetwork(old, 2, resolve_target(str(saved["dirs"][1])), tmp_path / "sub2")
    assert json.loads((tmp_path / "sub2" / "config.json").read_text())["method"] == "draft_lm"


def words(g: torch.Generator, n: int) -> str:
    return " ".join(f"w{i}" for i in torch.randint(0, VOCAB - 2, (n,), generator=g).tolist())


@pytest.mark.slow
def test_one_fit_trains_every_pair_on_each_targets_data(saved, tmp_path):
    dirs = saved["dirs"]
    g = torch.Generator().manual_seed(0)
    for name, n in [("train", 16), ("val", 4)]:
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": words(g, 3)}) + "\n" for _ in range(n)))
    data = {"train": [], "val": []}
    for d in dirs:
        for name, temperature in [("train", 1.0), ("val", 0.0)]:
            out = tmp_path / f"{d.name}-{name}"
            generate(
                resolve_target(str(d)), str(tmp_path / f"{name}.jsonl"), out, temperature=temperature, max_new_tokens=12
            )
            data[name].append(str(out))
    shape = {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64}
    run = FitRun(out=tmp_path / "fit", steps=4, model={"targets": [str(d) for d in dirs], "init": None, "shape": shape,
                 "exits": [1, 2]}, data=data | {"batch_size": 4, "max_length": 48},
                 trainer={"enable_progress_bar": False, "enable_model_summary": False})  # fmt: skip
    result = fit("s2d", run)
    record = torch.load(result.best, map_location="cpu", weights_only=False)["draftsmith"]
    assert [t["name"] for t in record["targets"]] == [str(d) for d in dirs]
    assert set(record["val_tau_est_pairs"]) == {"1", "2"} and all(
        len(v) == 3 for v in record["val_tau_est_pairs"].values()
    )
    assert result.score == pytest.approx(sum(map(sum, record["val_tau_est_pairs"].values())) / 6, rel=1e-4)
    for target in saved["targets"]:
        assert load_trained(result.best, target).subnetworks.keys() == {1, 2}
    # data generated by another target than the one in its place is refused, naming the field
    swapped = FitRun(out=tmp_path / "fit2", steps=1, model=run.model, trainer=run.trainer,
                     data=run.data | {"train": data["train"][::-1]})  # fmt: skip
    with pytest.raises(DraftsmithError):
        fit("s2d", swapped)
    import wandb

    assert wandb.run is None, "a failed fit closes its wandb run (a later fit would log into it)"


def test_targets_with_another_tokenizer_are_refused(saved, tmp_path):
    from draftsmith.families.s2d.module import S2DModule

    foreign = tmp_path / "foreign"
    make_llama(seed=3, layers=2, hidden=32).save_pretrained(foreign)
    make_tokenizer(salt="x").save_pretrained(foreign)
    with pytest.raises(DraftsmithError, match="model.targets: .*foreign has another vocabulary or tokenizer"):
        S2DModule([str(saved["dirs"][0]), str(foreign)])


def test_default_n_names_a_member_of_the_default_family_unless_a_dir_has_that_name(tmp_path, monkeypatch):
    from draftsmith.targets import FAMILY_MEMBER, default, resolve

    assert FAMILY_MEMBER.fullmatch("default-8") and not FAMILY_MEMBER.fullmatch("default-x")
    assert default.member_dir(8, default.TargetBuildConfig()).name.endswith("-8l")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "default-2").mkdir()
    assert resolve("default-2") == Path("default-2")  # a local dir is not rebuilt as the family member


@pytest.mark.slow
def test_the_benchmark_runs_end_to_end_on_its_quick_setting(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "benchmarks/s2d.py", "--quick", "--out", str(tmp_path)], cwd=root,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads((tmp_path / "s2d_quick.json").read_text())
    assert (
        len(result["targets"]) == 3
        and result["fits"]["s2d"]["steps"] == 3 * result["fits"]["per_target"]["tiny-1"]["steps"]
    )
    for t in result["targets"].values():
        assert set(t["scores"]) == {"greedy", "T0.7"}
        rows = {r["name"]: r for r in t["scores"]["greedy"]["drafters"]}
        assert rows["S2D (sub-network by score)"]["s2d"]["layers"] in (1, 2)
        assert all(r["greedy_exact"] == r["prompts"] for r in rows.values())
    assert (tmp_path / "s2d_quick.md").is_file()


def test_the_draft_starts_from_a_draft_lm_pretrained_for_another_member_of_the_family(saved, tmp_path):
    from draftsmith.families.s2d.module import S2DModule
    from draftsmith.layers.causal_lm import DraftLMConfig, DraftLMNetwork

    student = make_llama(seed=4, layers=3, hidden=32)
    start = save_native(DraftLMNetwork(DraftLMConfig(student.config.to_dict()), student), saved["targets"][0],
                        tmp_path / "pretrained")  # fmt: skip
    module = S2DModule([str(d) for d in saved["dirs"][1:]], init=str(start))  # not the target it was made for
    assert module.drafter.exits == (1, 2, 3)
    assert all(torch.equal(a, b) for a, b in zip(module.drafter.model.state_dict().values(),
                                                 student.state_dict().values(), strict=True))  # fmt: skip
    foreign = make_tokenizer(salt="x")
    other = Target(make_llama(seed=4, layers=3, hidden=32), foreign, name="foreign")
    save_native(DraftLMNetwork(DraftLMConfig(student.config.to_dict()), student), other, tmp_path / "foreign")
    with pytest.raises(DraftsmithError, match="model.init: .* another vocabulary or tokenizer"):
        S2DModule([str(saved["dirs"][0])], init=str(tmp_path / "foreign"))
