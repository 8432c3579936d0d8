"""Medusa-1/-2, Hydra, Hydra++: they learn, their estimates match the verifier, trees stay exact, LoRA merges."""

from __future__ import annotations

import datasets
import pytest
import torch
from test_train import setup, trainer  # noqa: F401 - the module-scoped tiny target + generated data

from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.core.trees import TreeKind
from draftsmith.data.generate import generate
from draftsmith.eval.score import score_drafters
from draftsmith.families.hydra.module import HydraModule
from draftsmith.families.medusa.module import MedusaModule
from draftsmith.families.registry import load_trained
from draftsmith.layers.lora import Lora
from draftsmith.layers.module import OptimConfig
from draftsmith.layers.tree_draft import TreePolicy, static_tree
from draftsmith.targets import resolve_target
from draftsmith.train.data import GeneratedDataModule

OPTIM = OptimConfig(lr=3e-3, warmup_steps=5)
FAMILIES = {
    "medusa1": lambda t: MedusaModule(t, num_heads=3, distill=True, optim=OPTIM),
    "hydra": lambda t: HydraModule(t, num_heads=3, optim=OPTIM),
    "hydrapp": lambda t: HydraModule(t, num_heads=3, num_layers=2, prefix_attention=True, distill=True, optim=OPTIM),
    "medusa2": lambda t: MedusaModule(t, num_heads=3, lora=Lora(r=4), head_warmup_steps=10, optim=OPTIM),
}


def model_distills(name: str) -> bool:
    return name in ("medusa1", "hydrapp")


def val_prompts(setup) -> list[list[int]]:  # noqa: F811
    rows = datasets.load_from_disk(str(setup["data-val"]))
    return [r["input_ids"][: r["prompt_len"]] for r in rows]


@pytest.fixture(scope="module")
def trained(setup, tmp_path_factory):  # noqa: F811
    """Each family trained 40 steps; its validation metrics before and after, and a native export.

    The heads train on the target's greedy continuations of the training prompts: on this random
    tiny target the sampled ones carry too little signal about 2+ tokens ahead for 40 steps.
    """
    greedy = tmp_path_factory.mktemp("greedy") / "data"
    generate(
        resolve_target(str(setup["target"])),
        str(setup["train.jsonl"]),
        greedy,
        temperature=0.0,
        max_new_tokens=24,
        device="cpu",
    )
    out = {}
    for name, make in FAMILIES.items():
        torch.manual_seed(0)
        model = make(str(setup["target"]))
        data = GeneratedDataModule(str(greedy), str(setup["data-val"]), batch_size=8, max_length=64)
        root = tmp_path_factory.mktemp(name)
        before = trainer(root, 0).validate(model, data, verbose=False)[0]
        trainer(root, 40).fit(model, data)
        after = trainer(root, 0).validate(model, data, verbose=False)[0]
        # what the fit CLI's checkpoint records, through the checkpoint hook
        ckpt = {"state_dict": {f"drafter.{k}": v for k, v in model.drafter.state_dict().items()}}
        model.on_save_checkpoint(ckpt)
        state = {k.removeprefix("drafter."): v for k, v in ckpt["state_dict"].items()}
        model.drafter.load_state_dict(state)
        path = save_native(model.drafter, model.target, root / "export", {"topk_accuracy": model.topk_accuracy})
        out[name] = {"module": model, "before": before, "after": after, "export": path}
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_heads_train_and_their_tau_estimate_is_the_verifiers(trained, setup, name):  # noqa: F811
    run = trained[name]
    before, after = run["before"], run["after"]
    print(name, {k: (round(before[k], 3), round(after[k], 3)) for k in after})
    for i in range(3):  # every head's held-out loss drops (soft labels: towards the target's entropy)
        assert after[f"val/ce_{i}"] < before[f"val/ce_{i}"] - (0.03 if model_distills(name) else 0.3), i
    assert after["val/top1_acc_1"] > before["val/top1_acc_1"] + 0.05  # and the first head's accuracy rises
    assert after["val/tau_est"] > before["val/tau_est"] + 0.1
    if name == "medusa2":  # the adapter starts as a no-op and self-distillation keeps the target close
        assert before["val/target_kl"] == pytest.approx(0.0, abs=1e-6)
        assert 0 < after["val/target_kl"] < 0.3

    model = run["module"]
    target = Target.from_pretrained(setup["target"]) if name != "medusa2" else None
    drafter = load_trained(run["export"], target or Target.from_pretrained(setup["target"]))
    target = drafter.own_target or target
    # the estimate replays the verifier's rounds exactly on the target's greedy text (depth capped by the
    # 3 heads). Medusa-2 changed its target, so the validation text is no longer that target's greedy
    # continuation and the estimate is only close.
    scored = score_drafters(target, {name: drafter}, val_prompts(setup), 4, Sampling(0.0), 24, 0)[1][0]
    assert scored.greedy_exact == len(val_prompts(setup))
    rel = 0.2 if name == "medusa2" else 1e-6
    assert scored.tau_full == pytest.approx(after["val/tau_est"], rel=rel)
    assert model.topk_accuracy is not None and len(model.topk_accuracy) == 3


@pytest.mark.slow
@pytest.mark.parametrize("name", ["medusa1", "hydrapp"])
@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_tree_drafting_is_exact_and_accepts_more_than_a_chain(trained, setup, name, tree):  # noqa: F811
    target = Target.from_pretrained(setup["target"])
    chain = load_trained(trained[name]["export"], target)
    grown = load_trained(trained[name]["export"], target)
    grown.set_tree(TreePolicy(TreeKind(tree), size=12, top_k=3), k=3)
    rows = score_drafters(target, {"chain": chain, tree: grown}, val_prompts(setup), 3, Sampling(0.0), 24, 0)[1]
    assert all(r.greedy_exact == len(val_prompts(setup)) for r in rows)
    assert rows[1].mean_drafted > rows[0].mean_drafted  # really trees
    assert rows[1].tau > rows[0].tau


def test_static_tree_takes_the_most_likely_paths_and_is_prefix_closed():
    acc = [[0.6, 0.2, 0.1], [0.5, 0.3, 0.1], [0.4, 0.1, 0.0]]
    paths = static_tree(acc, size=5, max_depth=3)
    # values: (0)=.6 (0,0)=.3 (1)=.2 (0,1)=.18 (0,0,0)=.12 | next best (2)=.1 (1,0)=.1 ...
    assert set(paths) == {(0,), (0, 0), (1,), (0, 1), (0, 0, 0)}
    assert all(p[:-1] in paths for p in paths if len(p) > 1)
    assert static_tree(acc, size=5, max_depth=1) == ((0,), (1,), (2,))


def test_medusa2_merged_adapter_gives_the_unmerged_logits(trained):
    model = trained["medusa2"]["module"]
    network = model.drafter
    assert network.method == "medusa2" and any(v.abs().sum() > 0 for v in network.lora_state().values())
    ids = torch.randint(0, 90, (2, 12), generator=torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        unmerged = model.peft(input_ids=ids).logits
        with model.peft.disable_adapter():
            original = model.peft(input_ids=ids).logits
    merged = network.adapt_target(Target(original_model(model), None, (-1,), "t"))(ids, with_features=False).logits
    assert torch.allclose(merged, unmerged, atol=1e-5)
    assert not torch.allclose(merged, original, atol=1e-4)  # the adapter changed the target


def original_model(model: MedusaModule):
    """The target without its adapter: a fresh copy from the checkpointed base."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model.target.name)
