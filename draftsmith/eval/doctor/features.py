"""The checks of how an EAGLE drafter reads the target's features: which layers (``check_layers``), at which
position (``check_offset``), and its own at later depths (``check_ttt``)."""

from __future__ import annotations

from draftsmith.core.target import Target
from draftsmith.eval.doctor.probing import Probe, hit_rate, noise, predictions
from draftsmith.eval.doctor.report import FAIL, INFO, JUDGED, PASS, Check, dead
from draftsmith.families.eagle.network import EagleModel

TTT_DEPTHS = 3
"""Depths the training-time test check unrolls (EAGLE-3 trains with 3 TTT steps)."""


RETAINED = 0.5
"""Share of what the target's features add to first-token acceptance (over features of other positions) that the
drafter's own features must keep at depth 2: below it, a cliff after depth 1."""


FEATURE_GAIN = 0.1
"""First-token acceptance the target's features must add over features of other positions (and two noise margins)
for the training-time test check to judge a share of it: on text where they add less, the share is noise."""


def check_layers(network: EagleModel, target: Target, probe_: Probe) -> Check:
    """The recorded feature layer ids within the target's depth, and measured against the readings ±1."""
    recorded, depth = tuple(network.cfg.feature_layers), target.num_layers
    resolved = tuple(layer + depth + 1 if layer < 0 else layer for layer in recorded)
    if not all(0 <= layer <= depth for layer in resolved):
        return Check(
            "feature layers",
            FAIL,
            f"ids {list(recorded)} outside the target's hidden states 0..{depth}",
            cause="ids for a deeper target, or counted from another origin",
            fix=f"record ids within 0..{depth} (HF hidden_states numbering: 0 = embeddings)",
        )
    accuracy = {}
    for shift in (-1, 0, 1):
        ids = tuple(layer + shift for layer in resolved)
        if all(0 <= layer <= depth for layer in ids):
            accuracy[shift] = hit_rate(predictions(network, probe_, ids, 1), probe_, 0)
    best = max(accuracy, key=lambda s: accuracy[s][0])
    here, n = accuracy[0]
    readings = ", ".join(f"{list(layer + s for layer in resolved)}: {a:.2f}" for s, (a, _) in sorted(accuracy.items()))
    data = {"recorded": list(resolved), "first_token": {str(s): a for s, (a, _) in accuracy.items()}, "anchors": n}
    final = f"; {depth} is the final normed state, which vLLM and SGLang do not capture" if depth in resolved else ""
    if accuracy[best][0] < JUDGED:
        return dead("feature layers", f"first-token acceptance by reading: {readings}", data)
    if best != 0 and accuracy[best][0] - here > noise(here, n):
        ids = [layer + best for layer in resolved]
        return Check(
            "feature layers",
            FAIL,
            f"first-token acceptance by reading: {readings}; best {ids} ({best:+d}), not the recorded {list(resolved)}",
            cause="the layer ids are off by one (0- vs 1-based ids, or the embedding counted as a layer)",
            fix=f"read hidden_states {ids}: set feature_layers to {ids} in the drafter's config (or the engine's "
            "aux layer ids)",
            data=data | {"best": ids},
        )
    return Check(
        "feature layers",
        PASS,
        f"recorded {list(resolved)} read best (first-token acceptance {readings}){final}",
        data=data | {"best": list(resolved)},
    )


def check_offset(network: EagleModel, probe_: Probe) -> Check:
    """Teacher-forced first-token predictions against the labels one before, at and one after their place, at the
    anchors whose three labels differ (text that repeats a token would credit one offset with another's hits)."""
    preds = predictions(network, probe_, tuple(network.cfg.feature_layers), 1)
    rates = {o: hit_rate(preds, probe_, 0, o, distinct=True) for o in (-1, 0, 1)}
    best = max(rates, key=lambda o: rates[o][0])
    here, n = rates[0]
    readings = ", ".join(f"{o:+d}: {a:.2f}" for o, (a, _) in rates.items())
    readings += f" (over the {n} places whose three labels differ)"
    data = {"first_token": {str(o): a for o, (a, _) in rates.items()}, "anchors": n}
    if rates[best][0] < JUDGED:
        return dead("position offset", f"first-token matches by label offset {readings}", data)
    if best != 0 and rates[best][0] - here > noise(here, n):
        return Check(
            "position offset",
            FAIL,
            f"first-token matches by label offset {readings}: peak at {best:+d}",
            cause="the labels (or the loss mask) were off by one in training: the drafter learned to predict "
            f"x(t{2 + best:+d}) at the place of x(t+2)",
            fix="fix the data's shift (anchor i pairs x(i+1) with the target's state at i and predicts x(i+2)) "
            "and retrain",
            data=data | {"peak": best},
        )
    return Check(
        "position offset", PASS, f"first-token matches by label offset {readings}: peak at 0", data=data | {"peak": 0}
    )


def check_ttt(network: EagleModel, probe_: Probe) -> Check:
    """Acceptance per depth on the drafter's own features against the teacher-forced (target's) ones, each over
    the baseline of features from other positions: the share of what the target's features add at depth 1 that
    the drafter's own keep at depth 2."""
    layers = tuple(network.cfg.feature_layers)
    preds = predictions(network, probe_, layers, TTT_DEPTHS)
    forced, n = hit_rate(preds, probe_, 0)  # every depth teacher-forced is step 0 at a later anchor
    blind = hit_rate(predictions(network, probe_, layers, 1, shuffled=True), probe_, 0)[0]
    own = [hit_rate(preds, probe_, j)[0] for j in range(TTT_DEPTHS)]
    readings = ", ".join(f"{a:.2f}" for a in own)
    data = {"teacher_forced": forced, "own_features": own, "other_positions_features": blind, "anchors": n}
    finding = (
        f"acceptance by depth on its own features {readings} vs {forced:.2f} teacher-forced and {blind:.2f} on "
        "features of other positions"
    )
    if forced < JUDGED:
        return dead("training-time test", finding, data)
    if forced - blind <= max(FEATURE_GAIN, 2 * noise(forced, n)):
        return Check(
            "training-time test",
            INFO,
            finding + ": the target's features add nothing measurable at depth 1 on this text, no cliff to see",
            data=data,
        )
    retained = (own[1] - blind) / (forced - blind)
    data["retained"] = retained
    finding += f"; its own features keep {retained:.0%} of what the target's add, at depth 2"
    if retained < RETAINED:
        return Check(
            "training-time test",
            FAIL,
            finding + ": a cliff after depth 1",
            cause="trained on the target's features only (no training-time test): from depth 2 it reads its own "
            "outputs, which it never saw in training",
            fix="train with training-time test (EAGLE-3's ttt_steps >= 3)",
            data=data,
        )
    return Check("training-time test", PASS, finding, data=data)
