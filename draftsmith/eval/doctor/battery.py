"""Every check in the order ``draftsmith doctor`` reports them (``run_checks``)."""

from __future__ import annotations

from draftsmith.core.target import Target
from draftsmith.eval.doctor.engine_reads import check_engines
from draftsmith.eval.doctor.features import check_layers, check_offset, check_ttt
from draftsmith.eval.doctor.norms import check_norms
from draftsmith.eval.doctor.probing import probe, reads_features
from draftsmith.eval.doctor.report import FAIL, Check, not_run
from draftsmith.eval.doctor.serving import check_identity, check_prediction, check_template, check_vocab

FEATURE_CHECKS = (
    ("feature layers", lambda network, info, target, probe_: check_layers(network, target, probe_)),
    ("norm conventions", lambda network, info, target, probe_: check_norms(network, info, probe_)),
    ("position offset", lambda network, info, target, probe_: check_offset(network, probe_)),
    ("training-time test", lambda network, info, target, probe_: check_ttt(network, probe_)),
)


CHECK_NAMES = (
    "identity",
    *(name for name, _ in FEATURE_CHECKS),
    "chat template",
    "draft vocabulary",
    "prediction vs measurement",
    "engine reading",
)
"""Every check, in the order ``run_checks`` reports them."""


def guarded(name: str, run) -> Check:
    """``run()``, or "not run" naming the error it raised (a drafter too broken to measure says so here)."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001 - whatever a broken drafter raises is a finding, reported on its line
        reason = str(e).splitlines()[0] if str(e) else ""
        return not_run(name, f"it raised {type(e).__name__}: {reason}")


def run_checks(
    network,
    info: dict,
    target: Target,
    prompts: list[list[int]],
    k: int = 4,
    max_new_tokens: int = 48,
    template: dict | None = None,
) -> list[Check]:
    """Every check of ``network`` (with its native record ``info``) against ``target`` on ``prompts``; ``template``:
    the prompts in the target's chat template and raw (``{"template": ids, "raw": ids, "record": ..}``, see
    ``check_template``; None: the target has no chat template)."""
    identity, runnable = check_identity(info, target, network)
    checks = [identity]
    if not runnable:
        why = "the drafter cannot run on this target (identity)"
        return checks + [not_run(name, why) for name in CHECK_NAMES[1:]]
    network = network.to(target.device).eval()
    probe_ = probe(target, prompts, max_new_tokens)
    for name, check in FEATURE_CHECKS:
        if reads_features(network):
            checks.append(guarded(name, lambda check=check: check(network, info, target, probe_)))
        else:
            checks.append(not_run(name, f"{network.method} is not an EAGLE-1 / EAGLE-3 feature drafter"))

    def chat_template() -> Check:
        if template is None:
            return check_template(network, None, None, k)
        probes = {
            way: probe_ if ids == prompts else probe(target, ids, max_new_tokens)
            for way, ids in template.items()
            if way in ("template", "raw")
        }
        return check_template(network, probes, template.get("record"), k)

    checks.append(guarded("chat template", chat_template))
    checks.append(guarded("draft vocabulary", lambda: check_vocab(network, probe_)))

    def prediction() -> Check:
        drafter = network.as_drafter(info.get("topk_accuracy"))
        return check_prediction(drafter, target, probe_, info, k, max_new_tokens, network)

    measured = guarded("prediction vs measurement", prediction)
    failed = [c.name for c in checks if c.status == FAIL]
    if measured.status == FAIL and failed and measured.data.get("recorded_tau") is not None:
        measured.fix = f"fix what fails above first: {', '.join(failed)}"
    checks.append(measured)
    checks.append(guarded("engine reading", lambda: check_engines(network, info, target.num_layers)))
    return checks
