"""``draftsmith pipeline``'s choices made from the target: its shape read from its ``config.json``
(``inspect_target``), the recipe set by its size, the families (each built on the target before any data), what is
scaled to it (a draft vocabulary at most half the target's), and where each stage runs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from draftsmith import targets
from draftsmith.core.machine import Device
from draftsmith.core.yaml_file import read_yaml
from draftsmith.data.engines import EngineChoice, generation_engine
from draftsmith.errors import DraftsmithError, user_error
from draftsmith.train.fit import RECIPES, FitRun, load_recipe
from draftsmith.train.suite import Plan

DEFAULT_FAMILIES = ("eagle3", "eagle1", "medusa1", "hydrapp", "draft_lm")
LARGE = "smollm2"
"""The recipe set tuned on a real 30-layer, 49k-vocabulary LLM (``configs/smollm2/``)."""
LARGE_FAMILIES = ("eagle3_31", "eagle1", "medusa1", "hydrapp", "draft_lm")
"""``LARGE``'s default families: EAGLE-3 with EAGLE-3.1's norms in place of EAGLE-3 (the recipe study's winner on
the packed corpus: τ higher on every held-out set, the spread between prompts included;
``benchmarks/results/recipe_smollm2.md``)."""


@dataclass(frozen=True)
class TargetInfo:
    """What the pipeline's choices are made from: the target's ``config.json``, and the target resolved."""

    target: targets.ResolvedTarget
    """The target every stage takes: its directory, its dtype decided for the device the pipeline chose."""
    model_type: str
    layers: int
    hidden: int
    vocab: int
    chat_template: bool

    @property
    def dir(self) -> Path:
        """The target's directory."""
        return self.target.path


def inspect_target(spec: targets.TargetSpec, device: str = "cpu", path: Path | None = None) -> TargetInfo:
    """The target's directory (a built-in is built or converted on first use; ``path``: the one a caller built) and
    shape, and the target resolved on ``device`` (its ``auto`` dtype decided, once, for every stage); a directory
    that is not a causal LM with a tokenizer is refused in one line."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    path = targets.resolve(spec) if path is None else path
    if not (path / "config.json").is_file():
        raise DraftsmithError(f"--target {path}: not a model directory (no config.json)")
    try:
        config = AutoConfig.from_pretrained(path)
    except (ValueError, KeyError, OSError) as e:
        raise DraftsmithError(f"--target {path}: config.json is not a model config transformers knows ({e})") from None
    causal = {n for v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() for n in ([v] if isinstance(v, str) else v)}
    archs = getattr(config, "architectures", None) or []
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or (archs and not set(archs) & causal):
        raise DraftsmithError(
            f"--target {path}: not a causal LM (config.json: model_type {config.model_type!r}, architectures "
            f"{archs}); draftsmith drafts for models AutoModelForCausalLM loads"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (ValueError, OSError) as e:
        raise DraftsmithError(f"--target {path}: no tokenizer loads from it ({str(e).splitlines()[0]})") from None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return TargetInfo(
        targets.resolve_target(spec, device=device, path=path),
        config.model_type,
        text.num_hidden_layers,
        text.hidden_size,
        text.vocab_size,
        bool(getattr(tokenizer, "chat_template", None)),
    )


def choose_recipe_set(info: TargetInfo, recipes: str | None) -> tuple[str, str]:
    """The recipe directory (``Plan.recipes``) and why it was chosen."""
    if recipes not in (None, "auto"):
        given = "" if recipes == "default" else recipes
        path = RECIPES / given if not Path(given).is_absolute() else Path(given)
        if not path.is_dir():
            raise DraftsmithError(f"--recipes {recipes}: no such recipe set (default, {LARGE} or a directory)")
        return (str(path) if Path(given).is_absolute() else given), "as given (--recipes)"
    if info.vocab > 8192 or info.layers >= 12:
        return LARGE, f"{info.layers} layers, vocabulary {info.vocab}: sized like a real LLM (configs/{LARGE}/)"
    return "", f"{info.layers} layers, vocabulary {info.vocab}: a small model (configs/, tuned on the toy target)"


def _trains_on_generated_data(recipe: Path) -> bool:
    """A recipe the pipeline trains as a family: a drafter of the target fed the pipeline's generated data (not the
    draft LM's own stages, the acceptance head, nor a recipe of another data module: FastDraft's pre-training,
    cross-vocabulary distillation)."""

    data = (read_yaml(recipe) or {}).get("data") or {}
    return recipe.stem not in ("draft_lm", "acceptance_head") and "class_path" not in data


def choose_families(families: list[str] | None, plan_recipes: str) -> tuple[list[str], bool]:
    """The recipe-trained families and whether a draft LM is distilled; an unknown name is refused in one line."""
    wanted = list(families or (LARGE_FAMILIES if plan_recipes == LARGE else DEFAULT_FAMILIES))
    wanted = [f.strip() for name in wanted for f in name.split(",") if f.strip()]
    folder = Path(plan_recipes) if Path(plan_recipes).is_absolute() else RECIPES / plan_recipes
    available = sorted(p.stem for p in folder.glob("*.yaml") if _trains_on_generated_data(p))
    unknown = [f for f in wanted if f not in available and f != "draft_lm"]
    if unknown or not wanted:
        raise DraftsmithError(
            f"--families {','.join(unknown) or '(none)'}: not a family with a recipe in {folder}; "
            f"choose from {', '.join([*available, 'draft_lm'])}"
        )
    return [f for f in wanted if f != "draft_lm"], "draft_lm" in wanted


def scaled_runs(families: list[str], plan: Plan, info: TargetInfo) -> tuple[dict[str, FitRun], list[str]]:
    """Per family, what is scaled to the target (a draft vocabulary at most half the target's), and why."""
    runs, why = {}, []
    for name in families:
        args = load_recipe(plan.recipe(name))["model"].get("init_args", {})
        size = args.get("draft_vocab_size")
        if size and size > info.vocab // 2:
            runs[name] = FitRun(model={"draft_vocab_size": info.vocab // 2})
            why.append(f"{name}: draft vocabulary {info.vocab // 2} (recipe {size}; the target has {info.vocab})")
    return runs, why


def check_families(plan: Plan, target: targets.ResolvedTarget, runs: dict[str, FitRun]) -> None:
    """Build each family's module on the target before any data is made, so a family the target cannot feed is
    refused in one line now rather than after the data."""
    from jsonargparse import ArgumentParser
    from lightning.pytorch import LightningModule

    from draftsmith.train.fit import configure

    for name in plan.drafters:
        config = configure(plan.recipe(name), replace(runs.get(name, FitRun()), target=str(target)))
        parser = ArgumentParser(exit_on_error=False)
        parser.add_subclass_arguments(LightningModule, "model")
        try:
            parser.instantiate_classes(parser.parse_object({"model": config["model"]}))
        except Exception as e:  # noqa: BLE001 - jsonargparse wraps the family's own refusal
            cause = user_error(e)
            if cause is None:
                raise
            raise DraftsmithError(f"--families {name}: {cause}") from None


def stage_devices(device: Device, engine: EngineChoice) -> str:
    """Where each stage runs and the fits' precision, in one line (the pipeline's and the quickstart's first lines):
    generation (with ``engine``: ``data.engines.generation_engine``'s choice), the feature cache and the verifier on
    ``device``'s torch device; the fits on all of its devices (DDP over more than one GPU; the acceptance head on
    one)."""
    where = device.torch
    fits = f"{where} × {device.devices} ({device.name})" if device.accelerator == "gpu" else where
    ddp = f" (DDP over {device.devices} GPUs; the acceptance head on one)" if device.devices > 1 else ""
    return (
        f"generation on {where} ({engine.describe()}), feature cache on {where}, fits on {fits} in "
        f"{device.precision}{ddp}, verifier on {where}"
    )


def device_choice(device: Device) -> None:
    """Print the device chosen and where each stage runs (``stage_devices``)."""
    print(f"  device {device.describe()} (--device)")
    print(f"  stages: {stage_devices(device, generation_engine(device.torch))}")
