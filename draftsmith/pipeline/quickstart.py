"""``draftsmith quickstart``: the pipeline (``pipeline.local``) on a built-in target (``default``: the embedded toy;
``smollm2``: SmolLM2-135M-Instruct, a real pretrained LLM) with that target's plan (``train.suite.PLANS``).

Stages (each one's artifact under ``out`` is reused while its manifest records the same inputs, so a re-run is fast):
target → on-policy data (``data/train`` sampled, ``data/val`` greedy on held-out prompts)
→ train EAGLE-3, EAGLE-1, Medusa-1 and Hydra++ (``fit/<name>``, best checkpoint exported to
``drafters/<name>``), a distilled draft LM (``drafters/draft_lm``) and a SpecDec++ acceptance
head on EAGLE-1 (``drafters/eagle1-head``)
→ score every drafter and the baselines with the verifier at the plan's K (``score/k<K>``) and ``--k auto``
(``score/auto``, with RASD's fused drafter over the fastest trained tree drafter and the training data's datastore)
→ rank every drafter by measured speed with how an engine serves it, the fastest servable one's command first;
export the fastest trained drafter for serving (``export/<name>``, the engine format its family has), or say
plainly that none beats plain decoding
→ the comparison report with plots (``report/``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from draftsmith import targets
from draftsmith.core.machine import local_device
from draftsmith.errors import DraftsmithError
from draftsmith.pipeline.choices import device_choice, inspect_target
from draftsmith.pipeline.runner import run_pipeline
from draftsmith.targets import default as default_target
from draftsmith.train.suite import FAST, PLANS

DEMO = targets.TargetSpec("demo")
"""The quickstart's target unless told another."""


def _target_dir(target: str, fast: bool) -> Path:
    """The built-in ``target``'s directory, built or converted on first use; prints what it is."""
    if target in ("default", "demo"):
        config = {"default": default_target.TargetBuildConfig(), "demo": default_target.DEMO}[target]
        path = default_target.build(default_target.FAST if fast else config)
        build = json.loads((path / "build.json").read_text())
        shape = build["config"]["target"]
        print(
            f"  {path}: {shape['layers']} layers, hidden {shape['hidden']}, held-out perplexity "
            f"{build['target']['heldout_ppl']} (unigram {build['unigram_heldout_ppl']}), "
            f"{build['target']['params'] / 1e6:.1f}M parameters"
        )
        return path
    path = targets.resolve(target)
    fp = json.loads((path / "convert.json").read_text())["fingerprint"]
    print(
        f"  {path}: {fp['model_type']}, {fp['num_layers']} layers, hidden {fp['hidden_size']}, vocab {fp['vocab_size']}"
    )
    return path


def quickstart(
    out: Path | None = None,
    fast: bool = False,
    k: int = 4,
    target: targets.TargetSpec = DEMO,
    device: str = "auto",
) -> Path:
    """Build (or reuse) a built-in target, generate on-policy data, train every drafter family, score them all
    at several draft lengths, and write the comparison report with plots to ``out/report``.

    Args:
        out: run directory (default ``runs/quickstart``, ``runs/quickstart-<target>`` for other targets); every
            stage's artifact is reused when present.
        fast: tiny budgets everywhere (for tests and smoke runs).
        k: tokens drafted per round in the main table (also scored: the plan's other K).
        target: ``demo`` (the embedded target in a real LLM's deep, narrow shape, where a one-layer drafter costs a
            few percent of a step; minutes), ``default`` (its 4-layer shape, where every drafter costs a third of a
            step) or ``smollm2`` (SmolLM2-135M-Instruct, about an hour on 2 CPU cores), optionally ``:DTYPE``, with
            ``--dtype`` (``auto``: its released one, bf16 for ``smollm2``, in bf16 only where this machine multiplies
            it natively); resolved here once the device is chosen.
        device: where every stage runs: ``auto`` (a CUDA GPU when there is one, the fits on every local GPU; else
            the CPU), ``cpu`` (forced) or ``cuda`` (refused without a GPU); ``draftsmith pipeline --help`` says more.
    """
    chosen = local_device(device)  # a device this machine cannot give: one line before any work
    if target.source not in PLANS:
        raise DraftsmithError(
            f"quickstart: --target must be one of {', '.join(PLANS)}, got {target.source!r} "
            "(draftsmith pipeline --target DIR runs the same stages on any causal LM)"
        )
    name = target.source
    plan = PLANS[name]
    out = Path(out or ("runs/quickstart" if name == "demo" else f"runs/quickstart-{name}"))
    budget = FAST if fast else plan.budget
    print(f"quickstart: the pipeline on the built-in target {name!r}")
    device_choice(chosen)
    target_dir = _target_dir(name, fast)
    resolved = inspect_target(target, chosen.torch, target_dir).target  # once, for every stage
    if resolved.dtype != targets.checkpoint_dtype(targets.TargetSpec(str(target_dir)), target_dir):
        plan = replace(plan, dtype=resolved.dtype)
    print(f"  computing in {resolved.dtype}")
    return run_pipeline(resolved, plan, out, budget, fast, k, record={"quickstart": name}, device=chosen)
