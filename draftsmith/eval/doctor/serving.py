"""The checks of what the drafter is served against what it was trained on: the target (``check_identity``), its
chat template (``check_template``), its vocabulary (``check_vocab``), and the verifier's measurement beside the
estimates (``check_prediction``)."""

from __future__ import annotations

import torch

from draftsmith.core.fingerprint import identity_diff
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.decode.verifier import SpeculativeDecoder
from draftsmith.eval.doctor.probing import Probe, hit_rate, predictions, reads_features, teacher_forced_tau
from draftsmith.eval.doctor.report import FAIL, INFO, NOT_RUN, PASS, Check
from draftsmith.families.eagle.network import EagleModel

COVERAGE = 0.9
"""Share of the target's greedy tokens a draft vocabulary should hold."""

COUNTED_GAP = 0.05
"""A draft vocabulary holding this much less of each prompt's greedy tokens than one of the same size counted on the
target's own greedy tokens on the other prompts was counted on other text (less is the prompts' sampling noise)."""


MAPS_CAUSE = "a corrupted or reordered d2t / t2d (a conversion that permuted or re-based them)"
MAPS_FIX = (
    "rebuild the maps from the draft vocabulary's target ids (d2t[i] = id_i - i, ids ascending; t2d marks them) or "
    "re-import the checkpoint"
)
"""The draft vocabulary check's verdict on maps that disagree (also a peer checkpoint the importer refuses for it)."""


TEMPLATE_COLLAPSE = 0.5
"""First-token acceptance in the target's chat template below this share of the raw prompts' is named a template
mismatch when the training data is not found (a smaller gap may be the texts' own difficulty)."""


def check_identity(info: dict, target: Target, network) -> tuple[Check, bool]:
    """The target the drafter records against this one; and whether the drafter can run on it at all."""
    made, actual = info.get("target") or {}, target.fingerprint
    shape = []
    cfg = network.cfg
    layer = getattr(cfg, "shape", cfg)  # a LayerShape (EAGLE, DFlash, Hydra, Clover, Kangaroo), or flat (Medusa)
    hidden = getattr(cfg, "target_hidden_size", None) or getattr(layer, "hidden_size", None)
    if hidden and hidden != target.hidden_size and reads_features(network):
        shape.append(f"hidden size {hidden} vs the target's {target.hidden_size}")
    vocab = getattr(cfg, "vocab_size", None)
    if vocab and vocab != target.vocab_size:
        shape.append(f"vocabulary {vocab} vs the target's {target.vocab_size}")
    runnable = not shape
    if info.get("imported_from"):
        where = info["imported_from"]
        finding = (
            f"imported from the {where.get('layout')} layout, which records vocabulary {vocab} and hidden size "
            f"{hidden}: both the target's (a peer checkpoint records no tokenizer hash)"
        )
        return Check("identity", PASS if runnable else FAIL, finding), runnable
    diff = identity_diff(made, actual)
    if not diff and not shape:
        dtype = made.get("dtype", "float32")
        note = f" (trained in {dtype}, used in {actual['dtype']})" if dtype != actual["dtype"] else ""
        finding = (
            f"made for {made.get('name')!r}: vocabulary {actual['vocab_size']}, hidden size {actual['hidden_size']}, "
            f"{actual['num_layers']} layers, tokenizer (vocabulary and special tokens) {actual['tokenizer_hash']} "
            f"and config match{note}"
        )
        return Check("identity", PASS, finding), runnable
    detail = [f"{k} {made.get(k)!r} vs {actual.get(k)!r}" for k in diff] + shape
    names = {"tokenizer_hash": "tokenizer", "vocab_size": "vocabulary", "hidden_size": "hidden size"}
    what = ", ".join(names.get(k, k) for k in diff) or "shape"
    return (
        Check(
            "identity",
            FAIL,
            f"made for target {made.get('name')!r}, not {actual.get('name')!r}: {'; '.join(detail)}",
            cause=f"another target ({what} differ{'s' if len(diff) == 1 else ''})"
            + ("" if runnable else "; the drafter cannot run on this one, the checks below are not run"),
            fix="doctor it against the target it was trained for, or train (or import) a drafter for this one",
            data={"differs": diff, "shape": shape, "made_for": made, "target": actual},
        ),
        runnable,
    )


def same_size_coverage(probe_: Probe, size: int, vocab: int) -> tuple[float, float | None]:
    """What the best ``size`` draft tokens hold of the target's greedy tokens on the prompts, two ways.

    Returns:
        (the ``size`` tokens the target generates most on all the prompts, measured on those same tokens: an upper
        bound; the ``size`` it generates most on the other prompts, measured on each prompt and pooled: what a
        vocabulary counted on the target's own outputs holds of text it was not counted on, as the drafter's is
        measured here, pessimistic where the other prompts hold fewer than ``size`` distinct tokens; None for fewer
        than two prompts that generate).
    """
    gens = [s[n:] for s, n in zip(probe_.sequences, probe_.prompt_lens, strict=True)]
    counts = torch.stack([torch.bincount(g, minlength=vocab) for g in gens])  # (P, V) greedy tokens per prompt
    total = counts.sum(0)  # (V,)
    tokens = int(total.sum())
    size = min(size, vocab)
    best = int(total.topk(size).values.sum()) / max(tokens, 1)
    if int((counts.sum(1) > 0).sum()) < 2:
        return best, None
    held = 0
    for own in counts:
        rest = total - own  # (V,) counted on the other prompts
        keep = rest.topk(size).indices
        held += int(own[keep[rest[keep] > 0]].sum())  # a token the other prompts never generate is not counted
    return best, held / tokens


def coverage_cause(size: int, coverage: float, best: float, counted: float | None) -> tuple[str, str]:
    """(cause, fix) of a draft vocabulary that holds under ``COVERAGE`` of the target's greedy tokens: counted on
    other text (one counted on the target's own greedy tokens holds more), its size (even the best one of that size
    holds too little, or one counted on the target's own tokens holds no more), or both."""
    missed = f"the drafter can never propose the other {1 - coverage:.0%}"
    if counted is None:  # no other prompt to count a vocabulary on
        either = f"its vocabulary was counted on other text than the target's own outputs, or {size} tokens are too few"
        return f"{missed}: {either} (one prompt cannot tell them apart)", "doctor on more prompts to tell them apart"
    other = counted >= COVERAGE or coverage < counted - COUNTED_GAP
    few = best < COVERAGE or not other
    own = (
        f"{size} tokens counted on the target's greedy tokens on the other prompts hold {counted:.0%} of each prompt's"
    )
    text = f"its vocabulary was counted on other text than the target's own outputs on prompts like these ({own})"
    text_fix = (
        "build the draft vocabulary from the target's own generated data on prompts like the ones it serves "
        "(draftsmith generate, then fit on it)"
    )
    if best < COVERAGE:
        small = f"even the {size} the target generates most on these prompts hold only {best:.0%}"
    else:
        small = f"no recount on the target's own outputs would hold more: {own}"
    small = f"{size} tokens are too few for this target's outputs ({small})"
    small_fix = "a larger draft_vocab_size (0: the target's whole vocabulary)"
    if other and few:
        return f"{missed}: {text}; and {small}", f"{text_fix}, with {small_fix}"
    if other:
        return f"{missed}: {text}", text_fix
    return f"{missed}: {small}", small_fix


def check_vocab(network, probe_: Probe) -> Check:
    """d2t / t2d consistent, and how many of the target's own greedy tokens the draft vocabulary holds; where too few,
    whether it was counted on other text or is too small (``coverage_cause``)."""
    if not reads_features(network) or not network.cfg.own_head:
        return Check("draft vocabulary", NOT_RUN, f"{network.method} drafts over the target's whole vocabulary")
    d2t, t2d = network.d2t.detach().cpu().long(), network.t2d.detach().cpu().bool()
    ids = torch.arange(len(d2t)) + d2t  # (Vd,) target id of each draft id
    inside = ids[(ids >= 0) & (ids < len(t2d))]
    problems = []
    if not bool((ids[1:] > ids[:-1]).all()):
        problems.append("draft ids do not map to ascending target ids (i + d2t[i])")
    if len(inside) < len(ids):
        problems.append(f"{len(ids) - len(inside)} draft ids map outside the target's {len(t2d)} tokens")
    if int(t2d.sum()) != len(d2t) or not bool(t2d[inside].all()):
        problems.append(f"t2d marks {int(t2d.sum())} tokens, not the {len(d2t)} d2t maps to")
    generated = probe_.generated
    drafted = torch.zeros(len(t2d), dtype=torch.bool)
    drafted[inside] = True
    coverage = float(drafted[generated].float().mean()) if len(generated) else 0.0
    best, counted = same_size_coverage(probe_, len(d2t), len(t2d))
    data = {
        "draft_vocab_size": len(d2t),
        "coverage": coverage,
        "best_same_size": best,
        "counted_same_size": counted,
        "problems": problems,
    }
    if problems:
        return Check(
            "draft vocabulary",
            FAIL,
            "; ".join(problems),
            cause=MAPS_CAUSE,
            fix=MAPS_FIX,
            data=data,
        )
    finding = f"d2t / t2d consistent; {len(d2t)} tokens hold {coverage:.0%} of the target's greedy tokens"
    if coverage < COVERAGE:
        cause, fix = coverage_cause(len(d2t), coverage, best, counted)
        return Check("draft vocabulary", FAIL, finding, cause=cause, fix=fix, data=data)
    return Check("draft vocabulary", PASS, finding, data=data)


def template_rates(network: EagleModel, probe_: Probe, k: int) -> tuple[float, float, int]:
    """(teacher-forced first-token acceptance, τ estimate at ``k``, anchors) on ``probe_``."""
    preds = predictions(network, probe_, tuple(network.cfg.feature_layers), 1)
    first, n = hit_rate(preds, probe_, 0)
    return first, teacher_forced_tau(network, probe_, k), n


def check_template(network, probes: dict[str, Probe] | None, record: dict | None, k: int) -> Check:
    """Acceptance on the prompts in the target's chat template against the same prompts raw; and, where the training
    data is found, whether its prompts are in that template.

    Args:
        probes: ``{"template": .., "raw": ..}``: the probe of the prompts each way (None: the target has no chat
            template).
        record: what the drafter's training data says (``pipeline.doctor.training_template``): ``data`` (its dir),
            ``rows`` read, ``templated`` (how many begin with the template's user prefix), ``chat_template`` (its
            recorded setting); or ``why`` it was not found. None: nothing looked for.
    """
    if probes is None:
        return Check("chat template", NOT_RUN, "the target's tokenizer has no chat template: prompts are served raw")
    data: dict = {"training_data": record}
    measured = ""
    if reads_features(network):
        rates = {way: template_rates(network, p, k) for way, p in probes.items()}
        data["first_token"] = {way: r[0] for way, r in rates.items()}
        data["tau_teacher_forced"] = {way: r[1] for way, r in rates.items()}
        measured = (
            f"first-token acceptance / τ estimate in the target's chat template {rates['template'][0]:.2f} / "
            f"{rates['template'][1]:.2f}, raw {rates['raw'][0]:.2f} / {rates['raw'][1]:.2f}"
        )
        # text in a template is another text than raw, of another difficulty: on acceptance alone, only a collapse
        lower = rates["template"][0] < TEMPLATE_COLLAPSE * rates["raw"][0]
    else:
        lower = False
        measured = f"{network.method}: acceptance by template not measured (teacher-forced probe is EAGLE's)"
    fix = (
        "generate the training data from chat prompts rendered in the target's chat template (draftsmith generate "
        "with messages prompts, --chat_template true) and retrain; or serve raw completions"
    )
    if record and record.get("rows"):
        rows, templated = record["rows"], record["templated"]
        said = "" if record.get("chat_template") is None else f", recorded chat_template {record['chat_template']}"
        where = f"{templated} of the first {rows} prompts of its training data {record['data']} begin with it{said}"
        if templated * 2 < rows:
            return Check(
                "chat template",
                FAIL,
                f"{measured}; {where}",
                cause="trained on prompts outside the target's chat template (raw text, or another template): "
                "served through the chat template, it drafts on text it was not trained on",
                fix=fix,
                data=data,
            )
        return Check("chat template", PASS, f"{measured}; {where}", data=data)
    unfound = f"; training data not found ({record['why']})" if record and record.get("why") else ""
    if lower:
        return Check(
            "chat template",
            FAIL,
            f"{measured}: under {TEMPLATE_COLLAPSE:.0%} of raw in the template{unfound}",
            cause="trained on prompts outside the target's chat template (raw text, or another template)",
            fix=fix,
            data=data,
        )
    return Check(
        "chat template",
        INFO,
        f"{measured}{unfound}: the training data's template unknown, nothing to judge against",
        data=data,
    )


@torch.no_grad()
def check_prediction(
    drafter, target: Target, probe_: Probe, info: dict, k: int, max_new_tokens: int, network=None
) -> Check:
    """τ and first-token acceptance measured by the verifier on the prompts, beside the teacher-forced estimate on
    the same text and what training recorded."""
    decoder = SpeculativeDecoder(target, drafter, k, Sampling(0.0))
    rounds, exact = [], 0
    for seq, n in zip(probe_.sequences, probe_.prompt_lens, strict=True):
        result = decoder.generate(seq[:n].tolist(), max_new_tokens)
        exact += result.tokens == seq[n:].tolist()
        rounds += [a for a, d in zip(result.accepted, result.drafted, strict=True) if d == k]
    tau = (sum(rounds) + len(rounds)) / max(1, len(rounds))
    first = sum(a >= 1 for a in rounds) / max(1, len(rounds))
    data = {"tau": tau, "first_token": first, "rounds": len(rounds), "greedy_exact": exact, "k": k}
    finding = f"verifier at K = {k}: τ {tau:.2f}, first-token acceptance {first:.2f} over {len(rounds)} rounds"
    if exact < len(probe_.sequences):
        return Check(
            "prediction vs measurement",
            FAIL,
            finding + f"; greedy output equals the target's on {exact} of {len(probe_.sequences)} prompts",
            cause="speculative decoding changed the target's greedy output",
            fix="report it: the verifier must reproduce plain greedy decoding exactly",
            data=data,
        )
    if network is not None and reads_features(network):
        data["tau_teacher_forced"] = teacher_forced_tau(network, probe_, k)
        finding += f"; teacher-forced estimate on the same text {data['tau_teacher_forced']:.2f}"
        if abs(data["tau_teacher_forced"] - tau) > 0.1 + 0.05 * tau:
            return Check(
                "prediction vs measurement",
                FAIL,
                finding,
                cause="the drafter drafts otherwise than it trains (its drafting path or the features the verifier "
                "hands it differ from the training-time test's)",
                fix="compare the drafting code path with the training one (norm flags, feature layers, positions)",
                data=data,
            )
    recorded = info.get("val_tau_est")
    accuracy = info.get("topk_accuracy")
    if accuracy:
        data["recorded_first_token"] = accuracy[0][0]
        finding += f"; training recorded first-token {accuracy[0][0]:.2f}"
    if recorded is None:
        return Check("prediction vs measurement", INFO, finding + "; the drafter records no val τ_est", data=data)
    data["recorded_tau"] = recorded
    finding += f", val τ_est {recorded:.2f}"
    if tau < recorded - max(0.15, 0.15 * recorded):
        return Check(
            "prediction vs measurement",
            FAIL,
            finding + f": {recorded - tau:.2f} below training's",
            cause="what it is served differs from what it was validated on",
            fix="see the failing checks above; if none fails, the prompts are another distribution than the "
            "training data (another domain or chat template)",
            data=data,
        )
    return Check("prediction vs measurement", PASS, finding, data=data)
