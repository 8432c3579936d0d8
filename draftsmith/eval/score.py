"""``draftsmith score``: run plain and speculative decoding side by side and report α, τ, speedup."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.core.draft import DecodeResult, Drafter
from draftsmith.core.machine import machine_record
from draftsmith.core.manifest import write_manifest
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.core.trees import TreeKind, VerifyRule
from draftsmith.data.prompts import continuable, encode, load_prompts
from draftsmith.decode.metrics import by_category, drafter_metrics, plain_metrics
from draftsmith.decode.verifier import SpeculativeDecoder, check_compatible, check_rule, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.eval import calibration
from draftsmith.eval.calibration import AUTO_K, AUTO_MAX_K, CALIBRATION_PROMPTS
from draftsmith.eval.report import auto_k_table, markdown_table, write_report
from draftsmith.eval.rows import PlainRow, ScoreRow, to_dicts
from draftsmith.families.rasd.drafter import RasdDrafter
from draftsmith.families.s2d import exits as s2d
from draftsmith.families.specs import Named, build_drafter, check_paths, parse_spec
from draftsmith.layers.tree_draft import TreeDrafter, TreePolicy
from draftsmith.targets import ResolvedTarget, load_target


def score_drafters(
    target: Target,
    drafters: dict[str, Drafter],
    prompts: list[list[int]],
    k: int | str | dict[str, int],
    sampling: Sampling,
    max_new_tokens: int,
    seed: int = 0,
    progress: bool = True,
    categories: list[str | None] | None = None,
    verify: VerifyRule | dict[str, VerifyRule] = VerifyRule.SPECINFER,
    judges: dict | None = None,
    checks: list[dict | None] | None = None,
    references: dict[str, Target] | None = None,
) -> tuple[PlainRow, list[ScoreRow]]:
    """Decode every prompt plainly and with each drafter, interleaved so all see the same machine state.

    A drafter that fine-tuned its target (``own_target``, Medusa-2) decodes with that target and is
    compared with plain decoding of it, in the same interleaved loop. ``k="auto"`` picks each drafter's K (and
    static tree size) of highest predicted speed before the scored pass (``calibration.choose_shapes``). ``categories``
    (one per prompt, e.g. MT-bench's) adds each row's τ and speedup per category. ``verify``: the sampled trees'
    multi-candidate rule, one for all drafters or one per drafter name (SpecInfer for those it does not name).
    ``judges``: drafter name -> judge head: that drafter is verified by Judge decoding (lossy: its row says so).
    ``checks`` (one per prompt, ``data/checks.py``): every row, plain decoding's too, counts the answers that pass.
    ``references``: other targets (the same weights with the fastest kernels, or in float32) decoded plainly in the
    same loop, so that a speedup can be given over the fastest plain decoding the machine offers too
    (``PlainRow.references``, ``PlainRow.fastest``). ``k``: one K for all, ``"auto"``, or one K per drafter name (the
    same drafter at several fixed K in one run).

    Returns:
        (plain decoding of ``target``, one row per drafter); ``to_dict`` gives what a report saves.
    """
    targets = {name: d.own_target or target for name, d in drafters.items()}
    given = verify if isinstance(verify, dict) else dict.fromkeys(drafters, verify)
    rules = {name: given.get(name, VerifyRule.SPECINFER) for name in drafters}
    for name, drafter in drafters.items():
        check_compatible(targets[name], drafter, name)
        check_rule(drafter, rules[name], sampling, name)
    if isinstance(k, dict) and set(k) != set(drafters):
        raise DraftsmithError(f"score: K given for {sorted(k)}, drafters are {sorted(drafters)}")
    fixed = k if isinstance(k, dict) else dict.fromkeys(drafters, k)
    lengths = range(1, AUTO_MAX_K + 1) if k == AUTO_K else sorted({int(v) for v in fixed.values()})
    first = prompts[:CALIBRATION_PROMPTS]
    s2d.choose_exits(targets, drafters, first, sampling, seed, lengths, calibration.verify_ratios)
    shapes = calibration.choose_shapes(targets, drafters, prompts[0], sampling, seed, first[1:]) if k == AUTO_K else {}
    ks = {name: shapes[name].k if name in shapes else int(fixed[name]) for name in drafters}
    judges = judges or {}
    decoders = {
        name: SpeculativeDecoder(targets[name], d, ks[name], sampling, rules[name], judges.get(name))
        for name, d in drafters.items()
    }
    references = references or {}
    baselines = {id(t): t for t in [target, *targets.values(), *references.values()]}
    # warm-up: first calls pay one-off allocation costs that would bias whichever runs first; a compiled target
    # also compiles a graph per new shape family (prefill lengths, each drafted length), so it warms up on two
    # whole prompts
    compiled = any(t.compiled for t in baselines.values())
    warm, budget = (prompts[:2], max_new_tokens) if compiled else (prompts[:1], min(8, max_new_tokens))
    for prompt in warm:
        for t in baselines.values():
            plain_decode(t, prompt, budget, sampling, torch.Generator().manual_seed(seed))
        for dec in decoders.values():
            dec.generate(prompt, budget, torch.Generator().manual_seed(seed))
    for d in drafters.values():
        if isinstance(d, RasdDrafter):
            d.reset_stats()  # its retrieval counts are the scored pass's
    counts = {c for name, d in drafters.items() for c in (ks[name] + 1, calibration.most_verified(d, ks[name]))}
    ratios, _ = calibration.verify_ratios(target, prompts[0], sorted(counts))
    plain, spec = {key: [] for key in baselines}, {name: [] for name in drafters}
    for i, prompt in enumerate(tqdm(prompts, desc="score", unit="prompt", disable=not progress)):
        for key, t in baselines.items():
            plain[key].append(
                plain_decode(t, prompt, max_new_tokens, sampling, torch.Generator().manual_seed(seed + i))
            )
        for name, dec in decoders.items():
            spec[name].append(dec.generate(prompt, max_new_tokens, torch.Generator().manual_seed(seed + i)))
    rows = []
    for name in drafters:
        own_plain = plain[id(targets[name])]
        metrics = drafter_metrics(name, ks[name], spec[name], own_plain, sampling.greedy, ratios)
        per_prompt = [(sum(r.accepted), len(r.accepted)) for r in spec[name]]
        row = ScoreRow(**vars(metrics), prompts=len(prompts), auto_k=shapes.get(name), prompt_rounds=per_prompt)
        if name in judges:  # lossy: output leaves the target's wherever the judge keeps a rejected token
            row.lossy = True
            row.judged = sum(sum(r.judged) for r in spec[name])
            row.judged_share = round(row.judged / max(1, sum(sum(r.accepted) for r in spec[name])), 4)
        elif sampling.greedy and row.greedy_exact < len(prompts):
            row.divergences = divergences(targets[name], prompts, spec[name], own_plain)
        if categories is not None:
            by = by_category(categories, {name: spec[name]}, own_plain, ks[name], sampling.greedy)
            row.categories = {c: rows_[name] for c, rows_ in by.items()}
        row.extra = drafters[name].extra_metrics(spec[name])  # --online-adapt: α and τ over time
        if targets[name] is not target:
            row.target = targets[name].name
        if rules[name] is not VerifyRule.SPECINFER:
            row.verify = rules[name]
        if checks is not None:
            row.checked, row.checks_passed = checked(targets[name], spec[name], checks)
        rows.append(row)
    plain_row = PlainRow(**vars(plain_metrics(plain[id(target)])))
    if references:
        plain_row.references = {name: plain_metrics(plain[id(t)]) for name, t in references.items()}
    if checks is not None:
        plain_row.checked, plain_row.checks_passed = checked(target, plain[id(target)], checks)
    return plain_row, rows


def checked(target: Target, results: list[DecodeResult], checks: list[dict | None]) -> tuple[int, int]:
    """(answers whose prompt has a check, of those the answers that pass it)."""
    from draftsmith.data.checks import passes

    pairs = [(r, c) for r, c in zip(results, checks, strict=True) if c is not None]
    text = target.tokenizer.decode
    return len(pairs), sum(passes(c, text(r.tokens, skip_special_tokens=True)) for r, c in pairs)


@torch.no_grad()
def divergences(
    target: Target, prompts: list[list[int]], spec: list[DecodeResult], plain: list[DecodeResult]
) -> list[dict]:
    """Where greedy speculative output left plain greedy output: per diverging prompt, the first differing
    position and the target's logit gap there between its plain token and the speculative one, recomputed in one
    teacher-forced forward (a gap within the target's rounding noise is a near-tie, not a verifier bug)."""
    out = []
    for i, (s, p) in enumerate(zip(spec, plain, strict=True)):
        if s.tokens == p.tokens:
            continue
        shared = min(len(s.tokens), len(p.tokens))
        pos = next((j for j in range(shared) if s.tokens[j] != p.tokens[j]), shared)
        if pos == shared:  # one stopped earlier (an EOS only one of them produced)
            out.append({"prompt": i, "position": pos, "gap": None})
            continue
        logits = target(torch.tensor([prompts[i] + p.tokens[:pos]]), with_features=False).logits[0, -1]
        top2 = logits.topk(2).values
        out.append(
            {
                "prompt": i,
                "position": pos,
                "gap": round(float(logits[p.tokens[pos]] - logits[s.tokens[pos]]), 4),
                "top2_gap": round(float(top2[0] - top2[1]), 4),
            }
        )
    return out


@dataclass(frozen=True)
class ScoreConfig:
    """How drafters are scored (``draftsmith score``'s flags)."""

    prompts: str = "builtin:heldout"
    """``builtin:heldout``, a JSONL file or a local dataset."""
    prompt_field: str = "prompt"
    """The prompt's field name in JSONL / dataset sources."""
    num_prompts: int = 20
    """How many prompts to use (the first N)."""
    k: int | str = 4
    """Tokens drafted per round, or ``auto``: per drafter, the K (and static tree size) of highest predicted speed
    on this machine (``calibration.choose_shapes``)."""
    sampling: Sampling = Sampling(0.0)
    """Greedy (temperature 0) or lossless speculative sampling at this temperature / top-p."""
    max_new_tokens: int = 64
    """Tokens generated per prompt."""
    seed: int = 0
    """Seed of the per-prompt random generators."""
    online_adapt: bool = False
    """Online speculative decoding: each draft LM learns from its rejected positions while it decodes."""
    tree: TreePolicy = TreePolicy(TreeKind.CHAIN, 16, 4)
    """How EAGLE, Medusa and Hydra drafters draft (chain, static, dynamic or sampled tree)."""
    compile: bool = False
    """``torch.compile`` the target's and the draft LMs' forwards (``Target.compile``), for plain and speculative
    decoding alike: pays on small models, whose eager forward is mostly Python and dispatch overhead."""
    batch_invariant: bool | None = None
    """Compute the target's rows as they would be computed alone (``core.numerics``): greedy speculative output
    then equals plain greedy output bit for bit in bf16 too, at a cost to plain decoding. None: on for bf16/fp16."""
    verify: VerifyRule = VerifyRule.SPECINFER
    """The multi-candidate rule of sampled trees: SpecInfer, SpecTr or RSD."""
    judge: str | None = None
    """A judge dir (``draftsmith judge``): each drafter is also scored under Judge decoding (lossy), as NAME+judge."""
    judge_threshold: float | None = None
    """Overrides the judge's own threshold."""
    device: str = "cpu"
    """Where the target and the drafters run: ``cpu``, or ``cuda`` / ``cuda:N``."""

    def __post_init__(self) -> None:
        if self.k != AUTO_K and not (isinstance(self.k, int) and self.k > 0):
            raise DraftsmithError(f"-k must be a positive integer or auto, got {self.k!r}")
        if self.max_new_tokens <= 0:
            raise DraftsmithError(f"--max-new-tokens must be positive, got {self.max_new_tokens}")
        if self.device != "cpu" and not (self.device.startswith("cuda") and torch.cuda.is_available()):
            raise DraftsmithError(f"--device {self.device}: expected cpu or cuda[:N] on a machine with a CUDA GPU")


def score(
    target: ResolvedTarget,
    drafter: list[str],
    prompts: str = "builtin:heldout",
    k: int | str = 4,
    temperature: float = 0.0,
    top_p: float = 1.0,
    max_new_tokens: int = 64,
    num_prompts: int = 20,
    seed: int = 0,
    out: Path = Path("runs/score"),
    prompt_field: str = "prompt",
    online_adapt: bool = False,
    tree: str = "chain",
    tree_size: int = 16,
    tree_top_k: int = 4,
    compile: bool = False,
    batch_invariant: bool | None = None,
    verify: str = "specinfer",
    tree_branching: str = "2,2,1,1",
    tree_beam_width: int = 4,
    judge: str | None = None,
    judge_threshold: float | None = None,
    device: str = "cpu",
) -> dict:
    """Score drafters against a target by real speculative decoding.

    Args:
        target: ``default``, ``smollm2`` or a local Hugging Face model directory, optionally ``:DTYPE`` (from Python
            a ``targets.ResolvedTarget``: ``draftsmith.cli`` resolves it once, with ``--dtype``).
        drafter: one or more drafters, each ``[NAME=]SPEC`` with SPEC ``ngram[:N]``, ``target``, a
            trained drafter's ``.ckpt`` or native dir, or a Hugging Face draft-model directory.
        prompts: ``builtin:heldout``, ``builtin:chat-heldout``, ``builtin:mt-bench`` (its 80 first turns, scored per
            category too), a JSONL file or a local dataset.
        k: tokens drafted per round, or ``auto``: per drafter, the K (and static tree size) that maximises the
            predicted speed τ(K) / (r(K+1) + K·c) from its validation acceptance and this machine's r and c.
        temperature: 0 for greedy verification, > 0 for lossless speculative sampling.
        top_p: nucleus mass applied to the target's distribution.
        max_new_tokens: tokens generated per prompt.
        num_prompts: how many prompts to use (the first N).
        seed: seed of the per-prompt random generators.
        out: directory for report.json and report.md.
        prompt_field: the prompt's field name in JSONL / dataset sources.
        online_adapt: online speculative decoding (OSD): each draft LM learns from the positions where
            its drafts were rejected while it decodes the prompts in order; the report adds α and τ per
            window of prompts (first vs last).
        tree: how EAGLE, Medusa and Hydra drafters draft: ``chain``, ``static`` (a tree built from
            their held-out top-k accuracies), ``dynamic`` (EAGLE-2: grown by draft confidence), ``sampled``
            (``--tree_branching`` candidates drawn from the drafter per node: multi-draft sampling, see ``verify``)
            or ``beam`` (RSD-S: a stochastic beam search of ``--tree_beam_width`` paths, verified with ``rsd``).
            Drafters that cannot grow trees draft as their spec says.
        tree_size: tree nodes (drafted tokens) per round.
        tree_top_k: dynamic trees: nodes expanded per depth, children per expanded node.
        compile: ``torch.compile`` the target's and the draft LMs' forwards (plain decoding included); a warm-up
            (the first two prompts, decoded untimed before the scored pass) pays the compilation.
        batch_invariant: the target computes each row as it would alone, so greedy output is exact in bf16 too
            (default: on for bf16/fp16 targets; ``--batch_invariant false`` for the fastest kernels, whose
            divergences the report then locates and measures).
        verify: how sampled trees are verified (sampling only): ``specinfer`` (i.i.d. candidates, recursive
            rejection; also the rule of every deterministic tree), ``spectr`` (i.i.d. candidates, SpecTr's K-SEQ)
            or ``rsd`` (candidates drawn without replacement, recursive rejection: RSD-C with ``--tree sampled``,
            RSD-S with ``--tree beam``). All lossless.
        tree_branching: sampled trees: candidates drawn per node at each depth, e.g. ``2,2,1,1`` (14 nodes).
        tree_beam_width: beam trees: paths kept per depth (K·width nodes at most).
        judge: Judge decoding, LOSSY: a judge dir (``draftsmith judge``); each drafter is scored twice in the same
            run, losslessly and as NAME+judge (a rejected draft token kept when the judge calls it correct). Needs
            prompts with checks (``builtin:checkable-heldout``), so the report counts what it costs in quality.
        judge_threshold: overrides the threshold the judge was trained with (higher: fewer tokens judged, less lost).
        device: where the target and the drafters run: ``cpu``, or ``cuda`` / ``cuda:N`` (the acceptance rules draw
            on the CPU either way, with the same seeded generators).
    """
    try:
        sampling = Sampling(temperature, top_p)
    except ValueError as e:
        raise DraftsmithError(str(e)) from None
    try:
        branching = tuple(int(b) for b in str(tree_branching).split(","))
    except ValueError:
        raise DraftsmithError(
            f"--tree_branching must be comma-separated integers such as 2,2,1,1, got {tree_branching!r}"
        ) from None
    rule = VerifyRule.parse(verify)
    policy = TreePolicy(
        TreeKind.parse(tree), tree_size, tree_top_k, branching=branching, replacement=rule.replacement,
        beam_width=tree_beam_width,
    )  # fmt: skip
    config = ScoreConfig(
        prompts, prompt_field, num_prompts, k, sampling, max_new_tokens, seed, online_adapt,
        policy, compile, batch_invariant, rule, judge, judge_threshold, device,
    )  # fmt: skip
    return score_specs(target, [parse_spec(d) for d in drafter], config, Path(out))


def score_specs(
    target: ResolvedTarget, drafters: list[Named], cfg: ScoreConfig, out: Path, stage: dict | None = None
) -> dict:
    """Score ``drafters`` on ``target`` as ``cfg`` says; writes ``out/report.{json,md}`` and its manifest (``stage``:
    the inputs ``is_current`` compares), returns the report."""
    check_paths(drafters)  # the cheap inputs first: a built-in target may build for minutes
    loaded_prompts = load_prompts(cfg.prompts, cfg.prompt_field, cfg.num_prompts)
    t = load_target(target, batch_invariant=cfg.batch_invariant, device=cfg.device)
    ids = [encode(p, t.tokenizer) for p in loaded_prompts]
    continuable(ids, getattr(t.config, "max_position_embeddings", None), str(cfg.prompts), every=True)
    loaded = {d.name: build_drafter(d.spec, t) for d in drafters}
    checks = [p.check for p in loaded_prompts]
    checks = checks if any(c is not None for c in checks) else None
    judges = {}
    if cfg.judge is not None:
        from draftsmith.families.judge import load_judge

        if checks is None:
            raise DraftsmithError(
                f"--judge is lossy, and prompts {cfg.prompts} carry no checks to measure what it costs: score it on "
                "builtin:checkable-heldout or prompts with a 'check' field (data/checks.py)"
            )
        head = load_judge(cfg.judge, t, cfg.judge_threshold)
        judges = {f"{d.name}+judge": head for d in drafters}
        loaded |= {f"{d.name}+judge": build_drafter(d.spec, t) for d in drafters}
    if cfg.online_adapt:
        from draftsmith.families.online.drafter import adapt_online

        loaded = adapt_online(loaded, t)
    for d in loaded.values():
        if isinstance(d, TreeDrafter):
            d.set_tree(cfg.tree, cfg.k)
    if cfg.compile:
        for compiled in [t, *loaded.values()]:
            compiled.compile()
    categories = [p.category for p in loaded_prompts]
    categories = categories if any(c is not None for c in categories) else None
    plain, rows = score_drafters(
        t, loaded, ids, cfg.k, cfg.sampling, cfg.max_new_tokens, cfg.seed, categories=categories, verify=cfg.verify,
        judges=judges, checks=checks,
    )  # fmt: skip
    report = {
        "config": {
            "prompts": cfg.prompts,
            "num_prompts": len(ids),
            "k": cfg.k,
            "temperature": cfg.sampling.temperature,
            "top_p": cfg.sampling.top_p,
            "max_new_tokens": cfg.max_new_tokens,
            "seed": cfg.seed,
            "online_adapt": cfg.online_adapt,
            "tree": str(cfg.tree.kind),
            "tree_size": cfg.tree.size if cfg.tree.kind.sized else None,
            "tree_branching": list(cfg.tree.branching) if cfg.tree.kind is TreeKind.SAMPLED else None,
            "tree_beam_width": cfg.tree.beam_width if cfg.tree.kind is TreeKind.BEAM else None,
            "verify": str(cfg.verify),
            "judge": cfg.judge,
            "judge_threshold": next(iter(judges.values())).threshold if judges else None,
            "compile": cfg.compile,
            "dtype": t.dtype,
            "batch_invariant": t.batch_invariant,
            "device": str(t.device) + (f" ({torch.cuda.get_device_name(t.device)})" if t.device.type == "cuda" else ""),
            "command": " ".join(sys.argv),
        },
        "machine": machine_record(),
        "target": t.fingerprint,
        "plain": plain.to_dict(),
        "drafters": to_dicts(rows),
    }
    write_report(out, report)
    write_manifest(out, target=t.fingerprint, seed=cfg.seed, stage=stage)
    print(markdown_table(rows, plain))
    auto = auto_k_table(rows)
    if auto:
        print(auto)
    print(f"wrote {out / 'report.json'} and report.md")
    return report
