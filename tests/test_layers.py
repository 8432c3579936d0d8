"""The layer order of DESIGN.md, read from the package's imports (lazy ones inside functions included):

    cli  <-  pipeline  <-  data · train · eval · export  <-  families  <-  decode  <-  layers  <-  targets  <-  core

An algorithm's training loop lives in its family's folder yet ranks with ``train/``: a module named ``train.py`` or
``train_*.py`` in ``families/<family>/`` (``families/xvocab/train.py``) is of the ``train`` layer: it may import
``train/`` and ``data/``, and nothing in ``families/`` or below may import it (the CLI, the pipeline and ``train/``
may). No package imports one of a higher layer, no package cycle, no circle of files, no import of another
module's private name nor use of one as a module's attribute (``plots._save``); benchmarks use only the public
library API (no pipeline, no private names).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "draftsmith"
RANK = {
    "__init__": 0,
    "errors": 0,
    "core": 0,
    "targets": 1,
    "layers": 2,
    "decode": 3,
    "families": 4,
    "data": 5,
    "train": 5,
    "eval": 5,
    "export": 5,
    "pipeline": 6,
    "cli": 7,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) pairs of every draftsmith import in ``path``; ``name`` is None for ``import x``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "draftsmith":
            for alias in node.names:
                out.append((node.module, alias.name))
        elif isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.split(".")[0] == "draftsmith"]
    return out


def module_aliases(tree: ast.AST) -> dict[str, str]:
    """Names a file binds to draftsmith modules: ``import a.b as c`` binds c, ``import a.b`` binds a, and
    ``from a import b`` binds b where ``a.b`` is a module."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "draftsmith":
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "draftsmith":
            for a in node.names:
                if f"{node.module}.{a.name}" in MODULES:
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """The module an expression names (``plots``, ``draftsmith.eval.plots``), or None."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = dotted(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    return None


def private_attributes(source: str) -> list[tuple[str, str]]:
    """(module, name) of every ``module._name`` read off a draftsmith module in ``source`` (dunders allowed)."""
    tree = ast.parse(source)
    aliases = module_aliases(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            module = dotted(node.value, aliases)
            if module in MODULES or module == "draftsmith":
                out.append((module, node.attr))
    return out


def imported_module(module: str, name: str | None) -> str:
    """``from a.b import c`` imports the module ``a.b.c`` when there is one, else a name of ``a.b``."""
    return f"{module}.{name}" if name and f"{module}.{name}" in MODULES else module


def trains(module: str) -> bool:
    """A family's training loop: ``draftsmith.families.<family>.train`` or ``...train_<name>`` (of the train layer)."""
    parts = module.split(".")
    return parts[1:2] == ["families"] and len(parts) == 4 and (parts[3] == "train" or parts[3].startswith("train_"))


def top(module: str) -> str:
    """The layer a module is of: its package under ``draftsmith``; a family's training loop is of ``train``."""
    if trains(module):
        return "train"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def edges() -> dict[str, set[str]]:
    graph = {m: set() for m in MODULES}
    for m, path in MODULES.items():
        for module, name in imports(path):
            graph[m].add(imported_module(module, name))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_package_has_a_layer():
    assert {top(m) for m in MODULES} <= set(RANK), {top(m) for m in MODULES} - set(RANK)


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import in ``graph`` (module -> the modules it imports) that reaches a higher layer."""
    return [
        f"{m} ({top(m)}) imports {t} ({top(t)})"
        for m, targets in graph.items()
        for t in targets
        if RANK[top(t)] > RANK[top(m)]
    ]


def test_imports_never_reach_a_higher_layer():
    bad = upward(edges())
    assert not bad, "\n".join(bad)


def test_a_family_s_training_loop_ranks_with_train():
    """A family's ``train.py`` / ``train_*.py`` may import ``train/`` and ``data/``; its ordinary modules (network,
    module, drafter, export) may not, nor may any of them import its training loop, while the CLI, the pipeline and
    ``train/`` may."""
    allowed = {
        "draftsmith.families.xvocab.train": {
            "draftsmith.train.fit",
            "draftsmith.data.shards",
            "draftsmith.families.xvocab.module",
        },
        "draftsmith.families.s2d.train_data": {"draftsmith.train.data"},
        "draftsmith.cli": {"draftsmith.families.xvocab.train"},
        "draftsmith.pipeline.runner": {"draftsmith.families.s2d.train_data"},
        "draftsmith.train.suite": {"draftsmith.families.xvocab.train"},
    }
    assert upward(allowed) == []
    refused = {
        "draftsmith.families.xvocab.module": {"draftsmith.train.fit"},  # an ordinary module imports train/
        "draftsmith.families.xvocab.drafter": {"draftsmith.families.xvocab.train"},  # ... or its training loop
        "draftsmith.families.s2d.network": {"draftsmith.families.s2d.train_data"},
        "draftsmith.families.xvocab.trainer": {"draftsmith.train.data"},  # only train / train_* rank with train
        "draftsmith.layers.module": {"draftsmith.families.judge.train"},
    }
    assert len(upward(refused)) == len(refused)


def test_no_package_cycle():
    graph: dict[str, set[str]] = {}
    for m, targets in edges().items():
        graph.setdefault(top(m), set()).update(top(t) for t in targets if top(t) != top(m))
    assert not cycles(graph)


def test_no_circle_of_files():
    # a package's __init__ runs before its modules: an edge into a package is an edge into its __init__ only
    assert not cycles(edges())


def test_no_module_imports_a_private_name_of_another():
    bad = [
        f"{m}: from {module} import {name}"
        for m, path in MODULES.items()
        for module, name in imports(path)
        if name and name.startswith("_") and module != m
    ]
    assert not bad, "\n".join(bad)


def test_no_module_reads_a_private_attribute_of_another():
    bad = [
        f"{m}: {module}.{name}"
        for m, path in MODULES.items()
        for module, name in private_attributes(path.read_text())
        if module != m
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("script", sorted((ROOT / "benchmarks").glob("*.py")), ids=lambda p: p.name)
def test_benchmarks_use_only_the_public_library_api(script):
    bad = [
        f"from {module} import {name}"
        for module, name in imports(script)
        if top(module) in {"pipeline", "cli"} or (name or "").startswith("_") or "._" in module
    ]
    bad += [f"{module}.{name}" for module, name in private_attributes(script.read_text())]
    assert not bad, "\n".join(bad)


def test_the_private_attribute_rule_sees_a_violation():
    """A private name read off a module is caught however the module was imported; a dunder and an object's own
    private attribute are not module privates."""
    source = """
import draftsmith.eval.plots
import draftsmith.eval.plots as p
from draftsmith.eval import plots
from draftsmith.eval.plots import save

plots._save(fig, path)
p._hidden
draftsmith.eval.plots._also
plots.__name__
plots.save(fig, path)
self._cache
"""
    assert sorted(private_attributes(source)) == [
        ("draftsmith.eval.plots", "_also"),
        ("draftsmith.eval.plots", "_hidden"),
        ("draftsmith.eval.plots", "_save"),
    ]


def test_the_package_never_imports_the_engine_harnesses():
    """``engines/`` (vLLM and the peers' own code, run from their venvs) checks the package from outside: tests and
    benchmarks use it, the package does not ship it and never imports it."""
    offenders = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            mods = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            mods += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            offenders += [f"{name} imports {m}" for m in mods if m.split(".")[0] == "engines"]
    assert not offenders, offenders


def family(module: str) -> str | None:
    """The family (a subpackage of ``families/``) a module belongs to, or None."""
    parts = module.split(".")
    return (
        parts[2]
        if parts[1:2] == ["families"] and len(parts) > 2 and (PACKAGE / "families" / parts[2]).is_dir()
        else None
    )


def test_no_family_imports_another():
    """A piece two families share (target shape, attention, the prefix layer, residual blocks, default feature layers)
    lives in ``layers/``; a family built on another (P-EAGLE, Falcon and TLT on EAGLE, DSpark on DFlash) lives in that
    family's folder. Hydra, Kangaroo, DFlash, Clover and Medusa once took their blocks from EAGLE and Medusa."""
    found = {
        f"{m} imports {t}"
        for m, targets in edges().items()
        for t in targets
        if family(m) is not None and family(t) not in {None, family(m)}
    }
    assert not found, sorted(found)
