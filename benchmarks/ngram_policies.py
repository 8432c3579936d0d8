"""Which prompt-lookup policy drafts best: where HF's τ advantage came from, and what draftsmith's n-gram drafter does.

    python benchmarks/ngram_policies.py [--target default|smollm2] [--num-prompts 20] [-k 4]

Every policy looks up the context's last n-gram (longest first, N = 3 down to 1) and differs in which earlier
occurrence it copies from and how far:
- earliest: the first occurrence, a slice of at most K tokens (HF prompt lookup's rule);
- latest: the most recent occurrence, a slice (draftsmith's rule before this benchmark);
- longest context: the occurrence whose match extends furthest back (ties: the latest), a slice;
- latest / earliest, copied on: as above, but a match close to the end copies on through its own draft (LZ77), so
  it drafts K tokens: draftsmith's rule now (``NGramDrafter``).
Greedy, so τ is deterministic and no timing is taken. Writes ``benchmarks/results/ngram_policies.{json,md}``.
"""

from __future__ import annotations

import argparse

import torch
from common import HELDOUT, machine, write

from draftsmith.core.draft import Draft
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.prompts import encode, load_prompts
from draftsmith.decode.verifier import SpeculativeDecoder
from draftsmith.families.ngram.drafter import NGramDrafter, NGramState, continuation
from draftsmith.targets import resolve


class Policy(NGramDrafter):
    """A lookup by scanning the whole context (slow, but every rule is a few lines)."""

    def __init__(self, pick: str, copy_on: bool, max_ngram: int = 3) -> None:
        super().__init__(max_ngram=max_ngram)
        self.pick, self.copy_on = pick, copy_on

    def propose(self, state: NGramState, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        ids, end = state.ids, len(state.ids)
        for n in range(min(self.max_ngram, end - 1), 0, -1):
            starts = [s for s in range(n, end) if ids[s - n : s] == ids[-n:]]
            if starts:
                if self.pick == "earliest":
                    start = starts[0]
                elif self.pick == "latest":
                    start = starts[-1]
                else:
                    start = max(starts, key=lambda s: (self.context(ids, s), s))
                return Draft.chain(continuation(ids, start, k) if self.copy_on else ids[start : start + k])
        return Draft.empty()

    @staticmethod
    def context(ids: list[int], start: int) -> int:
        """How many tokens before ``start`` equal the tokens before the end of ``ids``."""
        m = 0
        while m < start and ids[start - 1 - m] == ids[-1 - m]:
            m += 1
        return m


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="default", choices=list(HELDOUT))
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("-k", type=int, default=4)
    args = parser.parse_args()
    target = Target.from_pretrained(resolve(args.target))
    prompts = [encode(p, target.tokenizer) for p in load_prompts(HELDOUT[args.target], limit=args.num_prompts)]
    policies = {
        "earliest (HF prompt lookup)": Policy("earliest", copy_on=False),
        "latest (draftsmith before)": Policy("latest", copy_on=False),
        "longest context": Policy("longest", copy_on=False),
        "earliest, copied on": Policy("earliest", copy_on=True),
        "latest, copied on": Policy("latest", copy_on=True),
        "draftsmith NGramDrafter (now)": NGramDrafter(max_ngram=3),
        "draftsmith, N = 3 down to 2 only": NGramDrafter(max_ngram=3, min_ngram=2),
    }
    rows = {}
    for name, drafter in policies.items():
        decoder = SpeculativeDecoder(target, drafter, args.k, Sampling(0.0))
        results = [decoder.generate(p, args.max_new_tokens) for p in prompts]
        rounds = sum(len(r.accepted) for r in results)
        rows[name] = {
            "tau": (sum(sum(r.accepted) for r in results) + rounds) / rounds,
            "tokens_per_forward": sum(len(r.tokens) for r in results) / sum(r.target_calls for r in results),
            "mean_drafted": sum(sum(r.drafted) for r in results) / rounds,
        }
    data = {"machine": machine(), "target": args.target, "num_prompts": len(prompts), "k": args.k, "rows": rows,
            "max_new_tokens": args.max_new_tokens}  # fmt: skip
    write("ngram_policies" if args.target == "default" else f"ngram_policies_{args.target}", data, markdown(data))


def markdown(result: dict) -> str:
    m, rows = result["machine"], result["rows"]
    md = [
        f"# Prompt-lookup policies: {result['target']} target",
        "",
        f"`{m['command']}` at `{m['git']}` on {m['date']}. "
        f"{result['num_prompts']} prompts from `{HELDOUT[result['target']]}` × {result['max_new_tokens']} tokens, greedy, "
        f"K = {result['k']}, N = 3 down to 1 (but the last row). τ per verification round; tokens per target forward "
        "counts the prefill too (the τ of `baselines.md`).",
        "",
        "| policy | τ | tokens / target forward | drafted / round |",
        "|---|---|---|---|",
        *[
            f"| {n} | {r['tau']:.2f} | {r['tokens_per_forward']:.2f} | {r['mean_drafted']:.2f} |"
            for n, r in rows.items()
        ],
    ]
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()
