"""TLT's verifiable task: column addition with a worked solution, whose final answer a reward checks.

A problem is ``a+b=`` (``digits``-digit operands); its solution adds the columns right to left, one ``x+y[+1]=s``
step per column (``+1``: the carry), then the sum: ``48+37=`` -> ``8+7=15;4+3+1=8;85``. Solutions are a few tokens per
digit, so rollouts are long enough for speculative decoding to matter, and their format is something a target has to
learn (SFT on the solutions, or GRPO on the reward): what makes it drift away from its drafter.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from draftsmith.errors import DraftsmithError


@dataclass(frozen=True)
class Problem:
    """One addition problem."""

    prompt: str
    """``a+b=``."""
    solution: str
    """The worked solution (what SFT trains on): one step per column, then the sum."""
    answer: int
    """a + b."""


@dataclass(frozen=True)
class ArithmeticTask:
    """Random additions of ``digits``-digit numbers, drawn from ``seed`` (each training step draws its own)."""

    digits: int = 2
    """Digits of each operand."""
    seed: int = 0
    """Seed of the problem draws (step s draws from (seed, s))."""

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 9:
            raise DraftsmithError(f"task.digits must be in 1..9, got {self.digits}")

    def problems(self, n: int, step: int) -> list[Problem]:
        """``n`` problems of training step ``step`` (warm-up steps are negative), the same on every run."""
        rng = random.Random(f"{self.seed}:{step}")
        low, high = 10 ** (self.digits - 1) if self.digits > 1 else 0, 10**self.digits - 1
        return [problem(rng.randint(low, high), rng.randint(low, high)) for _ in range(n)]


def problem(a: int, b: int) -> Problem:
    """``a+b=`` with its column-by-column solution."""
    steps, carry = [], 0
    xs, ys = str(a)[::-1], str(b)[::-1]
    for i in range(max(len(xs), len(ys))):
        x, y = int(xs[i]) if i < len(xs) else 0, int(ys[i]) if i < len(ys) else 0
        s = x + y + carry
        steps.append(f"{x}+{y}{'+1' if carry else ''}={s}")
        carry = s // 10
    return Problem(f"{a}+{b}=", ";".join([*steps, str(a + b)]), a + b)


def reward(problem: Problem, completion: str) -> float:
    """1.0 when the completion's last ``;``-separated field is the sum (whitespace ignored: char-level tokenizers
    decode with spaces), else 0.0."""
    text = "".join(completion.split())
    return 1.0 if text.rsplit(";", 1)[-1] == str(problem.answer) else 0.0
