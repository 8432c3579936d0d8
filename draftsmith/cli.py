"""The ``draftsmith`` command: a table of subcommands; each one's logic lives in its own module."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from draftsmith.errors import user_error


def target_build(out: Path | None = None, fast: bool = False, force: bool = False) -> Path:
    """Build the embedded default target (tokenizer + small Llama trained on the stdlib's source).

    Args:
        out: where to save it (default: the cache, keyed by the build config).
        fast: the seconds-long test build instead of the default.
        force: rebuild even if a build exists.
    """
    from draftsmith.targets import default as default_target

    config = default_target.FAST if fast else default_target.TargetBuildConfig()
    path = default_target.build(config, out, force)
    print(path)
    return path


def _commands() -> dict:
    from draftsmith.data.datastore import build_datastore
    from draftsmith.data.feature_cache import cache_features
    from draftsmith.data.generate import generate
    from draftsmith.data.packed import pack_corpus
    from draftsmith.eval.compare import report
    from draftsmith.eval.score import score
    from draftsmith.export.imports import import_drafter
    from draftsmith.export.registry import export
    from draftsmith.families.sorted_draft_lm.module import export_subnetwork
    from draftsmith.pipeline.local import pipeline
    from draftsmith.pipeline.quickstart import quickstart
    from draftsmith.pipeline.slurm.status import status as slurm_status
    from draftsmith.pipeline.slurm.submit import pipeline as slurm_pipeline
    from draftsmith.pipeline.slurm.submit import submit as slurm_submit
    from draftsmith.train.crossvocab import xvocab
    from draftsmith.train.judge import judge
    from draftsmith.train.tlt import tlt

    return {
        "target": {"build": target_build},
        "generate": generate,
        "features": cache_features,
        "pack": pack_corpus,
        "datastore": build_datastore,
        "score": score,
        "judge": judge,
        "xvocab": xvocab,
        "tlt": tlt,
        "report": report,
        "export": export,
        "s2d": {"export": export_subnetwork},
        "import": import_drafter,
        "pipeline": pipeline,
        "quickstart": quickstart,
        "slurm": {"submit": slurm_submit, "pipeline": slurm_pipeline, "status": slurm_status},
    }


LIST_FLAGS = (
    "--layers",
    "--drafter",
    "--runs",
    "--scores",
    "--recipes",
    "--fit_set",
    "--generate_set",
    "--score_set",
    "--stages",
    "--families",
)
"""Flags taking several values: ``--drafter a b`` and ``--drafter a --drafter b`` both give [a, b]."""
POSITIONAL = {
    "pack": "--data",
    "datastore": "--data",
    "report": "--runs",
    "slurm status": "--run_dir",
    "export": "--src",
    "import": "--src",
}
"""Subcommands whose leading bare arguments fill a flag: ``draftsmith report RUN_DIR...``."""
ALIASES = {"slurm": {"--config": "--recipes", "--set": "--fit_set"}}
"""Flags spelled as the user knows them from ``fit`` (jsonargparse reserves a parameter named ``config``)."""


def _gather_lists(argv: list[str]) -> list[str]:
    out, lists, i = [], {}, 0
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        flag = flag.replace("-", "_").replace("__", "--", 1) if flag.startswith("--") else flag
        if flag not in LIST_FLAGS:
            out.append(argv[i])
            i += 1
            continue
        if flag not in lists:
            lists[flag] = []
            out.append(flag)
        if eq:
            lists[flag].append(value)
        i += 1
        while i < len(argv) and not argv[i].startswith("-"):
            lists[flag].append(argv[i])
            i += 1
    result = []
    for arg in out:
        if arg in lists:
            values = lists[arg]
            joined = values[0] if len(values) == 1 and values[0].startswith("[") else json.dumps(values)
            result.append(f"{arg}={joined}")
        else:
            result.append(arg)
    return result


def _normalize(argv: list[str]) -> list[str]:
    """Accept ``--max-new-tokens`` for ``--max_new_tokens``, ``-k`` for ``--k``, bare ``--flag`` for ``--flag=true``,
    and several values after a list flag."""
    for name, flag in POSITIONAL.items():
        n = len(name.split())
        if argv[:n] == name.split() and len(argv) > n and not argv[n].startswith("-"):
            argv = [*argv[:n], flag, *argv[n:]]
            break
    aliases = ALIASES.get(argv[0], {}) if argv else {}
    argv = [aliases.get(flag, flag) + eq + value for flag, eq, value in (a.partition("=") for a in argv)]
    argv = _gather_lists(argv)
    out = []
    for i, arg in enumerate(argv):
        if arg == "-k":
            arg = "--k"
        elif arg.startswith("--") and not arg.startswith("--print_") and arg not in ("--help",):
            name, eq, value = arg[2:].partition("=")
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            bare = not eq and (nxt is None or (nxt.startswith("-") and not nxt.lstrip("-").replace(".", "").isdigit()))
            arg = "--" + name.replace("-", "_") + (eq + value if eq else ("=true" if bare else ""))
        out.append(arg)
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "fit":
            from draftsmith.train.cli import fit_main

            fit_main(argv[1:])
            return
        from jsonargparse import CLI

        CLI(_commands(), args=_normalize(argv), as_positional=False)
    except KeyboardInterrupt:
        print("draftsmith: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - a user mistake may arrive wrapped by jsonargparse / Lightning
        cause = user_error(e)
        if cause is None:
            raise
        print(f"draftsmith: error: {cause}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
