"""RASD on SmolLM2-135M-Instruct: retrieval fused into a trained drafter's tree, against each of the two alone.

    python benchmarks/rasd.py [--out runs/rasd] [--drafter runs/study/drafters/eagle3-1M]
        [--corpus benchmarks/data/smollm2-1m.tar.xz] [--num-prompts 32] [--max-new-tokens 128]
        [--modes greedy sampled] [--float32]

1. ``datastore``: the training corpus (the repository's packed 1M-token corpus, the one the drafter was trained on)
   indexed as a suffix array (``draftsmith datastore``): its size and build time. The held-out sets are not in it.
2. One block per held-out set (MT-bench first turns, N / 8 per category; chat-heldout) and mode (greedy; sampled at
   T 0.7 / top-p 0.9), every decoder interleaved prompt by prompt in one run (``score_drafters``), each drafter at
   its ``--k auto`` shape for this machine (the fused tree's retrieval budget too): plain decoding of the target
   draftsmith verifies with (bf16 batch-invariant on a CPU with native bf16, else float32), plain decoding of the
   same weights with the fastest kernels (bf16 SDPA; float32 too with ``--float32``) as the fastest-plain
   reference, and on the verified target: the n-gram drafter (prompt lookup), the model drafter alone as a chain
   (named after its dir) and as a dynamic tree (``NAME tree``), and the fused drafter over the model's chain (the
   pipeline's default draft shape; retrieval adds the branches) retrieving from the context only
   (``NAME+rasd context``) and from the context and the datastore (``NAME+rasd context+datastore``). Sampled
   blocks (``--sampled-sets``) hold plain decoding of the verified target, the model drafter's chain and the fused
   drafters.

Each block is saved in ``--out`` once scored and reused, so an interrupted run resumes at the next block. Writes
``benchmarks/results/rasd_smollm2.{json,md}`` (``--results``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import RESULTS, heldout_sets, machine, measured_on, plain_lines, saved_block, smollm2_targets, write

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.datastore import build
from draftsmith.eval import blocks
from draftsmith.eval.calibration import AUTO_K
from draftsmith.eval.rows import read_block
from draftsmith.families.specs import Named, NGram, Rasd, Trained, build_drafter
from draftsmith.layers.tree_draft import TreeDrafter, TreeKind, TreePolicy

MODES = {"greedy": Sampling(), "sampled": Sampling(0.7, 0.9)}
CHAIN = TreePolicy(TreeKind.CHAIN, 16, 4)
DYNAMIC = TreePolicy(TreeKind.DYNAMIC, 16, 4)
PACKED = Path(__file__).parent / "data" / "smollm2-1m.tar.xz"


def in_repo(path: str) -> str:
    """``path`` relative to the repository where it lies inside it (a report names no machine's checkout)."""
    root = Path(__file__).resolve().parents[1]
    return str(Path(path).relative_to(root)) if Path(path).is_absolute() and Path(path).is_relative_to(root) else path


def drafters(path: str, store: Path, mode: str, tree: bool = True) -> list[tuple[Named, TreePolicy | None]]:
    """The block's drafters: (spec named after the model drafter's dir, tree policy of a tree drafter)."""
    name = Path(path).name
    chain = [(Named(name, Trained(path)), CHAIN)]
    fused = [
        (Named(f"{name}+rasd context", Rasd(path)), CHAIN),
        (Named(f"{name}+rasd context+datastore", Rasd(path, datastore=str(store))), CHAIN),
    ]
    if mode == "sampled":
        return chain + fused
    trees = [(Named(f"{name} tree", Trained(path)), DYNAMIC)] if tree else []
    return [(Named("ngram", NGram()), None), *chain, *trees, *fused]


def score_block(verified: Target, references: dict[str, Target], specs, prompts, categories, n: int, mode: str):
    """The block of ``specs`` (``drafters``) at ``--k auto`` in ``mode`` (``eval.blocks.score_block``), each tree
    drafter built with its tree policy, the ``references`` beside greedy blocks only."""
    built = {}
    for named, policy in specs:
        built[named.name] = build_drafter(named.spec, verified)
        if policy is not None and isinstance(built[named.name], TreeDrafter):
            built[named.name].set_tree(policy, 8)
    refs = references if mode == "greedy" else None  # the fastest-plain goals are greedy ones
    return blocks.score_block(verified, built, prompts, AUTO_K, MODES[mode], n, categories, refs) | {"mode": mode}


def markdown(result: dict) -> str:
    m, store = result["machine"], result["datastore"]
    lines = [
        "# RASD on SmolLM2-135M-Instruct: retrieval fused into a trained drafter's tree",
        "",
        f"{measured_on(m)}. Target `{result['target']}` ({result['dtype']}); model drafter `{result['drafter']}`; "
        f"{result['prompts']} prompts × {result['max_new_tokens']} new tokens per set. Every row of a block was "
        "decoded in one run, interleaved prompt by prompt with plain decoding of the verified target and of the "
        "fastest-kernel reference; each drafter at its `--k auto` shape for this machine (K; for the fused drafters "
        "also the retrieval budget).",
        "",
        f"Datastore: the training corpus `{in_repo(store['source'])}` ({store['rows']:,} rows, {store['tokens']:,} tokens, "
        f"{store['bytes'] / 1e6:.1f} MB), a suffix array built in {store['build_seconds']:.2f} s.",
        "",
        "| set | mode | drafter | K (model's) | τ | first-token acc. | speedup | × fastest plain | retrieval nodes / "
        "round | retrieval ms / round | accepted from retrieval | greedy exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, block in result["blocks"].items():
        plain, rows = read_block(block)
        fastest = plain.fastest
        for r in rows:
            x = r.extra or {}
            first = f"{r.accept_at[0]:.2f}" if r.accept_at else "–"
            retrieval = (
                f"{x['retrieval_nodes_per_round']:.1f} | {x['retrieval_ms_per_round']:.2f} | "
                f"{x['accepted_from_retrieval']:.0%}"
                if "retrieval_nodes_per_round" in x
                else "– | – | –"
            )
            exact = f"{r.greedy_exact}/{r.prompts}" if block["mode"] == "greedy" else "– (sampled)"
            depth = r.auto_k.model_depth if r.auto_k is not None else None
            k = f"{r.k} ({depth})" if depth is not None and depth != r.k else str(r.k)
            lines.append(
                f"| {key.split(' ')[0]} | {block['mode']} | {r.name} | {k} | {r.tau:.2f} | {first} | "
                f"{r.speedup:.2f}× | {r.tokens_per_s / fastest.tokens_per_s:.2f}× | {retrieval} | {exact} |"
            )
    lines += plain_lines(result["blocks"])
    lines += ["", "## Goals (issue 53)", ""]
    for line in goals(result):
        lines.append(f"- {line}")
    lines += [
        "",
        "speedup: over plain decoding of the verified target (same dtype and numerics). × fastest plain: the "
        "drafter's tokens/s over the fastest plain decoding of the block (the fastest-kernel reference where it is "
        "faster). accepted from retrieval: the share of the fused drafter's accepted draft tokens that retrieval "
        "added. K (model's): the round's depth, retrieval's deepest path, and in brackets the model drafter's own "
        "depth where it drafts shallower (its `--k auto` K alone; `rasd:depth=`).",
    ]
    return "\n".join(lines) + "\n"


def goals(result: dict) -> list[str]:
    """Issue 53's goals, each with the block's figures (greedy blocks)."""
    out = []
    for key, block in result["blocks"].items():
        if block["mode"] != "greedy":
            continue
        plain, rows = read_block(block)
        by = {r.name: r for r in rows}
        name = Path(result["drafter"]).name
        fused = max((r for r in rows if "+rasd" in r.name), key=lambda r: r.tokens_per_s)
        model = max((by[n] for n in (name, f"{name} tree") if n in by), key=lambda r: r.tokens_per_s)
        ngram = by["ngram"]
        over_fastest = fused.tokens_per_s / plain.fastest.tokens_per_s
        out.append(
            f"{key}: fastest fused ({fused.name}) {fused.tokens_per_s / ngram.tokens_per_s:.2f}× the n-gram and "
            f"{fused.tokens_per_s / model.tokens_per_s:.2f}× the model drafter alone ({model.name}) (goal ≥ 1.25× "
            f"each); {over_fastest:.2f}× the fastest plain decoding (goal ≥ "
            f"{1.6 if key.startswith('mt-bench') else 2.0}×)"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/rasd"))
    parser.add_argument("--drafter", default="runs/study/drafters/eagle3-1M", help="a trained tree drafter")
    parser.add_argument("--corpus", default=str(PACKED), help="the corpus the datastore indexes")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--modes", nargs="+", default=["greedy", "sampled"], choices=list(MODES))
    parser.add_argument("--sets", nargs="+", default=["mt-bench", "chat-heldout"], choices=["mt-bench", "chat-heldout"])
    parser.add_argument("--sampled-sets", nargs="+", default=["chat-heldout"], choices=["mt-bench", "chat-heldout"])
    parser.add_argument("--no-tree", action="store_true", help="without the model drafter's dynamic-tree row")
    parser.add_argument("--float32", action="store_true", help="float32 plain decoding as a reference too")
    parser.add_argument("--results", default="rasd_smollm2")
    args = parser.parse_args()
    if not (Path(args.drafter) / "config.json").is_file():
        parser.error(f"--drafter {args.drafter}: not a trained drafter's dir (no config.json)")
    if not Path(args.corpus).exists():
        parser.error(f"--corpus {args.corpus}: no such file or directory")

    store_dir = args.out / "train.datastore"
    if not (store_dir / "datastore.json").is_file():
        built = build(args.corpus, store_dir)
        print(
            f"datastore {store_dir}: {built.rows:,} rows, {built.tokens:,} tokens, built in {built.build_seconds:.2f} s"
        )
    record = json.loads((store_dir / "datastore.json").read_text())
    store = record | {"source": in_repo(record["source"]), "bytes": sum(f.stat().st_size for f in store_dir.iterdir())}

    dtype, verified, references = smollm2_targets(args.float32)
    tokenizer = verified.tokenizer
    sets = heldout_sets(tokenizer, args.num_prompts)
    blocks = {}
    for mode in args.modes:
        for set_name, (prompts, categories) in sets.items():
            if set_name not in (args.sampled_sets if mode == "sampled" else args.sets):
                continue
            specs = drafters(args.drafter, store_dir, mode, tree=not args.no_tree)
            blocks[f"{set_name} {mode}"] = saved_block(
                args.out / f"{set_name}-{mode}.json",
                [named.name for named, _ in specs],
                lambda: score_block(verified, references, specs, prompts, categories, args.max_new_tokens, mode),  # noqa: B023
            )
    result = {
        "machine": machine(),
        "target": "smollm2",
        "dtype": dtype,
        "drafter": args.drafter,
        "datastore": store,
        "prompts": args.num_prompts,
        "max_new_tokens": args.max_new_tokens,
        "blocks": blocks,
    }
    write(args.results, result, markdown(result), RESULTS)


if __name__ == "__main__":
    main()
