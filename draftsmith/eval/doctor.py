"""``draftsmith doctor``'s checks: why a drafter accepts little, each mismatch between training and serving measured.

Every check is a small function returning a ``Check``: pass or fail with the cause and the fix, or "not run" with
why (never a verdict on something not measured). The measured ones read a ``Probe``: the target's own greedy
continuations of the prompts and every hidden state along them. On greedy data the drafter's argmax matching the
target's next token *is* greedy acceptance, so the teacher-forced numbers here are acceptance, as ``val/tau_est``
measures it in training, and the last check puts them beside the real verifier's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target, identity_diff
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.families.eagle.network import EagleModel
from draftsmith.layers.estimate import replay_rounds, tau_from_rounds

PASS, FAIL, NOT_RUN, INFO = "pass", "fail", "not run", "info"

TTT_DEPTHS = 3
"""Depths the training-time test check unrolls (EAGLE-3 trains with 3 TTT steps)."""
CLIFF = 0.6
"""Own-feature acceptance at depth 2 below this share of the teacher-forced one: a cliff after depth 1."""
COVERAGE = 0.9
"""Share of the target's greedy tokens a draft vocabulary should hold."""
JUDGED = 0.1
"""First-token acceptance a comparison of readings needs somewhere: below it, no reading is told from another."""


@dataclass
class Check:
    """One check's outcome: one line for the user, the numbers behind it for ``doctor.json``."""

    name: str
    status: str
    """``pass``, ``fail``, ``not run`` or ``info`` (measured, nothing to judge it against)."""
    finding: str
    """What was found or measured (for ``not run``: why it was not run)."""
    cause: str = ""
    fix: str = ""
    data: dict = field(default_factory=dict)

    def line(self) -> str:
        text = f"{self.status.upper():<7} {self.name}: {self.finding}"
        if self.cause:
            text += f"; cause: {self.cause}"
        if self.fix:
            text += f"; fix: {self.fix}"
        return text

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Probe:
    """The target's greedy continuation of each prompt with all its hidden states."""

    sequences: list[torch.Tensor]
    """(T,) prompt + greedy continuation, per prompt."""
    prompt_lens: list[int]
    hidden: list[tuple[torch.Tensor, ...]]
    """Per prompt, HF ``hidden_states[0..L]``, each (1, T, H)."""

    @property
    def generated(self) -> torch.Tensor:
        """Every greedy token the target generated, concatenated."""
        return torch.cat([s[n:] for s, n in zip(self.sequences, self.prompt_lens, strict=True)])


@torch.no_grad()
def probe(target: Target, prompts: list[list[int]], max_new_tokens: int) -> Probe:
    """Decode each prompt greedily with the target and read every hidden state along the result."""
    layers = tuple(range(target.num_layers + 1))
    sequences, lens, hidden = [], [], []
    for prompt in prompts:
        tokens = plain_decode(target, prompt, max_new_tokens, Sampling(0.0)).tokens
        seq = torch.tensor(prompt + tokens)
        sequences.append(seq)
        lens.append(len(prompt))
        hidden.append(target(seq[None], feature_layers=layers).features)
    return Probe(sequences, lens, hidden)


def reads_features(network) -> bool:
    """Whether the teacher-forced probe applies: an EAGLE-1 / EAGLE-3 network (P-EAGLE drafts its depths in
    parallel, with its own inputs)."""
    return type(network) is EagleModel


@torch.no_grad()
def predictions(network: EagleModel, probe_: Probe, layers: tuple[int, ...], steps: int) -> list[torch.Tensor]:
    """Per sequence, (steps, T) the target id the drafter puts first at anchor i and step j (training-time test
    unrolled on its own features, as it drafts), reading the target's ``layers``: it predicts x_{i+j+2}."""
    out = []
    device = next(network.parameters()).device
    ids = network.draft_ids
    for seq, hidden in zip(probe_.sequences, probe_.hidden, strict=True):
        features = tuple(hidden[layer].to(device) for layer in layers)
        steps_out = network(seq[None].to(device), features, steps, None)
        out.append(torch.stack([ids[network.logits(h[0]).argmax(-1)].cpu() for h in steps_out]))
    return out


def hit_rate(preds: list[torch.Tensor], probe_: Probe, step: int, offset: int = 0) -> tuple[float, int]:
    """(share, count) of anchors whose step-``step`` prediction equals x_{i+step+2+offset}, over anchors whose
    x_{i+step+2} is a generated token (what the verifier would check)."""
    hits = count = 0
    for pred, seq, n in zip(preds, probe_.sequences, probe_.prompt_lens, strict=True):
        t = len(seq)
        labels = torch.arange(t) + step + 2  # label index of each anchor
        keep = (labels >= n) & (labels < t) & (labels + offset >= 0) & (labels + offset < t)
        anchors = torch.arange(t)[keep]
        hits += int((pred[step, anchors] == seq[labels[keep] + offset]).sum())
        count += len(anchors)
    return (hits / count if count else 0.0), count


def teacher_forced_tau(network: EagleModel, probe_: Probe, k: int) -> float:
    """τ at chain length ``k`` estimated as training's ``val/tau_est`` is (``layers.estimate.replay_rounds``) on the
    probe's greedy text: on greedy data, the verifier's τ over its full-length rounds exactly."""
    preds = predictions(network, probe_, tuple(network.cfg.feature_layers), k)
    replayed = []
    for pred, seq, n in zip(preds, probe_.sequences, probe_.prompt_lens, strict=True):
        t = len(seq)
        accept = torch.zeros(k, 1, t)  # (K, B, T) as replay_rounds reads it
        valid = torch.zeros(k, 1, t, dtype=torch.bool)
        for j in range(k):
            labels = torch.arange(t) + j + 2
            ok = labels < t
            accept[j, 0, ok] = (pred[j, ok] == seq[labels[ok]]).float()
            valid[j, 0] = ok & (labels >= n)
        replayed += replay_rounds(accept, valid)
    tokens, count = tau_from_rounds(replayed)
    return tokens / max(1, count)


def noise(p: float, n: int) -> float:
    """A margin two standard errors wide (at least 0.03) for a share ``p`` of ``n``."""
    return max(0.03, 2 * math.sqrt(max(p * (1 - p), 0.01) / max(n, 1)))


def check_identity(info: dict, target: Target, network) -> tuple[Check, bool]:
    """The target the drafter records against this one; and whether the drafter can run on it at all."""
    made, actual = info.get("target") or {}, target.fingerprint
    shape = []
    cfg = network.cfg
    hidden = getattr(cfg, "target_hidden_size", None) or getattr(cfg, "hidden_size", None)
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


def check_vocab(network, probe_: Probe) -> Check:
    """d2t / t2d consistent, and how many of the target's own greedy tokens the draft vocabulary holds."""
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
    data = {"draft_vocab_size": len(d2t), "coverage": coverage, "problems": problems}
    if problems:
        return Check(
            "draft vocabulary",
            FAIL,
            "; ".join(problems),
            cause="a corrupted or reordered d2t / t2d (a conversion that permuted or re-based them)",
            fix="rebuild the maps from the draft vocabulary's target ids (d2t[i] = id_i - i, ids ascending; t2d marks "
            "them) or re-import the checkpoint",
            data=data,
        )
    finding = f"d2t / t2d consistent; {len(d2t)} tokens hold {coverage:.0%} of the target's greedy tokens"
    if coverage < COVERAGE:
        return Check(
            "draft vocabulary",
            FAIL,
            finding,
            cause=f"the drafter can never propose the other {1 - coverage:.0%}: its vocabulary was counted on "
            "other text than the target's own outputs",
            fix="build the draft vocabulary from the target's generated data (or a larger draft_vocab_size)",
            data=data,
        )
    return Check("draft vocabulary", PASS, finding, data=data)


def check_offset(network: EagleModel, probe_: Probe) -> Check:
    """Teacher-forced first-token predictions against the labels one before, at and one after their place."""
    preds = predictions(network, probe_, tuple(network.cfg.feature_layers), 1)
    rates = {o: hit_rate(preds, probe_, 0, o) for o in (-1, 0, 1)}
    best = max(rates, key=lambda o: rates[o][0])
    readings = ", ".join(f"{o:+d}: {a:.2f}" for o, (a, _) in rates.items())
    data = {"first_token": {str(o): a for o, (a, _) in rates.items()}}
    here, n = rates[0]
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
            data=data,
        )
    return Check("position offset", PASS, f"first-token matches by label offset {readings}: peak at 0", data=data)


def check_ttt(network: EagleModel, probe_: Probe) -> Check:
    """Acceptance per depth on the drafter's own features against the teacher-forced (target's) ones."""
    preds = predictions(network, probe_, tuple(network.cfg.feature_layers), TTT_DEPTHS)
    forced = hit_rate(preds, probe_, 0)[0]  # every depth teacher-forced is step 0 at a later anchor
    own = [hit_rate(preds, probe_, j)[0] for j in range(TTT_DEPTHS)]
    readings = ", ".join(f"{a:.2f}" for a in own)
    data = {"teacher_forced": forced, "own_features": own}
    finding = f"acceptance by depth on its own features {readings} vs {forced:.2f} teacher-forced"
    if forced < JUDGED:
        return dead("training-time test", finding, data)
    if own[1] < CLIFF * forced:
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


def dead(name: str, finding: str, data: dict) -> Check:
    """A measured comparison that cannot tell its readings apart: the drafter accepts next to nothing at any."""
    return Check(
        name,
        INFO,
        f"{finding}: below {JUDGED} at every reading, nothing to tell apart",
        cause="the drafter accepts next to nothing whatever this check varies; the cause is elsewhere",
        data=data,
    )


def not_run(name: str, why: str) -> Check:
    return Check(name, NOT_RUN, why)


FEATURE_CHECKS = (
    ("feature layers", lambda network, target, probe_: check_layers(network, target, probe_)),
    ("position offset", lambda network, target, probe_: check_offset(network, probe_)),
    ("training-time test", lambda network, target, probe_: check_ttt(network, probe_)),
)
CHECK_NAMES = ("identity", *(name for name, _ in FEATURE_CHECKS), "draft vocabulary", "prediction vs measurement")
"""Every check, in the order ``run_checks`` reports them."""


def guarded(name: str, run) -> Check:
    """``run()``, or "not run" naming the error it raised (a drafter too broken to measure says so here)."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001 - whatever a broken drafter raises is a finding, reported on its line
        reason = str(e).splitlines()[0] if str(e) else ""
        return not_run(name, f"it raised {type(e).__name__}: {reason}")


def run_checks(
    network, info: dict, target: Target, prompts: list[list[int]], k: int = 4, max_new_tokens: int = 48
) -> list[Check]:
    """Every check of ``network`` (with its native record ``info``) against ``target`` on ``prompts``."""
    identity, runnable = check_identity(info, target, network)
    checks = [identity]
    if not runnable:
        why = "the drafter cannot run on this target (identity)"
        return checks + [not_run(name, why) for name in CHECK_NAMES[1:]]
    network = network.to(target.device).eval()
    probe_ = probe(target, prompts, max_new_tokens)
    for name, check in FEATURE_CHECKS:
        if reads_features(network):
            checks.append(guarded(name, lambda check=check: check(network, target, probe_)))
        else:
            checks.append(not_run(name, f"{network.method} is not an EAGLE-1 / EAGLE-3 feature drafter"))
    checks.append(guarded("draft vocabulary", lambda: check_vocab(network, probe_)))

    def prediction() -> Check:
        drafter = network.as_drafter(info.get("topk_accuracy"))
        return check_prediction(drafter, target, probe_, info, k, max_new_tokens, network)

    measured = guarded("prediction vs measurement", prediction)
    failed = [c.name for c in checks if c.status == FAIL]
    if measured.status == FAIL and failed and measured.data.get("recorded_tau") is not None:
        measured.fix = f"fix what fails above first: {', '.join(failed)}"
    checks.append(measured)
    return checks


def markdown(report: dict) -> str:
    """``doctor.md``: what was examined, then one row per check."""
    rows = [
        "# draftsmith doctor",
        "",
        f"Drafter `{report['drafter']}` ({report['source']}) against target `{report['target']['name']}` "
        f"on {report['prompts']} prompts from `{report['prompts_source']}` (greedy, up to "
        f"{report['max_new_tokens']} new tokens, K = {report['k']}).",
        "",
        "| check | status | finding | cause | fix |",
        "|---|---|---|---|---|",
    ]
    for c in report["checks"]:
        cells = [c["name"], c["status"], c["finding"], c["cause"], c["fix"]]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"
