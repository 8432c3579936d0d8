"""The CLI answers ``--help`` and a refused command without importing what it does not need: importing torch,
transformers and Lightning took 5-6 s of a 2-core machine before every answer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "lightning", "datasets")


def imported_by(*args: str) -> tuple[list[str], str]:
    """The heavy packages that ``draftsmith ARGS`` imported, and what it printed."""
    code = (
        "import json, sys\nfrom draftsmith.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    return json.loads(run.stdout.splitlines()[-1]), run.stdout + run.stderr


@pytest.mark.parametrize("args", [["--help"], [], ["bogus"]], ids=["help", "nothing", "unknown-command"])
def test_help_and_an_unknown_command_import_no_heavy_package(args):
    heavy, printed = imported_by(*args)
    assert heavy == [], f"draftsmith {' '.join(args)} imported {heavy}"
    assert "score" in printed and "pack" in printed  # the subcommands are still listed


def test_help_lists_each_subcommand_with_its_docstring():
    _, printed = imported_by("--help")
    assert "Score drafters against a target by real speculative" in printed
    assert "Pack a finished generated corpus into one compressed" in printed


@pytest.mark.parametrize(
    "args",
    [
        ["score", "--target", "{tmp}/none", "--drafter", "ngram"],
        ["export", "{tmp}/none", "--to", "hf", "--out", "{tmp}/out"],
        ["import", "{tmp}/none", "--target", "default", "--out", "{tmp}/out"],
        ["generate", "--target", "{tmp}/none", "--prompts", "builtin:heldout", "--out", "{tmp}/out"],
    ],
    ids=["score", "export", "import", "generate"],
)
def test_a_refused_command_that_trains_nothing_imports_no_lightning(args, tmp_path):
    """Drafting and exporting need no Lightning (2-3 s of imports): only training does."""
    heavy, printed = imported_by(*[a.format(tmp=tmp_path) for a in args])
    assert "draftsmith: error:" in printed and "lightning" not in heavy
