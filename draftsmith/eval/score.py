"""``draftsmith score``: run plain and speculative decoding side by side and report α, τ, speedup."""

from __future__ import annotations

import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.core.draft import Drafter
from draftsmith.core.manifest import write_manifest
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target, rollback
from draftsmith.data.prompts import encode, load_prompts
from draftsmith.errors import DraftsmithError
from draftsmith.eval.metrics import drafter_metrics, plain_metrics
from draftsmith.eval.report import markdown_table, write_report
from draftsmith.eval.verifier import SpeculativeDecoder, check_compatible, plain_decode
from draftsmith.families.specs import Named, build_drafter, parse_spec
from draftsmith.layers.tree_draft import TreeDrafter, TreePolicy
from draftsmith.targets import load_target


def score_drafters(
    target: Target,
    drafters: dict[str, Drafter],
    prompts: list[list[int]],
    k: int,
    sampling: Sampling,
    max_new_tokens: int,
    seed: int = 0,
    progress: bool = True,
) -> tuple[dict, list[dict]]:
    """Decode every prompt plainly and with each drafter, interleaved so all see the same machine state.

    A drafter that fine-tuned its target (``own_target``, Medusa-2) decodes with that target and is
    compared with plain decoding of it, in the same interleaved loop.

    Returns:
        (plain metrics of ``target``, per-drafter metrics) as dicts.
    """
    targets = {name: d.own_target or target for name, d in drafters.items()}
    for name, drafter in drafters.items():
        check_compatible(targets[name], drafter, name)
    decoders = {name: SpeculativeDecoder(targets[name], d, k, sampling) for name, d in drafters.items()}
    baselines = {id(t): t for t in [target, *targets.values()]}
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
    ratios, _ = verify_ratios(target, prompts[0], sorted({k + 1, *(most_verified(d, k) for d in drafters.values())}))
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
        m = drafter_metrics(name, k, spec[name], plain[id(targets[name])], sampling.greedy, ratios).to_dict()
        m["prompts"] = len(prompts)
        m |= drafters[name].extra_metrics(spec[name])  # --online-adapt: α and τ over time
        if targets[name] is not target:
            m["target"] = targets[name].name
        rows.append(m)
    return plain_metrics(plain[id(target)]).to_dict(), rows


def most_verified(drafter: Drafter, k: int) -> int:
    """The most tokens one verification forward of ``drafter``'s rounds holds (its drafts + 1)."""
    from draftsmith.families.ngram.drafter import NGramDrafter

    if isinstance(drafter, TreeDrafter) and drafter.tree.kind != "chain":
        return drafter.tree.size + 1
    if isinstance(drafter, NGramDrafter):
        return k * drafter.width + 1
    return k + 1


@torch.no_grad()
def verify_ratios(
    target: Target, prompt: list[int], counts: list[int], repeats: int = 7
) -> tuple[dict[int, float], float]:
    """r(m): the median time of a target forward of m new tokens over that of 1 token, on the same cached context
    (the prompt), interleaved: what verifying a round of m - 1 drafted tokens costs in decode steps.

    Returns:
        ({m: r(m)} for m in ``counts`` and 1, the median seconds of the 1-token forward).
    """
    cache = target.new_cache()
    target(torch.tensor([prompt]), cache, with_features=False)
    n = cache.get_seq_length()
    times: dict[int, list[float]] = {m: [] for m in sorted({1, *counts})}
    for _ in range(repeats):
        for m in times:
            ids = torch.tensor([prompt[-1:] * m])
            start = time.perf_counter()
            target(ids, cache, with_features=False)
            times[m].append(time.perf_counter() - start)
            rollback(cache, n)
    step = statistics.median(times[1])
    return {m: statistics.median(t) / step for m, t in times.items()}, step


@dataclass(frozen=True)
class ScoreConfig:
    """How drafters are scored (``draftsmith score``'s flags)."""

    prompts: str = "builtin:heldout"
    """``builtin:heldout``, a JSONL file or a local dataset."""
    prompt_field: str = "prompt"
    """The prompt's field name in JSONL / dataset sources."""
    num_prompts: int = 20
    """How many prompts to use (the first N)."""
    k: int = 4
    """Tokens drafted per round."""
    sampling: Sampling = Sampling(0.0)
    """Greedy (temperature 0) or lossless speculative sampling at this temperature / top-p."""
    max_new_tokens: int = 64
    """Tokens generated per prompt."""
    seed: int = 0
    """Seed of the per-prompt random generators."""
    online_adapt: bool = False
    """Online speculative decoding: each draft LM learns from its rejected positions while it decodes."""
    tree: TreePolicy = TreePolicy("chain", 16, 4)
    """How EAGLE, Medusa and Hydra drafters draft (chain, static or dynamic tree)."""
    compile: bool = False
    """``torch.compile`` the target's and the draft LMs' forwards (``Target.compile``), for plain and speculative
    decoding alike: pays on small models, whose eager forward is mostly Python and dispatch overhead."""

    def __post_init__(self) -> None:
        if self.k <= 0:
            raise DraftsmithError(f"-k must be a positive integer, got {self.k}")
        if self.max_new_tokens <= 0:
            raise DraftsmithError(f"--max-new-tokens must be positive, got {self.max_new_tokens}")


def score(
    target: str,
    drafter: list[str],
    prompts: str = "builtin:heldout",
    k: int = 4,
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
) -> dict:
    """Score drafters against a target by real speculative decoding.

    Args:
        target: local Hugging Face model directory of the target.
        drafter: one or more drafters, each ``[NAME=]SPEC`` with SPEC ``ngram[:N]``, ``target``, a
            trained drafter's ``.ckpt`` or native dir, or a Hugging Face draft-model directory.
        prompts: ``builtin:heldout``, a JSONL file or a local dataset.
        k: tokens drafted per round.
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
            their held-out top-k accuracies) or ``dynamic`` (EAGLE-2: grown by draft confidence).
            Drafters that cannot grow trees draft as their spec says.
        tree_size: tree nodes (drafted tokens) per round.
        tree_top_k: dynamic trees: nodes expanded per depth, children per expanded node.
        compile: ``torch.compile`` the target's and the draft LMs' forwards (plain decoding included); a warm-up
            (the first two prompts, decoded untimed before the scored pass) pays the compilation.
    """
    try:
        sampling = Sampling(temperature, top_p)
    except ValueError as e:
        raise DraftsmithError(str(e)) from None
    config = ScoreConfig(
        prompts, prompt_field, num_prompts, k, sampling, max_new_tokens, seed, online_adapt,
        TreePolicy(tree, tree_size, tree_top_k), compile,
    )  # fmt: skip
    return score_specs(target, [parse_spec(d) for d in drafter], config, Path(out))


def score_specs(
    target: str | Path, drafters: list[Named], cfg: ScoreConfig, out: Path, stage: dict | None = None
) -> dict:
    """Score ``drafters`` on ``target`` (a built-in name or model dir) as ``cfg`` says; writes
    ``out/report.{json,md}`` and its manifest (``stage``: the inputs ``is_current`` compares), returns the report."""
    t = load_target(target)
    loaded = {d.name: build_drafter(d.spec, t) for d in drafters}
    if cfg.online_adapt:
        from draftsmith.families.online.drafter import adapt_online

        loaded = adapt_online(loaded, t)
    for d in loaded.values():
        if isinstance(d, TreeDrafter):
            d.set_tree(cfg.tree, cfg.k)
    if cfg.compile:
        for compiled in [t, *loaded.values()]:
            compiled.compile()
    ids = [encode(p, t.tokenizer) for p in load_prompts(cfg.prompts, cfg.prompt_field, cfg.num_prompts)]
    plain, rows = score_drafters(t, loaded, ids, cfg.k, cfg.sampling, cfg.max_new_tokens, cfg.seed)
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
            "tree": cfg.tree.kind,
            "tree_size": cfg.tree.size if cfg.tree.kind != "chain" else None,
            "compile": cfg.compile,
            "command": " ".join(sys.argv),
        },
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "target": t.fingerprint,
        "plain": plain,
        "drafters": rows,
    }
    write_report(out, report)
    write_manifest(out, target=t.fingerprint, seed=cfg.seed, stage=stage)
    print(markdown_table(rows, plain))
    print(f"wrote {out / 'report.json'} and report.md")
    return report
