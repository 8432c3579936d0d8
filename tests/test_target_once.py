"""The target is resolved once, at the edge (issue 85, item 4): below the CLI every function takes a resolved target
(``targets.ResolvedTarget``) or a loaded ``Target``, never the user's string. The places in the package that turn
a target string into a target (``parse_target``, ``resolve_target``) are its entry points, counted here: the CLI's
one helper every command goes through, the fit process's config (which carries the target as ``DIR:DTYPE``), the
pipeline's inspection of the target (on the device it chose), ``draftsmith import``, and the Magpie script's
``main``. ``targets.resolve`` (a built-in name's directory: tokenizers, draft models and exports name built-ins too)
decides no dtype and makes no target; it is not counted.
"""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

from draftsmith import cli
from draftsmith.core import machine
from draftsmith.targets import ResolvedTarget, TargetSpec

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "draftsmith"
TURN_INTO_TARGET = {"parse_target", "resolve_target"}
MOST = 5


def target_sites(package: Path) -> dict[str, list[int]]:
    """``file:function`` -> the lines where it calls ``parse_target`` / ``resolve_target``, for every module of
    ``package`` outside ``targets/`` (a call outside any function counts as its module's ``<module>``)."""
    sites: dict[str, list[int]] = {}

    def visit(node: ast.AST, site: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = site
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                module, _, where = site.partition(":")
                inner = f"{module}:{child.name if where == '<module>' else f'{where}.{child.name}'}"
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name in TURN_INTO_TARGET:
                    sites.setdefault(site, []).append(child.lineno)
            visit(child, inner)

    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent)
        if rel.parts[1] != "targets":
            visit(ast.parse(path.read_text()), f"{rel}:<module>")
    return sites


def listed(sites: dict[str, list[int]]) -> str:
    return "\n".join(f"  {site} (line {', '.join(map(str, lines))})" for site, lines in sorted(sites.items()))


def test_the_target_string_is_turned_into_a_target_only_at_the_entry_points():
    sites = target_sites(PACKAGE)
    assert len(sites) <= MOST, (
        f"{len(sites)} places in draftsmith/ turn a target string into a target (at most {MOST}: the entry points); "
        f"below them, take a targets.ResolvedTarget:\n{listed(sites)}"
    )


def test_the_count_sees_a_call_in_any_function_of_any_module(tmp_path):
    """The count can fail: a call by attribute or by name, in a method or at module level, each a site of its own;
    one in ``targets/`` is the API itself."""
    package = tmp_path / "draftsmith"
    (package / "data").mkdir(parents=True)
    (package / "targets").mkdir()
    (package / "data" / "a.py").write_text(
        "from draftsmith import targets\n"
        "from draftsmith.targets import parse_target\n"
        "T = targets.resolve_target('default')\n"
        "def load(t):\n"
        "    return parse_target(t), targets.resolve_target(t)\n"
        "class M:\n"
        "    def __init__(self, t):\n"
        "        self.t = targets.resolve_target(t)\n"
    )
    (package / "targets" / "__init__.py").write_text("def resolve_target(t):\n    return parse_target(t)\n")
    sites = target_sites(package)
    assert sites == {"draftsmith/data/a.py:<module>": [3], "draftsmith/data/a.py:load": [5, 5],
                     "draftsmith/data/a.py:M.__init__": [8]}  # fmt: skip
    assert "draftsmith/data/a.py:load (line 5, 5)" in listed(sites)


def command(target: ResolvedTarget, k: int = 4, device: str = "cpu") -> ResolvedTarget:
    """A command that takes its target resolved.

    Args:
        target: the target.
        k: a flag of its own.
        device: where it runs.
    """
    return target


def pipeline_command(target: TargetSpec, dtype: str = "float16") -> TargetSpec:
    """A command that takes its target parsed, and has a ``dtype`` of its own (``features``' storage dtype).

    Args:
        target: the target.
        dtype: its own flag.
    """
    return target


def test_a_command_takes_the_target_string_and_gets_it_resolved_once_by_the_cli(tmp_path, monkeypatch, capsys):
    from jsonargparse import CLI

    (tmp_path / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    monkeypatch.setattr(machine, "native_bf16", lambda device="cpu": (True, "the CPU has avx512_bf16"))
    run = cli._taking_target_text(command, "tests:command")
    assert inspect.signature(run).parameters["target"].annotation is str and "dtype:" in run.__doc__
    got = CLI(run, args=["--target", str(tmp_path), "--k", "2"], parser_class=cli._parser_class(), as_positional=False)
    assert got == ResolvedTarget(TargetSpec(str(tmp_path)), tmp_path, "bfloat16")
    assert capsys.readouterr().out.count("--dtype auto: bfloat16") == 1  # decided, and said, once
    got = CLI(
        run,
        args=["--target", f"{tmp_path}:bf16", "--dtype", "float32"],
        parser_class=cli._parser_class(),
        as_positional=False,
    )
    assert got.dtype == "float32" and got.spec == TargetSpec(str(tmp_path), "float32")  # --dtype overrides
    parsed = CLI(
        cli._taking_target_text(pipeline_command, "p"), args=["--target", f"{tmp_path}:bf16"], as_positional=False
    )
    assert parsed == TargetSpec(str(tmp_path), "bfloat16")  # parsed only: its own --dtype is no target's
    assert cli._taking_target_text(cli.target_build, "") is cli.target_build  # no target: as it is
