"""The two draft LM stages as Python calls (``train.fit.fit`` on their recipes), for the quickstart and benchmarks.

``pretrain``: a fresh student on the target's corpus (recipe ``draft_lm_pretrain``);
``distill``: that student aligned to the target on its generated data (recipe ``draft_lm``);
``train_distilled_draft_lm``: both, exported as a native drafter dir ``--drafter`` accepts.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from draftsmith.core.files import made_whole
from draftsmith.core.machine import Device
from draftsmith.core.manifest import is_current, write_manifest
from draftsmith.families.student import StudentShape
from draftsmith.targets import ResolvedTarget
from draftsmith.train.fit import FitRun, configure, fit, fit_export


@dataclass(frozen=True)
class DraftLMBudget:
    """How much work each draft LM stage does."""

    shape: StudentShape = field(default_factory=StudentShape)
    """The fresh student (default: 2 layers, hidden 128: ~1.5M parameters with a 4096-token vocabulary)."""
    pretrain_steps: int = 300
    """Pre-training optimizer steps on the corpus."""
    pretrain_batch_size: int = 16
    """Corpus blocks (of 128 tokens) per pre-training step."""
    distill_steps: int = 200
    """Distillation optimizer steps on the target's generated data."""
    batch_size: int = 8
    """Generated sequences per distillation step."""
    lr: float = 0.003
    """Pre-training peak learning rate (distillation uses a third of it)."""


FAST = DraftLMBudget(StudentShape(layers=1, hidden=64, heads=2, intermediate=128), 40, 8, 24, 4)
"""A seconds-long budget for tests and ``quickstart --fast``."""
QUICK = DraftLMBudget(pretrain_steps=150, distill_steps=60)
"""The quickstart's budget: under a minute on 2 CPU cores for distilling the default target's sibling (about
a minute more when pre-training a fresh student too)."""


def pretrain(
    target: ResolvedTarget,
    val: Path,
    out: Path,
    budget: DraftLMBudget = DraftLMBudget(),
    force: bool = False,
    device: Device | None = None,
) -> Path:
    """Pre-train a fresh student on the corpus of ``target`` (next-token cross-entropy);
    returns its best checkpoint by ``val/tau_est`` on ``val`` (greedy generated data), reused unless ``force``;
    ``device``: where it trains (default: the recipe's ``auto``)."""
    root = out / "fit" / "draft_lm_pretrain"
    best = root / "best.ckpt"
    run = FitRun(
        target=str(target),
        out=root,
        steps=budget.pretrain_steps,
        lr=budget.lr,
        model={"loss": "ce", "shape": asdict(budget.shape)},
        data={
            "tokenizer": str(target.path),
            "val": str(val),
            "batch_size": budget.pretrain_batch_size,
            "max_tokens": budget.pretrain_steps * budget.pretrain_batch_size * 128,
        },
        trainer={"enable_model_summary": False} | (device.trainer() if device else {}),
    )
    stage = {"fit": configure("draft_lm_pretrain", run)}
    if is_current(root, stage) and best.is_file() and not force:
        return best
    shutil.copy(fit("draft_lm_pretrain", run).best, best)
    write_manifest(root, stage=stage, recipe="draft_lm_pretrain")  # after the copy: the stage is finished
    return best


def distill(
    target: ResolvedTarget,
    data: tuple[Path, Path],
    init: Path,
    out: Path,
    name: str,
    loss: str = "fkl",
    on_policy: float = 0.0,
    budget: DraftLMBudget = DraftLMBudget(),
    force: bool = False,
    device: Device | None = None,
) -> Path:
    """Distil the student at ``init`` into the target on ``data`` (train, val) with ``loss`` and on-policy
    share λ = ``on_policy``; exports the best checkpoint to ``out/drafters/<name>`` (reused unless ``force``)."""
    return fit_export(
        "draft_lm",
        FitRun(
            target=str(target),
            train=str(data[0]),
            val=str(data[1]),
            out=out / "fit" / name,
            steps=budget.distill_steps,
            batch_size=budget.batch_size,
            lr=budget.lr / 3,
            model={"init": str(init), "loss": loss, "on_policy": on_policy},
            trainer={"enable_model_summary": False} | (device.trainer() if device else {}),
        ),
        target,
        out / "drafters" / name,
        force,
    )


def export_pretrained(target: ResolvedTarget, checkpoint: Path, out: Path, name: str = "draft_lm_pretrained") -> Path:
    """The pre-trained (undistilled) student as a native drafter dir ``out/drafters/<name>``, beside ``target`` in
    the dtype the checkpoint records it was trained against."""
    import torch

    from draftsmith.core.native import save_native
    from draftsmith.families.registry import load_network
    from draftsmith.targets import load_target

    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    recorded = saved.get("draftsmith", {}).get("target", {}).get("dtype", "float32")
    target = load_target(replace(target, dtype=recorded))
    network, _ = load_network(checkpoint, target)
    score = saved["callbacks"]
    best = next((v["best_model_score"] for k, v in score.items() if "ModelCheckpoint" in k), None)
    extra = {"checkpoint": str(checkpoint), "val_tau_est": float(best) if best is not None else None}
    return save_native(network, target, out / "drafters" / name, extra)


def train_distilled_draft_lm(
    target: ResolvedTarget,
    data: tuple[Path, Path],
    out: Path,
    budget: DraftLMBudget = QUICK,
    loss: str = "fkl",
    on_policy: float = 0.5,
    force: bool = False,
    init: Path | None = None,
    device: Device | None = None,
) -> Path:
    """FastDraft + DistillSpec in one call: pre-train a fresh draft LM on the target's corpus (or start from
    ``init``, an LM already pre-trained on it with the target's tokenizer, e.g. the default target's sibling),
    then distil it on the target's generated ``data`` (train, val); returns the native export
    ``out/drafters/draft_lm`` (``--drafter draft_lm=<it>``). Each stage's artifact under ``out`` is reused
    unless ``force``; ``device``: where both train (default: the recipes' ``auto``)."""
    if init is None:
        init = pretrain(target, data[1], out, budget, force, device)
    return distill(target, data, init, out, "draft_lm", loss, on_policy, budget, force, device)


def truncated_target(target_dir: Path, layers: int, out: Path) -> Path:
    """The target's first ``layers`` decoder layers with its embeddings, final norm and LM head, saved as a causal
    LM dir (reused when present): a draft LM that starts where the target's own computation starts (the
    draft-model half of Kangaroo / LayerSkip's self-speculation), to be distilled into the full target."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from draftsmith.errors import DraftsmithError

    stage = {"truncate": str(target_dir), "layers": layers}
    if is_current(out, stage):
        return out
    config = AutoConfig.from_pretrained(target_dir)
    if not 0 < layers < config.num_hidden_layers:
        raise DraftsmithError(f"draft_lm_layers: {layers} must be between 1 and {config.num_hidden_layers - 1}")
    full = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(full.state_dict(), strict=False)
    if missing:
        raise DraftsmithError(f"draft_lm_layers: the truncated target misses weights {missing[:3]}")

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(target_dir).save_pretrained(tmp)

    made_whole(out, save)
    write_manifest(out, stage=stage)
    return out
