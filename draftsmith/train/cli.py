"""``draftsmith fit``: LightningCLI over any ``DrafterModule`` and datamodule (``GeneratedDataModule`` by default)."""

from __future__ import annotations

import os
import shlex
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import lightning as L
from jsonargparse import Namespace
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from draftsmith.core.files import Stopwatch
from draftsmith.core.machine import resolve_trainer
from draftsmith.core.manifest import write_manifest
from draftsmith.core.yaml_file import read_yaml
from draftsmith.errors import DraftsmithError
from draftsmith.families.registry import check_moved
from draftsmith.layers.module import DrafterModule

ROOT = "${trainer.default_root_dir}"
"""A logger ``save_dir`` of this value is replaced by the trainer's ``default_root_dir``."""


class ResumableModelCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` that keeps its best score across a resume. Each resumed fit logs into a new version dir
    (``csv/version_N/checkpoints``), and Lightning reloads a checkpoint callback's scores only when the dir is
    unchanged: the first validation after a resume became "best" whatever its score, and the fit's best
    checkpoint could be worse than one saved before the interruption. The earlier dirs' files are kept."""

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict({**state_dict, "dirpath": self.dirpath})


class TimedLastCheckpoint(ResumableModelCheckpoint):
    """``last.ckpt`` every ``minutes`` of training as well: the monitored checkpoint writes it at validations only,
    which a CPU fit reaches every 200 steps (15-40 minutes on 2 cores), so a fit killed between them lost that much.
    It writes the same ``last.ckpt`` (no version counter on either) and keeps no other file."""

    def __init__(self, minutes: float = 10.0) -> None:
        super().__init__(
            train_time_interval=timedelta(minutes=minutes), save_top_k=0, save_last=True, enable_version_counter=False
        )


def newest(root: str | Path, name: str) -> Path | None:
    """The newest file called ``name`` under the run dir ``root`` (each resumed fit logs into a new
    ``csv/version_N/checkpoints``)."""
    found = sorted(Path(root).glob(f"**/{name}"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


class ResumeHint(L.Callback):
    """Says, when a fit is interrupted (Ctrl-C), the command that resumes it: Lightning said only "attempting
    graceful shutdown"."""

    def __init__(self, command: str | None) -> None:
        self.command = command

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, KeyboardInterrupt) or not trainer.is_global_zero:
            return
        print(resume_hint(trainer.default_root_dir, self.command), file=sys.stderr)


VALIDATION_SECONDS = "validation_seconds.json"
"""Beside a fit's checkpoints (its run dir): the wall seconds its validations took, sanity check included (``ValidationClock``)."""


class ValidationClock(L.Callback):
    """Wall seconds spent validating, added up across a fit's sessions into ``VALIDATION_SECONDS`` in its run dir: a
    validation runs the target online over the held-out rows and unrolls the drafter from every position
    (``val/tau_est``), so a short fit that validates 4 times spent most of its minutes there (issue 86's 50k fits,
    under load: ~15 of 19), and a trainer's tokens/s is fair to compare with the peers' (which validate otherwise or
    not at all) only with it apart (``train.recorded.recorded_fit``)."""

    watch: Stopwatch | None = None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and trainer.is_global_zero:  # not ``trainer.validate`` alone
            self.watch = Stopwatch(Path(trainer.default_root_dir) / VALIDATION_SECONDS, every=None).__enter__()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.watch is not None:
            self.watch.__exit__(None, None, None)
            self.watch = None


def resume_hint(root: str | Path, command: str | None) -> str:
    """What resumes the fit in run dir ``root`` that ``command`` started (None: a fit from Python)."""
    last = newest(root, "last.ckpt")
    if last is None:
        return f"draftsmith fit: interrupted before its first last.ckpt in {root}: nothing to resume from"
    again = f"{command} --ckpt_path last.ckpt" if command else "FitRun(resume=True) (train.fit.fit)"
    return f"draftsmith fit: interrupted; its newest checkpoint is {last}; resume with: {again}"


CALLBACKS = [
    {
        "class_path": "draftsmith.train.cli.ResumableModelCheckpoint",
        "init_args": {
            "monitor": "val/tau_est",
            "mode": "max",
            "save_last": True,
            "filename": "best",
            "enable_version_counter": False,  # last.ckpt is also TimedLastCheckpoint's: one file, not last-v1.ckpt
        },
    },
    {"class_path": "lightning.pytorch.callbacks.LearningRateMonitor", "init_args": {"logging_interval": "step"}},
    {"class_path": "draftsmith.train.cli.TimedLastCheckpoint", "init_args": {"minutes": 10.0}},
]

LOGGERS = [
    {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": ROOT, "name": "csv"}},
    {"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {"save_dir": ROOT, "project": "draftsmith"}},
]


TEXT_PROGRESS_BAR = "lightning.pytorch.callbacks.TQDMProgressBar"
"""The progress bar of a fit whose output is not a terminal (a log file, nohup, SLURM): Lightning's default where
``rich`` is installed, the rich bar, draws nothing there, so a long fit's log showed no step count or time left."""


class DraftsmithCLI(LightningCLI):
    """LightningCLI with draftsmith's trainer defaults: best-by-``val/tau_est`` and last checkpoints,
    CSV + wandb (offline unless ``WANDB_MODE`` says otherwise) logs under ``default_root_dir``,
    gradient clipping 1.0; the accelerator, devices and precision the recipe leaves to the device decided by
    ``core.machine.resolve_trainer``."""

    def __init__(self, *args, recipe: str | None = None, command: str | None = None, **kwargs) -> None:
        self.recipe, self.command = recipe, command
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.set_defaults(
            {
                "trainer.callbacks": CALLBACKS,
                "trainer.logger": LOGGERS,
                "trainer.gradient_clip_val": 1.0,
                "trainer.log_every_n_steps": 10,
                # ``data`` may name any datamodule (e.g. CorpusDataModule for pre-training); a recipe's
                # plain ``data: {train: ...}`` section is GeneratedDataModule's
                "data": {"class_path": "draftsmith.train.data.GeneratedDataModule"},
            }
        )

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        chosen = resolve_trainer({k: config.trainer[k] for k in ("accelerator", "devices", "precision")})
        for key, value in chosen.items():  # the device's choices, made before Lightning sees them
            config.trainer[key] = value
        root = config.trainer.default_root_dir or "."
        loggers = config.trainer.logger
        for logger in loggers if isinstance(loggers, list) else []:
            args = getattr(logger, "init_args", None)
            if args is not None and getattr(args, "save_dir", None) == ROOT:
                args.save_dir = root
        if self.subcommand:  # a CLI built to validate or to read a config (run=False) has no --ckpt_path
            config.ckpt_path = checkpoint_in_run(config.get("ckpt_path"), root)
        if root != ".":
            os.makedirs(root, exist_ok=True)
        callbacks = config.trainer.callbacks
        if (
            not sys.stdout.isatty()
            and config.trainer.enable_progress_bar is not False
            and isinstance(callbacks, list)
            and not any("ProgressBar" in str(getattr(c, "class_path", "")) for c in callbacks)
        ):
            every = config.trainer.log_every_n_steps or 1  # drawn when values are logged: no host sync a step
            callbacks.append(Namespace(class_path=TEXT_PROGRESS_BAR, init_args=Namespace(refresh_rate=every)))

    def before_fit(self) -> None:
        """The run's manifest (command, git SHA, versions, target fingerprint, seed) beside its checkpoints."""
        from draftsmith.train.data import ResumesMidEpoch

        if isinstance(self.datamodule, ResumesMidEpoch):  # Lightning warns that the epoch's order restarts: not ours
            warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
        self.trainer.callbacks += [ResumeHint(self.command), ValidationClock()]
        if self.trainer.is_global_zero:
            config = self.config[self.subcommand] if self.subcommand else self.config
            write_manifest(
                self.trainer.default_root_dir,
                target=self.model.target.fingerprint,
                seed=config.get("seed_everything"),
                recipe=self.recipe,
            )


def checkpoint_in_run(ckpt: str | None, root: str | Path) -> str | None:
    """``--ckpt_path`` as a file: a bare name that is no file here (``last.ckpt``, as docs/usage.md writes it) is
    the newest one of that name in the run dir ``root``. Checked before the target is loaded and the manifest
    written: ``last.ckpt`` was "Checkpoint file not found" after both, the manifest rewritten with the failed
    command."""
    if ckpt is None or ckpt in ("last", "best", "hpc", "registry") or Path(ckpt).exists():
        return ckpt
    found = newest(root, ckpt) if Path(ckpt).name == ckpt else None
    if found is None:
        raise DraftsmithError(
            f"--ckpt_path {ckpt}: no such file here nor under the run dir {root} (--trainer.default_root_dir)"
        )
    print(f"draftsmith fit: resuming from {found}", file=sys.stderr)
    return str(found)


def _command(args: list[str]) -> str:
    """The ``draftsmith fit`` command line of ``args`` without its ``--ckpt_path``."""
    kept, skip = [], False
    for arg in args:
        if skip or arg.startswith("--ckpt_path"):
            skip = arg == "--ckpt_path"  # its value is the next argument
            continue
        kept.append(arg)
    return shlex.join(["draftsmith", "fit", *kept])


def check_configs(args: list[str]) -> None:
    """Each ``--config FILE`` of a ``fit`` command line exists, or one line naming it (Lightning printed 30 lines of
    usage before the one that said so)."""
    for i, arg in enumerate(args):
        path = args[i + 1] if arg == "--config" and i + 1 < len(args) else arg.removeprefix("--config=")
        inline = path.lstrip().startswith("{") or "\n" in path or ": " in path  # jsonargparse takes YAML text too
        if (arg == "--config" or arg.startswith("--config=")) and not inline:
            if not Path(path).is_file():
                raise DraftsmithError(f"fit --config {path}: no such file")
            try:
                config = read_yaml(path)  # a key given twice: jsonargparse would keep the last silently
            except DraftsmithError as e:
                raise DraftsmithError(f"fit --config {e}") from None
            check_moved(config, f"fit --config {path}")


def fit_main(args: list[str] | dict, recipe: str | None = None) -> DraftsmithCLI:
    """Run ``fit`` through ``DraftsmithCLI`` on command-line ``args`` (the CLI edge) or a config dict
    (``train.fit.fit``); returns it (``.trainer``, ``.model``). ``recipe``: recorded in the manifest."""
    if isinstance(args, list):
        check_configs(args)
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    warnings.filterwarnings("ignore", message=".*isinstance.treespec, LeafSpec.*")
    # LightningCLI seeds every run (seed_everything: true -> 0, recorded in the manifest); the first run of a process
    # also said so on stderr, a second line beside a user mistake's one line
    warnings.filterwarnings("ignore", message="No seed found, seed set to")
    import wandb

    before, failed = wandb.run, True
    try:
        cli = DraftsmithCLI(
            DrafterModule,
            L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_kwargs={"overwrite": True},
            args=["fit", *args] if isinstance(args, list) else {"subcommand": "fit", "fit": args},
            recipe=recipe,
            command=_command(args) if isinstance(args, list) else None,
        )
        failed = False
        return cli
    finally:  # close the run this fit opened, failed or not: a later fit in this process would log into it
        if wandb.run is not None and wandb.run is not before:
            wandb.finish(exit_code=1 if failed else 0)
