"""Where one speculative round's time goes: target forward, drafter, cache crop, masks, acceptance, the rest.

    python benchmarks/profile_round.py [--target default|smollm2] [--num-prompts 10] [--tag before|after]

Decodes the prompts (greedy, K = 4) with each drafter under ``cProfile`` and splits the time of
``SpeculativeDecoder.generate`` by the functions it calls (cumulative time, attributed by caller, so a draft LM's
own cache crop counts as drafter time):
- target forward: ``Target.__call__``;
- drafter: ``begin`` + ``propose`` + ``advance``;
- cache: ``rollback`` and ``keep_positions`` of the target's cache;
- tree mask + positions: ``trees.attention_mask`` and ``trees.positions``;
- acceptance: the verification rule (``_verify`` / ``verify_tree_*``);
- host conversions: ``tolist`` / ``int`` / ``item`` called by the loop itself;
- loop bookkeeping: what is left;
and, within the parts above, HF's mask building (``create_causal_mask``) in the target's and the draft LM's forwards.
cProfile adds a cost per Python call, so the Python-heavy parts read larger than they are: the table also gives
each drafter's tokens/s without the profiler. Writes ``benchmarks/results/profile_round_<tag>.{json,md}``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from pathlib import Path

from common import HELDOUT, machine, write

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.core.trees import TreeKind
from draftsmith.data.prompts import encode, load_prompts
from draftsmith.decode.verifier import SpeculativeDecoder
from draftsmith.families.draft_lm.network import DraftLM
from draftsmith.families.ngram.drafter import NGramDrafter
from draftsmith.families.specs import load_drafter
from draftsmith.layers.tree_draft import TreeDrafter, TreePolicy
from draftsmith.targets import resolve

VERIFIER = "draftsmith/decode/verifier.py"


def drafters(target: str, target_dir: Path, k: int) -> dict:
    if target == "default":
        return {"draft LM (sibling)": DraftLM.from_pretrained(target_dir / "sibling"), "n-gram": NGramDrafter()}
    runs = Path("runs/real_target/drafters")
    out = {"draft LM (distilled)": load_drafter(str(runs / "draft_lm"), None), "n-gram": NGramDrafter()}
    for name, tree in [("EAGLE-3", TreeKind.CHAIN), ("EAGLE-3 dynamic tree", TreeKind.DYNAMIC)]:
        d = load_drafter(str(runs / "eagle3"), None)
        assert isinstance(d, TreeDrafter)
        d.set_tree(TreePolicy(tree, 16, 4), k)
        out[name] = d
    return out


def split(stats: pstats.Stats) -> dict[str, float]:
    """Seconds per category inside ``SpeculativeDecoder.generate``."""
    table = stats.stats  # (file, line, name) -> (cc, nc, tottime, cumtime, callers)

    def cum(name: str, file_part: str = "", caller_file: str = "") -> float:
        total = 0.0
        for (file, _, func), (_, _, _, ct, callers) in table.items():
            if func != name or file_part not in file:
                continue
            if not caller_file:
                total += ct
                continue
            total += sum(c[3] for (cf, _, _), c in callers.items() if caller_file in cf)
        return total

    generate = cum("generate", VERIFIER)
    parts = {
        "target forward": cum("__call__", "core/target.py"),  # only the loop calls the target
        "drafter (begin + propose + advance)": sum(cum(f, "", VERIFIER) for f in ("begin", "propose", "advance")),
        "cache crop / keep": cum("rollback", "core/target.py", VERIFIER) + cum("keep_positions", "", VERIFIER),
        "tree mask + positions": cum("attention_mask", "core/trees.py") + cum("positions", "core/trees.py"),
        "acceptance rule": cum("_verify", VERIFIER)
        + cum("verify_tree_greedy", "", VERIFIER)
        + cum("verify_tree_sampling", "", VERIFIER),
        "host conversions (tolist / int / item)": sum(
            cum(f"<method '{m}' of 'torch._C.TensorBase' objects>", "~", VERIFIER) for m in ("tolist", "item")
        )
        + cum("<built-in method builtins.int>", "~", VERIFIER),
    }
    counted = sum(v for k, v in parts.items() if not k.startswith("  "))
    parts["loop bookkeeping (the rest)"] = generate - counted
    parts["total"] = generate
    parts["  HF mask building, target and draft LM (within the above)"] = cum("create_causal_mask", "masking_utils")
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="default", choices=list(HELDOUT))
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--tag", default="after", help="results file suffix (before / after a change)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    target_dir = resolve(args.target)
    target = Target.from_pretrained(target_dir)
    prompts = [encode(p, target.tokenizer) for p in load_prompts(HELDOUT[args.target], limit=args.num_prompts)]
    results = {}
    for name, drafter in drafters(args.target, target_dir, args.k).items():
        decoder = SpeculativeDecoder(target, drafter, args.k, Sampling(0.0))
        decoder.generate(prompts[0], 8)  # warm-up
        start = time.perf_counter()
        plain = [decoder.generate(p, args.max_new_tokens) for p in prompts]
        seconds = time.perf_counter() - start
        profiler = cProfile.Profile()
        profiler.enable()
        profiled = [decoder.generate(p, args.max_new_tokens) for p in prompts]
        profiler.disable()
        assert [r.tokens for r in profiled] == [r.tokens for r in plain]
        rounds = sum(len(r.accepted) for r in plain) + len(prompts)  # verification rounds + prefills
        parts = split(pstats.Stats(profiler))
        results[name] = {
            "tokens_per_s": sum(len(r.tokens) for r in plain) / seconds,
            "rounds": rounds,
            "ms_per_round": {k: 1e3 * v / rounds for k, v in parts.items()},
        }
    data = {
        "machine": machine(),
        "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "target": args.target,
        "num_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "k": args.k,
        "tag": args.tag,
        "drafters": results,
    }
    write(f"profile_round_{args.target}_{args.tag}", data, markdown(data))


def markdown(data: dict) -> str:
    results = data["drafters"]
    names = list(results)
    md = [
        f"# One speculative round, profiled ({data['tag']}): {data['target']} target",
        "",
        f"`{data['machine']['command']}` at `{data['machine']['git']}` on {data['machine']['date']} (load average "
        f"before / after {data['load'][0]} / {data['load'][1]}). {data['num_prompts']} prompts × "
        f"{data['max_new_tokens']} tokens, greedy, K = {data['k']}. Milliseconds per round under cProfile (which "
        "inflates Python-heavy parts), prefill counted as a round; share of the total in brackets.",
        "",
        "| part | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for part in next(iter(results.values()))["ms_per_round"]:
        cells = []
        for n in names:
            ms = results[n]["ms_per_round"]
            cells.append(f"{ms[part]:.2f} ({100 * ms[part] / ms['total']:.0f}%)")
        md.append(f"| {part.strip()} | " + " | ".join(cells) + " |")
    md.append(
        "| tokens/s without the profiler | " + " | ".join(f"{results[n]['tokens_per_s']:.1f}" for n in names) + " |"
    )
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()
