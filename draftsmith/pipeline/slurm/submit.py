"""``draftsmith slurm submit`` (a ``fit`` as a batch job) and ``draftsmith slurm pipeline`` (generate ->
fit -> score -> export as jobs chained with ``--dependency=afterok``).

The rendered scripts are kept in the run dir, and ``jobs.json`` there records every submission (job
id, script, dependencies, command line, git SHA), so ``draftsmith slurm status RUN_DIR`` can follow them.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import yaml

from draftsmith.core.manifest import git_sha
from draftsmith.errors import DraftsmithError
from draftsmith.pipeline.slurm import sbatch
from draftsmith.pipeline.slurm.render import command, render, template_path
from draftsmith.pipeline.slurm.resources import Resources, validate
from draftsmith.pipeline.stages import SLURM_JOBS
from draftsmith.train.fit import recipe_path

RECORD = "jobs.json"
"""Submissions of a run dir, oldest first."""
STAGES = SLURM_JOBS
"""The pipeline stages submitted as jobs (``pipeline.stages``: one list with the local pipeline's)."""
REQUEUE_CALLBACK = "draftsmith.pipeline.slurm.requeue.RequeueOnSignal"


def _draftsmith() -> str:
    """This interpreter running draftsmith: the job uses the same environment as the submission."""
    return command([sys.executable, "-m", "draftsmith.cli"])


def _flags(settings: list[str] | None, what: str) -> list[str]:
    """``key=value`` settings as ``--key=value`` flags."""
    out = []
    for item in settings or []:
        key, eq, _ = item.partition("=")
        if not eq or not key or key.startswith("-"):
            raise DraftsmithError(f"--{what} {item!r}: write settings as key=value (e.g. trainer.max_steps=100)")
        out.append("--" + item)
    return out


def _recipes(recipes: list[str]) -> list[Path]:
    if not recipes:
        raise DraftsmithError("--config: give at least one recipe (e.g. --config configs/eagle3.yaml)")
    paths = [recipe_path(r).absolute() for r in recipes]  # a file, or a shipped recipe's name (eagle3, smollm2/eagle3)
    for path in paths:
        try:
            yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise DraftsmithError(f"--config {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    return paths


def _default_run_dir(recipes: list[Path]) -> Path:
    """The last recipe's ``trainer.default_root_dir``."""
    root = None
    for path in recipes:
        trainer = (yaml.safe_load(path.read_text()) or {}).get("trainer") or {}
        root = trainer.get("default_root_dir", root)
    if root is None:
        raise DraftsmithError("--run-dir: none given and no recipe sets trainer.default_root_dir")
    return Path(root)


def _record(run_dir: Path, name: str, job_id: str, script: Path, after: list[str]) -> None:
    path = run_dir / RECORD
    jobs = json.loads(path.read_text()) if path.is_file() else []
    jobs.append(
        {
            "name": name,
            "job_id": job_id,
            "script": script.name,
            "script_sha256": hashlib.sha256(script.read_bytes()).hexdigest(),
            "after": after,
            "submitted": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": shlex.join(["draftsmith", *sys.argv[1:]]),
            "git": git_sha(),
        }
    )
    path.write_text(json.dumps(jobs, indent=2) + "\n")


def _common(r: Resources, name: str, run_dir: Path) -> dict[str, object]:
    return {
        "job_name": f"draftsmith-{name}",
        "nodes": r.nodes,
        "tasks_per_node": r.tasks,
        "time": r.time,
        "signal_s": r.signal_s,
        "run_dir": run_dir,
        "workdir": Path.cwd(),
        "options": r.options(),
        "draftsmith": _draftsmith(),
    }


def fit_command(recipes: list[Path], run_dir: Path, r: Resources, fit_set: list[str] | None) -> list[str]:
    """The ``draftsmith fit`` arguments of a job: recipes, run dir, ranks, the requeue callback, overrides."""
    return [
        *(f"--config={p}" for p in recipes),
        f"--trainer.default_root_dir={run_dir}",
        f"--trainer.accelerator={r.accelerator}",
        f"--trainer.devices={r.tasks}",
        f"--trainer.num_nodes={r.nodes}",
        f"--trainer.callbacks+={REQUEUE_CALLBACK}",
        *_flags(fit_set, "set"),
    ]


def _fit_script(recipes: list[Path], fit_dir: Path, r: Resources, fit_set: list[str] | None, log_dir: Path) -> str:
    template = template_path("fit" if r.nodes == 1 else "fit_multinode")
    values = _common(r, "fit", log_dir) | {"fit_args": command(fit_command(recipes, fit_dir, r, fit_set))}
    return render(template, values)


def _submit(run_dir: Path, name: str, text: str, after: list[str]) -> str:
    script = run_dir / f"{name}.sbatch"
    script.write_text(text)
    job_id = sbatch.submit(script, after)
    _record(run_dir, name, job_id, script, after)
    return job_id


def submit(
    recipes: list[str],
    time: str,
    nodes: int = 1,
    gpus_per_node: int = 1,
    tasks_per_node: int | None = None,
    cpus_per_task: int | None = None,
    partition: str | None = None,
    account: str | None = None,
    run_dir: Path | None = None,
    fit_set: list[str] | None = None,
    signal_s: int = 90,
    dry_run: bool = False,
) -> str | None:
    """Submit ``draftsmith fit`` as a SLURM batch job (one task per GPU; checkpoint + requeue near the limit).

    Renders ``pipeline/slurm/templates/fit.sbatch`` (``pipeline/slurm/templates/fit_multinode.sbatch`` for several nodes) into the run dir,
    submits it with ``sbatch`` and prints the job id. A requeued job resumes from its checkpoint.

    Args:
        recipes: ``--config`` recipes, in order (e.g. ``configs/eagle3.yaml configs/strategy/ddp.yaml``).
        time: time limit, ``HH:MM:SS`` (or any SLURM form: ``MM``, ``D-HH:MM:SS``, ...).
        nodes: nodes.
        gpus_per_node: GPUs per node (0: CPU processes, DDP over gloo).
        tasks_per_node: processes per node (default: one per GPU, 1 on CPU).
        cpus_per_task: CPU cores per process (default: the partition's).
        partition: SLURM partition (checked with ``sinfo``).
        account: SLURM account.
        run_dir: the trainer's ``default_root_dir``, which also keeps the script, logs and ``jobs.json``
            (default: the recipe's ``trainer.default_root_dir``).
        fit_set: ``draftsmith fit`` settings as ``key=value`` (``--set trainer.max_steps=1000``).
        signal_s: SIGUSR1 comes this many seconds before the time limit (``--signal=USR1@<s>``).
        dry_run: print the script instead of submitting it.

    Returns:
        The job id (None with ``--dry-run``).
    """
    r = Resources(time, nodes, gpus_per_node, tasks_per_node, cpus_per_task, partition, account, signal_s)
    paths = _recipes(recipes)
    fit_dir = Path(run_dir or _default_run_dir(paths)).resolve()
    validate(r, check_cluster=not dry_run)
    text = _fit_script(paths, fit_dir, r, fit_set, fit_dir)
    if dry_run:
        print(text, end="")
        return None
    fit_dir.mkdir(parents=True, exist_ok=True)
    job_id = _submit(fit_dir, "fit", text, [])
    print(job_id)
    return job_id


def _generate_script(
    r: Resources, run_dir: Path, name: str, target: str, prompts: str, out: Path, settings: list[str]
) -> str:
    """One generate task per GPU (``--engine hf``), or per ``tensor_parallel_size`` GPUs (``--engine vllm``: each
    task's vLLM sees its own GPUs through ``CUDA_VISIBLE_DEVICES``)."""
    args = [f"--target={target}", f"--prompts={prompts}", f"--out={out}", *settings]
    given = dict(a.removeprefix("--").replace("-", "_").partition("=")[::2] for a in settings)
    rank_setup = ""
    if given.get("engine") == "vllm" and r.gpus_per_node:
        tp = int(given.get("tensor_parallel_size", 1))
        if tp < 1 or r.gpus_per_node % tp:
            raise DraftsmithError(
                f"--generate-set tensor_parallel_size={tp}: must divide --gpus-per-node {r.gpus_per_node}"
            )
        r = replace(r, tasks_per_node=r.gpus_per_node // tp)
        rank_setup = (
            f"export CUDA_VISIBLE_DEVICES=$(seq -s, $((SLURM_LOCALID * {tp})) $((SLURM_LOCALID * {tp} + {tp - 1}))); "
        )
    values = _common(r, name, run_dir) | {
        "generate_args": command(args),
        "rank_setup": rank_setup,
        "rank_device": "auto" if rank_setup else "cuda:$SLURM_LOCALID" if r.gpus_per_node else "cpu",
        "merge_device": "auto" if r.gpus_per_node else "cpu",
    }
    return render(template_path("generate"), values)


def _step_script(r: Resources, run_dir: Path, name: str, fit_dir: Path, commands: list[str]) -> str:
    one = Resources(r.time, 1, min(r.gpus_per_node, 1), 1, r.cpus_per_task, r.partition, r.account, r.signal_s)
    values = _common(one, name, run_dir) | {"fit_dir": command([fit_dir]), "commands": "\n".join(commands)}
    return render(template_path("step"), values)


def pipeline(
    target: str,
    run_dir: Path,
    recipes: list[str],
    time: str,
    train_prompts: str = "builtin:train",
    val_prompts: str = "builtin:heldout",
    generate_set: list[str] | None = None,
    fit_set: list[str] | None = None,
    score_set: list[str] | None = None,
    export_to: str = "native",
    stages: list[str] | None = None,
    nodes: int = 1,
    gpus_per_node: int = 1,
    tasks_per_node: int | None = None,
    cpus_per_task: int | None = None,
    partition: str | None = None,
    account: str | None = None,
    signal_s: int = 90,
    dry_run: bool = False,
) -> dict[str, str]:
    """Submit generate -> fit -> score -> export as SLURM jobs, each starting when the previous succeeded.

    Layout of ``run_dir``: ``data/train`` and ``data/val`` (generate: sampled training data and greedy
    validation data, both prompts sharded over all ranks), ``fit/`` (the trainer's root:
    checkpoints, CSV/wandb logs), ``score/`` (the verifier's report on the last checkpoint),
    ``export/<format>``; plus each stage's ``.sbatch``, its ``slurm-*.out`` log and ``jobs.json``.

    Args:
        target: the target model directory (``generate``/``score`` ``--target``, the recipe's ``model.init_args.target``).
        run_dir: where the pipeline writes everything.
        recipes: ``fit --config`` recipes, in order.
        time: time limit of each job (``HH:MM:SS``).
        train_prompts: prompts of the training data.
        val_prompts: prompts of the validation data (greedy continuations).
        generate_set: ``draftsmith generate`` settings as ``key=value`` (both datasets), e.g. ``max_new_tokens=256``.
        fit_set: ``draftsmith fit`` settings as ``key=value``.
        score_set: ``draftsmith score`` settings as ``key=value``, e.g. ``num_prompts=50 k=6``.
        export_to: the export stage's format.
        stages: which of generate, fit, score, export to submit (default: all); chained in that order.
        nodes: nodes of the generate and fit jobs (score and export run one process).
        gpus_per_node: GPUs per node (0: CPU processes).
        tasks_per_node: processes per node (default: one per GPU, 1 on CPU).
        cpus_per_task: CPU cores per process.
        partition: SLURM partition (checked with ``sinfo``).
        account: SLURM account.
        signal_s: the fit job's SIGUSR1 comes this many seconds before its time limit.
        dry_run: print the scripts instead of submitting them.

    Returns:
        Job ids by job name (``generate-train``, ``generate-val``, ``fit``, ``score``, ``export``).
    """
    stages = list(stages or STAGES)
    unknown = [s for s in stages if s not in STAGES]
    if unknown or len(set(stages)) != len(stages):
        raise DraftsmithError(f"--stages {stages}: give each of {', '.join(STAGES)} at most once")
    r = Resources(time, nodes, gpus_per_node, tasks_per_node, cpus_per_task, partition, account, signal_s)
    paths = _recipes(recipes)
    run_dir = Path(run_dir).resolve()
    validate(r, check_cluster=not dry_run)
    data, fit_dir = run_dir / "data", run_dir / "fit"
    gen = _flags(generate_set, "generate-set")
    fit_set = [
        f"model.init_args.target={target}",
        f"data.train={data / 'train'}",
        f"data.val={data / 'val'}",
        *(fit_set or []),
    ]
    # "$CKPT" stays unquoted by shlex: the step script sets it to the fit stage's newest last.ckpt
    score_args = ["score", f"--target={shlex.quote(target)}", '--drafter=drafter="$CKPT"']
    score_args += ["--device=cuda"] if r.gpus_per_node else []  # the step's GPU (--score-set device=... wins)
    score = command([f"--out={run_dir / 'score'}", *_flags(score_set, "score-set")])
    export_args = [f"--to={export_to}", f"--out={run_dir / 'export' / export_to}", f"--target={target}", "--overwrite"]
    if "score" in stages:  # the model card carries the verifier's scores
        export_args += [f"--scores={run_dir / 'score' / 'report.json'}", "--score-name=drafter"]
    export = command(export_args)
    scripts = {
        "generate-train": _generate_script(r, run_dir, "generate-train", target, train_prompts, data / "train", gen),
        "generate-val": _generate_script(
            r, run_dir, "generate-val", target, val_prompts, data / "val", [*gen, "--temperature=0"]
        ),
        "fit": _fit_script(paths, fit_dir, r, fit_set, run_dir),
        "score": _step_script(r, run_dir, "score", fit_dir, [f"{_draftsmith()} {' '.join(score_args)} {score}"]),
        "export": _step_script(r, run_dir, "export", fit_dir, [f'{_draftsmith()} export --src="$CKPT" {export}']),
    }
    chosen = [name for name in scripts if name.partition("-")[0] in stages]
    if dry_run:
        for name in chosen:
            print(f"# ---- {name}.sbatch ----\n{scripts[name]}")
        return {}
    run_dir.mkdir(parents=True, exist_ok=True)
    fit_dir.mkdir(exist_ok=True)
    jobs: dict[str, str] = {}
    previous: list[str] = []
    for stage in stages:
        names = [n for n in chosen if n.partition("-")[0] == stage]
        ids = [_submit(run_dir, name, scripts[name], previous) for name in names]
        jobs.update(zip(names, ids, strict=True))
        previous = ids
    for name, job_id in jobs.items():
        print(f"{name}\t{job_id}")
    return jobs
