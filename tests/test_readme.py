"""The README's ```bash blocks, run as written through the real CLI (``draftsmith.cli.main``).

Every command of every block is either run here or named in ``SKIPPED`` with why; a block or command that is
neither fails ``test_every_readme_command_is_run_or_skipped_with_a_reason``. The commands run as a newcomer runs them
from a checkout: in a scratch directory holding ``configs`` as the checkout does, writing ``runs/`` there.

What the test changes, and only this:

- ``smollm2`` is a tiny Llama (4 layers, hidden 64, vocabulary 96) put where ``smollm2``'s conversion lands in
  ``$DRAFTSMITH_HOME`` (a scratch dir), so ``--target smollm2`` and the ``configs/smollm2/`` recipes load it by
  that name, through the same code as the real one: released in bfloat16 (``targets.RELEASED_DTYPE``), so
  ``auto`` computes in bfloat16 where this CPU multiplies bf16 natively and in float32 elsewhere, as SmolLM2 does.
  The real SmolLM2-135M-Instruct would take minutes per command on 2 cores.
- Upper-case placeholders (``PLACEHOLDERS``) become the files the test made; ``a|b`` alternatives run once each.
- ``BUDGET`` flags are appended for tiny budgets (prompts, tokens, steps); the command's own flags are unchanged.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from conftest import eagle3_case, make_llama, make_tokenizer

from draftsmith.cli import main
from draftsmith.export.registry import write_export
from draftsmith.targets import resolve_target

pytestmark = pytest.mark.usefixtures("one_thread")  # 2 threads on 2 shared cores: 10x slower scoring

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

SKIPPED = {
    "make demo": "creates .venv and runs the quickstart (15 minutes); tests/test_quickstart.py runs `quickstart --fast`",
    "make test": "the whole suite, this test included",
    "make engine-test": "serves exports in a real vLLM from its own venv (`engine` marker, not installed here)",
    "draftsmith pipeline --target path/to/hf-model --prompts my_prompts.jsonl --out runs/mine": (
        "every stage on five families: 3.5 minutes even with --fast on 2 cores; tests/test_pipeline.py runs the "
        "pipeline end to end; here the real parser checks its flags"
    ),
    "draftsmith pipeline --target smollm2 --dtype bfloat16 --prompts builtin:chat-train --heldout-prompts "
    "builtin:mt-bench --families eagle3_31,eagle1,draft_lm --out runs/smollm2": (
        "every stage on three families: minutes even with --fast; tests/test_pipeline.py runs the pipeline end to "
        "end; here the real parser checks its flags"
    ),
    "draftsmith slurm status runs/slurm/x": (
        "reads the jobs a submission started (there is no cluster here: the pipeline above runs as a --dry-run, "
        "which submits none); tests/test_slurm.py runs it on a fake sbatch; here the real parser checks its flags"
    ),
}
"""README commands not run here, and why."""

RUN = {
    "Bring your own drafter": "test_bring_your_own_drafter_runs_as_written",
    "Export for serving": "test_export_runs_as_written_to_every_format",
    "Launch on a cluster": "test_slurm_pipeline_runs_as_written_as_a_dry_run",
}
"""README sections whose commands (all but the skipped ones) a test runs, and that test."""

PLACEHOLDERS = {
    "SPECULATORS_OR_SGLANG_OR_VLLM_DIR": "an EAGLE-3 for smollm2 in the speculators layout, as vLLM's library saves it",
    "DRAFTER": "an EAGLE-3 drafter for smollm2 (--to hf: a draft LM's HF directory, the only kind hf holds)",
    "DIR": "a new directory (--out), or the smollm2 model directory (--target)",
}
"""Upper-case words of the README's commands and what the test puts there."""

BUDGET = {
    "score": ["--num-prompts", "2", "--max-new-tokens", "16"],
    "doctor": ["--num-prompts", "2", "--max-new-tokens", "16"],
    "fit": ["--trainer.max_steps=2", "--trainer.val_check_interval=2"],
    "slurm pipeline": ["--dry-run"],
}
"""Flags appended to a subcommand for a tiny budget (``slurm pipeline``: no cluster, so the scripts are printed)."""


def readme_commands() -> list[tuple[str, str]]:
    """(section, command) of every command in the README's ```bash blocks, comments and line continuations
    removed, whitespace as ``shlex`` splits it."""
    found, section = [], None
    for part in re.split(r"(^## [^\n]*$|^```bash\n.*?^```$)", README.read_text(), flags=re.M | re.S):
        if part.startswith("## "):
            section = part[3:].strip()
        elif part.startswith("```bash"):
            body = part.removeprefix("```bash\n").removesuffix("```").replace("\\\n", " ")
            for line in body.splitlines():
                words = shlex.split(line, comments=True)
                if words:
                    found.append((section, " ".join(words)))
    return found


def section_commands(section: str) -> list[str]:
    return [c for s, c in readme_commands() if s == section and c not in SKIPPED]


def expand(command: str) -> list[list[str]]:
    """The command's argument lists, one per alternative of its ``a|b|c`` word."""
    words = shlex.split(command)
    runs = [[]]
    for word in words:
        runs = [[*run, choice] for run in runs for choice in word.split("|")]
    return runs


def run(words: list[str], values: dict[str, str]) -> int:
    """``draftsmith WORDS`` through the CLI's ``main``, placeholders filled, the subcommand's budget appended; its exit
    status. A user error (exit 2) fails the test (its one line is in the captured stderr), and so does any other
    non-zero status but ``doctor``'s 1 (a check failed: the caller reads its report)."""
    assert words[0] == "draftsmith", words
    args = [values.get(w, w) for w in words[1:]]
    unfilled = [w for w in args if re.fullmatch(r"[A-Z][A-Z_]+", w)]
    assert not unfilled, f"placeholders without a value: {unfilled} (add them to PLACEHOLDERS and the test)"
    sub = " ".join(args[:2]) if args[0] == "slurm" else args[0]
    try:
        main([*args, *BUDGET.get(sub, [])])
    except SystemExit as e:
        allowed = (0, None, 1) if sub == "doctor" else (0, None)
        assert e.code in allowed, f"`{shlex.join(words)}` exited with {e.code}"
        return e.code or 0
    return 0


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> dict:
    """A scratch checkout (``configs`` linked) as the working directory, ``$DRAFTSMITH_HOME`` holding the tiny
    ``smollm2``, an EAGLE-3 for it (native and in the speculators layout), a draft LM's HF dir, and the data the
    smollm2 recipes train on (``runs/quickstart-smollm2/data``, which the quickstart writes)."""
    from draftsmith.data.generate import generate
    from draftsmith.targets import smollm2

    root = tmp_path_factory.mktemp("readme")
    case = eagle3_case(root / "case", draft_vocab=40)
    work = root / "checkout"
    work.mkdir()
    (work / "configs").symlink_to(ROOT / "configs")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.setenv("DRAFTSMITH_HOME", str(root / "home"))
        mp.setenv("WANDB_MODE", "disabled")
        small = root / "home" / "targets" / "smollm2-135m-instruct-float32"
        shutil.copytree(case["root"] / "target", small)  # float32 weights, as the conversion stores them
        (small / "convert.json").write_text(json.dumps({"source": "tests/test_readme.py: a tiny stand-in"}))
        assert smollm2.target_dir() == small
        write_export(case["root"] / "native", "speculators", work / "their-eagle3")
        make_llama(seed=5, layers=1).save_pretrained(work / "draft-lm")
        make_tokenizer().save_pretrained(work / "draft-lm")
        prompts = work / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 3} w{i + 7}"}) + "\n" for i in range(16)))
        data = work / "runs" / "quickstart-smollm2" / "data"
        generate(resolve_target("smollm2"), str(prompts), data / "train", max_new_tokens=16)
        generate(
            resolve_target("smollm2"), str(prompts), data / "val", max_new_tokens=16, temperature=0.0, num_prompts=8
        )
        yield {"work": work, "smollm2": small, "native": case["root"] / "native", "draft_lm": work / "draft-lm"}


def test_every_readme_command_is_run_or_skipped_with_a_reason():
    commands = readme_commands()
    assert commands, "no ```bash blocks found in README.md"
    neither = [(s, c) for s, c in commands if c not in SKIPPED and s not in RUN]
    assert not neither, f"README commands neither run by a test (RUN) nor listed in SKIPPED: {neither}"
    stale = set(SKIPPED) - {c for _, c in commands}
    assert not stale, f"SKIPPED names commands the README no longer has: {stale}"
    assert all(section_commands(s) for s in RUN), "a RUN section without commands to run"


def test_bring_your_own_drafter_runs_as_written(checkout):
    """import -> score -> fit from the imported drafter -> doctor, as the README says; the import records the dtype
    ``--target smollm2`` computes in, which the score and the fit then use (before the fix: float32 always, and
    the score stopped with 'made with target ... in float32 but is used with it in bfloat16' on a bf16 CPU)."""
    from draftsmith.core.native import read
    from draftsmith.targets import parse_target, target_dtype

    commands = section_commands("Bring your own drafter")
    assert [c.split()[1] for c in commands] == ["import", "score", "fit", "doctor"]
    status = {
        c.split()[1]: run(shlex.split(c), {"SPECULATORS_OR_SGLANG_OR_VLLM_DIR": "their-eagle3"}) for c in commands
    }
    work = checkout["work"]
    record, imported = read(work / "runs" / "imported" / "eagle3")
    assert record["target"]["dtype"] == target_dtype(parse_target("smollm2"), checkout["smollm2"], quiet=True)
    report = json.loads((work / "runs" / "score" / "report.json").read_text())
    (row,) = report["drafters"]
    assert row["name"] == "theirs" and row["greedy_exact"] == row["prompts"] == 2
    checkpoints = sorted((work / "runs" / "fit" / "smollm2-eagle3").rglob("*.ckpt"))
    assert checkpoints, "fit saved no checkpoint"
    _, fitted = read(checkpoints[-1])
    assert torch.equal(fitted["d2t"], imported["d2t"])  # it went on from the imported drafter's draft vocabulary
    doctored = json.loads((work / "runs" / "doctor" / "doctor.json").read_text())
    assert doctored["checks"][0] == {**doctored["checks"][0], "name": "identity", "status": "pass"}
    # the stand-in drafter learned little in 2 steps: the doctor exits 1 exactly when one of its checks failed
    assert status["doctor"] == int(any(c["status"] == "fail" for c in doctored["checks"]))


FORMAT_DRAFTER = {"hf": "draft_lm"}
"""The drafter ``DRAFTER`` is for ``--to FORMAT`` (default: the EAGLE-3)."""


def test_export_runs_as_written_to_every_format(checkout):
    (command,) = [c for c in section_commands("Export for serving") if c.startswith("draftsmith export")]
    written = []
    for words in expand(command):
        fmt = words[words.index("--to") + 1]
        out = checkout["work"] / "exports" / fmt
        run(words, {"DRAFTER": str(checkout[FORMAT_DRAFTER.get(fmt, "native")]), "DIR": str(out)})
        assert (out / "config.json").is_file(), fmt
        written.append(fmt)
    assert written == ["vllm", "sglang", "speculators", "hf", "native"]


def test_slurm_pipeline_runs_as_written_as_a_dry_run(checkout, capsys):
    (command,) = section_commands("Launch on a cluster")
    run(shlex.split(command), {"DIR": str(checkout["smollm2"])})
    assert "#SBATCH" in capsys.readouterr().out


@pytest.mark.parametrize("command", [c for c in SKIPPED if c.startswith("draftsmith ")])
def test_skipped_draftsmith_commands_parse(command, capsys):
    """What is not run is still read by the real parser (``--print_config``): a renamed flag fails here."""
    with pytest.raises(SystemExit) as e:
        main([*shlex.split(command)[1:], "--print_config"])
    assert e.value.code in (0, None), capsys.readouterr().err
