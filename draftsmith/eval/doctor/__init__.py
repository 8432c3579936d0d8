"""``draftsmith doctor``'s checks: why a drafter accepts little, each mismatch between training and serving measured.

Every check is a small function returning a ``Check`` (``report``): pass or fail with the cause and the fix, or "not
run" with why (never a verdict on something not measured). The measured ones read a ``Probe`` (``probing``): the
target's own greedy continuations of the prompts and every hidden state along them. On greedy data the drafter's
argmax matching the target's next token *is* greedy acceptance, so the teacher-forced numbers are acceptance, as
``val/tau_est`` measures it in training, and the prediction check puts them beside the real verifier's.

The checks by idea: ``features`` (feature layers, position offset, training-time test), ``norms`` (norm conventions),
``serving`` (identity, chat template, draft vocabulary, prediction vs measurement), ``engine_reads`` (what vLLM's and
SGLang's loaders read from a checkpoint's config); ``battery.run_checks`` runs them all in order.
"""

from __future__ import annotations

from draftsmith.eval.doctor.battery import CHECK_NAMES, run_checks
from draftsmith.eval.doctor.engine_reads import check_engines
from draftsmith.eval.doctor.norms import NORM_FLAGS, check_norms, trained_norms, with_norms
from draftsmith.eval.doctor.probing import Probe, probe, teacher_forced_tau
from draftsmith.eval.doctor.report import FAIL, INFO, NOT_RUN, PASS, Check, markdown

__all__ = [
    "CHECK_NAMES",
    "FAIL",
    "INFO",
    "NORM_FLAGS",
    "NOT_RUN",
    "PASS",
    "Check",
    "Probe",
    "check_engines",
    "check_norms",
    "markdown",
    "probe",
    "run_checks",
    "teacher_forced_tau",
    "trained_norms",
    "with_norms",
]
