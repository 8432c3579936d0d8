"""The norm conventions check: an EAGLE-3's recorded norm flags against those its weights were trained with, every
setting measured."""

from __future__ import annotations

import dataclasses

from draftsmith.eval.doctor.probing import Probe, hit_rate, noise, predictions
from draftsmith.eval.doctor.report import FAIL, JUDGED, NOT_RUN, PASS, Check, dead
from draftsmith.families.eagle.network import EagleModel

NORM_FLAGS = ("fc_norm", "norm_before_fc", "norm_output", "norm_before_residual")
"""EAGLE-3's norm flags (``Eagle3Config``), as speculators' and vLLM's configs name them: EAGLE-3.1's three and
speculators' residual norm (``families.eagle.layout.EAGLE3_NORM_FLAGS``, in the order this check names its settings)."""


WEIGHTED_NORMS = {"fc_norm": "fc_norm.", "norm_before_fc": "input_norm."}
"""The norm flags that have weights of their own: the flag -> the prefix of its tensors."""


NORM_SETTINGS = tuple(
    {"fc_norm": a, "norm_before_fc": b, "norm_output": c, "norm_before_residual": d}
    for a, b in ((False, False), (True, False), (False, True))
    for c in (False, True)
    for d in (False, True)
)
"""Every setting of the norm flags an EAGLE-3 config can hold (fc_norm and norm_before_fc are exclusive)."""


def with_norms(network: EagleModel, flags: dict[str, bool]) -> EagleModel:
    """``network``'s weights read under other norm flags; a norm whose weights it lacks reads with unit weights (what
    an engine that builds the norm and loads a checkpoint without it computes)."""
    if all(getattr(network.cfg, f) == v for f, v in flags.items()):
        return network
    param = next(network.parameters())
    variant = EagleModel(dataclasses.replace(network.cfg, **flags)).to(param.device, param.dtype)
    variant.load_state_dict(network.state_dict(), strict=False)
    return variant.eval()


def trained_norms(state: dict) -> dict[str, bool]:
    """The norm flags with weights of their own (``WEIGHTED_NORMS``) that an EAGLE-3's weights were trained with."""
    return {flag: any(k.startswith(prefix) for k in state) for flag, prefix in WEIGHTED_NORMS.items()}


def setting_name(flags: dict[str, bool]) -> str:
    return ", ".join(f"{f} {str(v).lower()}" for f, v in flags.items())


def check_norms(network: EagleModel, info: dict, probe_: Probe) -> Check:
    """The recorded EAGLE-3 norm flags against those the weights were trained with: the weights say which norms
    with weights of their own they hold, and every setting of the flags is measured (teacher-forced first-token and
    depth-2 acceptance; ``norm_output`` changes depth 2 only, ``norm_before_residual`` both)."""
    if not network.cfg.own_head:
        return Check("norm conventions", NOT_RUN, f"{network.method} has no EAGLE-3 norm flags")
    config = info.get("config") or {}
    recorded = {f: bool(config.get(f, False)) for f in NORM_FLAGS}
    trained = {f: bool(getattr(network.cfg, f)) for f in NORM_FLAGS}  # the network is built as its weights are
    layers = tuple(network.cfg.feature_layers)
    scores, n = {}, 0
    for flags in NORM_SETTINGS:
        preds = predictions(with_norms(network, flags), probe_, layers, 2)
        (first, n), (second, _) = hit_rate(preds, probe_, 0), hit_rate(preds, probe_, 1)
        scores[setting_name(flags)] = [first, second]
    data = {"recorded": recorded, "weights": {f: trained[f] for f in WEIGHTED_NORMS}, "acceptance": scores}

    def score(flags: dict) -> float:
        return sum(scores[setting_name(flags)]) / 2

    def reading(flags: dict) -> str:
        first, second = scores[setting_name(flags)]
        return f"{first:.2f} / {second:.2f}"

    def better(a: dict, b: dict) -> bool:
        """``a`` reads more than ``b`` at one depth beyond the noise, and not less at the other (the same anchors:
        ``norm_output`` leaves depth 1 as it is)."""
        diffs = [x - y for x, y in zip(scores[setting_name(a)], scores[setting_name(b)], strict=True)]
        margins = [noise(y, n) for y in scores[setting_name(b)]]
        return any(d > m for d, m in zip(diffs, margins, strict=True)) and all(
            d >= -m for d, m in zip(diffs, margins, strict=True)
        )

    lacking = [f for f in WEIGHTED_NORMS if recorded[f] != trained[f]]
    base = trained if lacking else recorded  # the norms with weights as the weights say; measured, the rest
    improving = [s for s in NORM_SETTINGS if better(s, base)]
    best = max(improving, key=score) if improving else base
    others = sorted((s for s in NORM_SETTINGS if s != best), key=score, reverse=True)
    finding = (
        f"recorded {setting_name(recorded)}; first-token / depth-2 acceptance as recorded {reading(recorded)}"
        + (f", with {setting_name(best)} {reading(best)}" if best != recorded else "")
        + f", next best ({setting_name(others[0])}) {reading(others[0])}"
    )
    data["best"] = best
    if score(best) < JUDGED:
        return dead("norm conventions", finding, data)
    wrong = {f: v for f, v in best.items() if recorded[f] != v}
    if wrong:
        why = [f"the weights {'hold' if trained[f] else 'hold no'} {WEIGHTED_NORMS[f]}* tensors" for f in lacking] + [
            f"{f} {str(v).lower()} accepts more" for f, v in wrong.items() if f not in lacking
        ]
        flags = ", ".join(f"{f} {str(v).lower()}" for f, v in wrong.items())
        return Check(
            "norm conventions",
            FAIL,
            f"{finding}: trained with {flags}, not as recorded ({'; '.join(why)})",
            cause="the config's norm flags are not the ones the weights were trained with (a conversion or an "
            "engine config that dropped or set them): served so, the drafter reads its inputs otherwise than it "
            "learned",
            fix=f"set {', '.join(f'{f}: {str(v).lower()}' for f, v in wrong.items())} in the drafter's config "
            "(and in the export's speculators / vLLM config)",
            data=data | {"wrong": wrong},
        )
    return Check("norm conventions", PASS, finding + ": the recorded setting reads best", data=data)
