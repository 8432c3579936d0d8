"""``draftsmith doctor``'s checks: why a drafter accepts little, each mismatch between training and serving measured.

Every check is a small function returning a ``Check``: pass or fail with the cause and the fix, or "not run" with
why (never a verdict on something not measured). The measured ones read a ``Probe``: the target's own greedy
continuations of the prompts and every hidden state along them. On greedy data the drafter's argmax matching the
target's next token *is* greedy acceptance, so the teacher-forced numbers here are acceptance, as ``val/tau_est``
measures it in training, and the last check puts them beside the real verifier's.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target, identity_diff
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.eval import engine_reads
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
RETAINED = 0.5
"""Share of what the target's features add to first-token acceptance (over features of other positions) that the
drafter's own features must keep at depth 2: below it, a cliff after depth 1."""
FEATURE_GAIN = 0.1
"""First-token acceptance the target's features must add over features of other positions (and two noise margins)
for the training-time test check to judge a share of it: on text where they add less, the share is noise."""
TEMPLATE_COLLAPSE = 0.5
"""First-token acceptance in the target's chat template below this share of the raw prompts' is named a template
mismatch when the training data is not found (a smaller gap may be the texts' own difficulty)."""
NORM_FLAGS = ("fc_norm", "norm_before_fc", "norm_output", "norm_before_residual")
"""EAGLE-3's norm flags (``Eagle3Config``), as speculators' and vLLM's configs name them: EAGLE-3.1's three and
speculators' residual norm (``export.eagle_layout.EAGLE3_NORM_FLAGS``, which ``eval`` cannot import)."""
WEIGHTED_NORMS = {"fc_norm": "fc_norm.", "norm_before_fc": "input_norm."}
"""The norm flags that have weights of their own: the flag -> the prefix of its tensors."""
NORM_SETTINGS = tuple(
    {"fc_norm": a, "norm_before_fc": b, "norm_output": c, "norm_before_residual": d}
    for a, b in ((False, False), (True, False), (False, True))
    for c in (False, True)
    for d in (False, True)
)
"""Every setting of the norm flags an EAGLE-3 config can hold (fc_norm and norm_before_fc are exclusive)."""


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
def predictions(
    network: EagleModel, probe_: Probe, layers: tuple[int, ...], steps: int, shuffled: bool = False
) -> list[torch.Tensor]:
    """Per sequence, (steps, T) the target id the drafter puts first at anchor i and step j (training-time test
    unrolled on its own features, as it drafts), reading the target's ``layers``: it predicts x_{i+j+2}.
    ``shuffled``: each anchor reads the features of another position of its sequence (a fixed permutation): real
    features of the target that say nothing of this place, the baseline of what the features add."""
    out = []
    device = next(network.parameters()).device
    ids = network.draft_ids
    generator = torch.Generator().manual_seed(0)
    for seq, hidden in zip(probe_.sequences, probe_.hidden, strict=True):
        features = tuple(hidden[layer].to(device) for layer in layers)
        if shuffled:
            order = torch.randperm(len(seq), generator=generator).to(device)
            features = tuple(f[:, order] for f in features)
        steps_out = network(seq[None].to(device), features, steps, None)
        out.append(torch.stack([ids[network.logits(h[0]).argmax(-1)].cpu() for h in steps_out]))
    return out


def hit_rate(
    preds: list[torch.Tensor], probe_: Probe, step: int, offset: int = 0, distinct: bool = False
) -> tuple[float, int]:
    """(share, count) of anchors whose step-``step`` prediction equals x_{i+step+2+offset}, over anchors whose
    x_{i+step+2} is a generated token (what the verifier would check); ``distinct``: only the anchors whose labels
    one before, at and one after their place are three different tokens (on text that repeats a token, a prediction
    of one would count as a hit of another)."""
    hits = count = 0
    for pred, seq, n in zip(preds, probe_.sequences, probe_.prompt_lens, strict=True):
        t = len(seq)
        labels = torch.arange(t) + step + 2  # label index of each anchor
        keep = (labels >= n) & (labels < t) & (labels + offset >= 0) & (labels + offset < t)
        if distinct:
            keep &= (labels >= 1) & (labels + 1 < t)
            at = seq[labels.clamp(1, t - 2)]
            before, after = seq[(labels - 1).clamp(0, t - 1)], seq[(labels + 1).clamp(0, t - 1)]
            keep &= (at != before) & (at != after) & (before != after)
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


def check_engines(network, info: dict, num_layers: int) -> Check:
    """The checkpoint's ``config.json`` as vLLM's and SGLang's loaders read it (``engine_reads``) against what the
    drafter computes: every field an engine would read otherwise (a default that differs, a nested key it does not
    look in, a flag it does not honour)."""
    if not reads_features(network) or not network.cfg.own_head:
        return Check("engine reading", NOT_RUN, f"the engines' reading is tabled for EAGLE-3, not {network.method}")
    source = info.get("imported_from")
    if not source:
        return Check(
            "engine reading",
            NOT_RUN,
            "a native drafter, which no engine reads: doctor its export (draftsmith export DRAFTER --to vllm, "
            "speculators or sglang) to check what the engines would read",
        )
    where = Path(source["path"])
    config = json.loads(((where / "config.json") if where.is_dir() else where).read_text())
    verdicts, wrong, data = [], [], {"layout": source["layout"], "engines": {}}
    for engine, loader in engine_reads.loaders(config, source["layout"]).items():
        if isinstance(loader, str):
            verdicts.append(f"{engine}: {loader}")
            data["engines"][engine] = {"judged": False, "why": loader}
            continue
        found = engine_reads.misread(loader, config, network, num_layers)
        data["engines"][engine] = {"judged": True, "reads": loader.kind, "misread": found}
        if found:
            fixes = ", ".join(loader.fix(f["field"], f["trained"]) for f in found)
            drop = "drop the top-level model_type, or " if "model_type" in loader.kind else ""
            wrong.append(f"{engine}: {drop}write {fixes} in config.json")
            if any(f["field"] in NORM_FLAGS for f in found):
                wrong[-1] += " (a norm flag: the value the norm conventions check measures best)"
            fields = "; ".join(f"{f['field']} {fmt(f['reads'])} ({f['from']}), not {fmt(f['trained'])}" for f in found)
            verdicts.append(f"{engine} reads {loader.kind}: {fields}")
        else:
            verdicts.append(f"{engine} reads {loader.kind} as the drafter computes it")
    finding = "; ".join(verdicts)
    if not wrong:
        return Check("engine reading", PASS, finding, data=data)
    return Check(
        "engine reading",
        FAIL,
        finding,
        cause="the config leaves out a field whose default differs between loaders, nests it where the engine does "
        "not look, or sets one the engine ignores: served so, the engine builds another drafter than this one",
        fix=f"{'; '.join(wrong)}; or import the checkpoint and export it again with draftsmith export",
        data=data,
    )


def fmt(value) -> str:
    """A config value as a finding writes it: flags lower-case, layer ids as a list."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(list(value)) if isinstance(value, tuple) else str(value)


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
