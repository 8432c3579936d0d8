"""The ``draftsmith`` command: a table of subcommands; each one's logic lives in its own module."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import sys
import typing
from collections.abc import Callable
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


COMMANDS: dict = {
    "target": {"build": "draftsmith.cli:target_build"},
    "generate": "draftsmith.data.generate:generate",
    "features": "draftsmith.data.feature_cache:cache_features",
    "pack": "draftsmith.data.packed:pack_corpus",
    "datastore": "draftsmith.data.datastore:build_datastore",
    "score": "draftsmith.eval.score:score",
    "judge": "draftsmith.families.judge.train:judge",
    "xvocab": "draftsmith.families.xvocab.train:xvocab",
    "tlt": "draftsmith.families.eagle.tlt.train:tlt",
    "report": "draftsmith.eval.compare:report",
    "learning-curve": "draftsmith.train.learning_curve:write_curves",
    "export": "draftsmith.export.registry:export",
    "s2d": {"export": "draftsmith.families.s2d.module:export_subnetwork"},
    "import": "draftsmith.export.imports:import_drafter",
    "doctor": "draftsmith.pipeline.doctor:doctor",
    "pipeline": "draftsmith.pipeline.local:pipeline",
    "quickstart": "draftsmith.pipeline.quickstart:quickstart",
    "slurm": {
        "submit": "draftsmith.pipeline.slurm.submit:submit",
        "pipeline": "draftsmith.pipeline.slurm.submit:pipeline",
        "status": "draftsmith.pipeline.slurm.status:status",
    },
}
"""Subcommand -> ``module:function`` (or a group of them), imported only when run: importing every command's module
(torch, transformers, Lightning) took 5-6 s of a 2-core machine before ``--help`` or a refusal could answer."""


TARGET_DEFAULTS = {"draftsmith.families.eagle.tlt.train:tlt": ("default", "float32")}
"""Commands whose ``--target`` and ``--dtype`` have defaults (``tlt``: the default target, in float32: the adapter
trains in full precision); a ``TargetSpec`` default in the function's signature serves too (``quickstart``)."""
TARGET_DTYPE = (
    "the dtype the target computes in: float32, bfloat16, float16 or auto (the checkpoint's, in bf16 only where "
    "this machine multiplies it natively); default: the target's ``:DTYPE`` suffix, else auto."
)
"""``--dtype``'s help, for every command that takes a target."""


def _load(entry: str | dict) -> Callable | dict:
    if isinstance(entry, dict):
        return {name: _load(sub) for name, sub in entry.items()}
    module, name = entry.split(":")
    return _taking_target_text(getattr(importlib.import_module(module), name), entry)


def _taking_target_text(fn: Callable, entry: str) -> Callable:
    """``fn`` as its command runs it: where ``fn`` takes its ``target`` resolved (``ResolvedTarget``) or parsed
    (``TargetSpec``: the pipeline, which resolves it on the device it chooses), the command takes the user's
    ``--target`` text and ``--dtype`` (unless ``fn`` has a ``dtype`` of its own: ``features``' storage dtype; then
    the target's dtype is its ``:DTYPE`` suffix, decided quietly), turned into that object here, once: the one
    place a command's target string becomes a target (``auto`` decided for the command's ``--device``)."""
    from draftsmith.targets import TargetSpec, parse_target, resolve_target

    signature = inspect.signature(fn)
    annotation = signature.parameters["target"].annotation if "target" in signature.parameters else None
    if getattr(annotation, "__name__", str(annotation).rpartition(".")[2]) not in ("ResolvedTarget", "TargetSpec"):
        return fn
    hints = typing.get_type_hints(fn)
    kind = hints["target"]
    own_dtype = "dtype" in signature.parameters
    target_default, dtype_default = TARGET_DEFAULTS.get(entry, (inspect.Parameter.empty, None))
    params = [
        p.replace(annotation=str, default=str(p.default) if isinstance(p.default, TargetSpec) else target_default)
        if p.name == "target"
        else p.replace(annotation=hints.get(p.name, p.annotation))
        for p in signature.parameters.values()
    ]
    doc = fn.__doc__ or ""
    if not own_dtype:
        dtype = inspect.Parameter("dtype", inspect.Parameter.KEYWORD_ONLY, default=dtype_default, annotation=str | None)
        params.append(dtype)
        head, args, rest = doc.partition("\n    Args:\n")
        entries, blank, tail = rest.partition("\n\n")
        doc = f"{head}{args}{entries}\n        dtype: {TARGET_DTYPE}{blank}{tail}" if args else doc

    def command(**kwargs: object) -> object:
        text = kwargs.pop("target")
        dtype = None if own_dtype else kwargs.pop("dtype")
        if kind is TargetSpec:
            return fn(target=parse_target(text, dtype), **kwargs)
        device = kwargs.get("device", "cpu")
        if device == "auto":  # as the commands read it: CUDA where there is one
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        return fn(target=resolve_target(text, dtype, device, quiet=own_dtype), **kwargs)

    command.__name__, command.__qualname__, command.__module__ = fn.__name__, fn.__qualname__, fn.__module__
    command.__doc__ = doc
    command.__signature__ = signature.replace(parameters=params, return_annotation=hints.get("return", signature.empty))
    return command


def _described(entry: str | dict) -> Callable | dict:
    """A stand-in for ``entry`` that only carries its docstring, read from the source without importing it: what
    the subcommand list shows."""
    if isinstance(entry, dict):
        return {name: _described(sub) for name, sub in entry.items()}
    module, name = entry.split(":")
    source = Path(__file__).parent.joinpath(*module.split(".")[1:])
    source = source / "__init__.py" if source.is_dir() else source.with_suffix(".py")
    tree = ast.parse(source.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)

    def command() -> None:
        pass

    command.__doc__ = ast.get_docstring(node)
    return command


def _commands(argv: list[str]) -> dict:
    """The subcommand table for ``argv``: only the named subcommand's function imported; for ``--help``, no
    subcommand or an unknown one, every subcommand described (nothing imported); else (``--config FILE``) all."""
    name = argv[0] if argv else None
    if name in COMMANDS:
        return {name: _load(COMMANDS[name])}
    if name is None or name in ("-h", "--help") or not name.startswith("-"):
        return _described(COMMANDS)
    return _load(COMMANDS)


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
    "--studies",
)
"""Flags taking several values: ``--drafter a b`` and ``--drafter a --drafter b`` both give [a, b]."""
POSITIONAL = {
    "pack": "--data",
    "datastore": "--data",
    "report": "--runs",
    "slurm status": "--run_dir",
    "export": "--src",
    "import": "--src",
    "doctor": "--src",
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


def _one_line(prog: str, message: str) -> str:
    """jsonargparse's parse error (usage text, then ``Parser key "hours":\\n  Expected a <class 'float'>. Got value:
    abc``) as one line naming the subcommand and the flag: ``pipeline --hours: expected a float, got 'abc'``."""
    command = prog.replace(" [options]", "").partition(" ")[2]  # the subcommand, without the program's name
    text = " ".join(line.strip() for line in message.splitlines() if line.strip())
    text = re.sub(r"Expected a <class '(\w+)'>\. Got value: (\S+)", r"expected a \1, got '\2'", text)
    text = re.sub(r"Expected a typing\.Literal\[(.*?)\]\. Got value: (\S+)", r"expected one of \1, got '\2'", text)
    text = text.replace("expected a int,", "expected an int,")
    key = re.match(r'Parser key "([^"]+)": (.*)', text)
    where = f"{command} --{key.group(1)}" if key else command
    text = key.group(2) if key else text
    return f"{where}: {text}" if where else text


def _parser_class():
    """jsonargparse's ``ArgumentParser`` whose errors are one line (with where ``--help`` is), not 17-29 lines of
    usage before the one that says what is wrong."""
    from jsonargparse import ArgumentParser

    class OneLineErrors(ArgumentParser):
        def error(self, message: str, ex: Exception | None = None):
            if not self.exit_on_error:  # jsonargparse tries alternatives and catches these
                return super().error(message, ex)
            parser = getattr(ex, "subcommand_parser", None) or self
            prog = parser.prog.replace(" [options]", "")
            print(f"draftsmith: error: {_one_line(prog, message)} (see {prog} --help)", file=sys.stderr)
            sys.exit(2)

    return OneLineErrors


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    argv = argv or ["--help"]  # no subcommand: the table of them (jsonargparse's error listed five, then "...")
    try:
        if argv and argv[0] == "fit":
            from draftsmith.train.cli import fit_main

            fit_main(argv[1:])
            return
        from jsonargparse import CLI

        argv = _normalize(argv)
        CLI(_commands(argv), args=argv, as_positional=False, parser_class=_parser_class())
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
