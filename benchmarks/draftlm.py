"""Distilled draft LMs on the default target: which divergence, and does on-policy data help?

Run: ``flock /tmp/draftsmith-bench.lock .venv/bin/python benchmarks/draftlm.py [--pretrain-steps 300]
[--distill-steps 150] [--score-prompts 20]``.

One fresh ~1.5M-parameter Llama student is pre-trained on the target's corpus (FastDraft's first
stage; the "undistilled" draft LM), then distilled from that same checkpoint with forward KL, reverse
KL, JSD(0.5) and TVD++, each off-policy (λ = 0: the target's sampled continuations of built-in
prompts) and on-policy (λ = 0.5: half the batches' continuations sampled by the student, labelled by
the target online). All are scored in one verifier run (greedy, K = 4) on held-out prompts whose greedy
continuations are also the validation data ``val/tau_est`` selects checkpoints on.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from common import machine, prompt_ids, write

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.eval.report import markdown_table
from draftsmith.eval.rows import block_dicts, read_block
from draftsmith.eval.score import score_drafters
from draftsmith.families.draft_lm.train import DraftLMBudget, distill, export_pretrained, pretrain
from draftsmith.families.registry import load_network
from draftsmith.targets import default as default_target
from draftsmith.targets import resolve_target
from draftsmith.train.suite import Budget, make_data


def markdown(result: dict) -> str:
    m, args, fits, load = result["machine"], result["args"], result["fits"], result["load_average"]
    lines = [
        "| draft LM | stage | loss | λ | steps | fit time | val/tau_est (= verifier full-round τ on the val text) "
        "| verifier τ | speedup |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, fit in fits.items():
        measured = f"{fit['verifier_tau']:.2f} | {fit['speedup']:.2f}×" if "verifier_tau" in fit else "– | –"
        took = "(earlier run)" if fit.get("reused") else f"{fit['seconds']:.0f} s"
        lines.append(
            f"| {name} | {fit['stage']} | {fit.get('loss', 'ce')} | {fit.get('on_policy', '–')} "
            f"| {fit['steps']} | {took} | {fit['val_tau_est']:.3f} | {measured} |"
        )
    plain, rows = read_block(result)
    scored = [r.name for r in rows]
    target = f" Target: {result['target_params'] / 1e6:.1f}M parameters." if "target_params" in result else ""
    return (
        "## Distilled draft LMs on the default target\n\n"
        f"`{m['command']}` on {m['date']} ({m['platform']}, {m['threads']} threads, git {m['git']}). "
        f"The machine had other work on it (load average {load[0]:.1f} on 2 cores at the end), so fit times "
        "and tokens/s are noisy; τ is not affected.\n\n"
        f"Student: {fits['pretrained (undistilled)']['params'] / 1e6:.2f}M parameters (2 layers, hidden 128), "
        f"pre-trained {args['pretrain_steps']} steps × 16 × 128 corpus tokens, then distilled "
        f"{args['distill_steps']} steps × 8 sequences from that checkpoint.{target}\n\n"
        + "\n".join(lines)
        + f"\n\nval/tau_est replays the verifier's greedy rounds on the target's greedy continuations of the "
        f"{args['val_prompts']} held-out prompts (equal to the verifier's full-round τ on that text, tested in "
        f"tests/test_draft_lm.py); the verifier itself decoded {', '.join(scored)} below.\n\n"
        f"### Verifier, same run (greedy, K = {args['k']}, {result.get('scored_prompts', args['score_prompts'])} "
        f"held-out prompts × {args['new_tokens']} tokens)\n\n" + markdown_table(rows, plain) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pretrain-steps", type=int, default=300)
    parser.add_argument("--distill-steps", type=int, default=150)
    parser.add_argument("--losses", nargs="+", default=["fkl", "rkl", "jsd", "tvd++"])
    parser.add_argument("--on-policy", type=float, nargs="+", default=[0.0, 0.5])
    parser.add_argument("--on-policy-losses", nargs="+", default=None, help="losses run with λ > 0 (default: all)")
    parser.add_argument("--train-prompts", type=int, default=1000)
    parser.add_argument("--val-prompts", type=int, default=20, help="held-out prompts of the validation data")
    parser.add_argument("--score-prompts", type=int, default=20, help="the first N of them the verifier decodes")
    parser.add_argument("--score", nargs="*", default=None, help="draft LMs the verifier runs (default: all)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--data-root", type=Path, default=Path("runs/bench-train"), help="reuses its data/ if current")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-draftlm"))
    parser.add_argument("--reuse-pretrain", action="store_true", help="keep OUT's pre-trained checkpoint if present")
    parser.add_argument("--reuse-distilled", action="store_true", help="keep OUT's distilled exports if present")
    args = parser.parse_args()
    budget = DraftLMBudget(pretrain_steps=args.pretrain_steps, distill_steps=args.distill_steps)

    target_dir = default_target.build()
    resolved = resolve_target(target_dir, quiet=True)
    data = make_data(resolved, args.data_root, Budget(args.train_prompts, args.new_tokens, args.val_prompts))
    target = Target.from_pretrained(target_dir)
    fits, exports = {}, {}
    start = time.perf_counter()
    reused = args.reuse_pretrain and (args.out / "fit" / "draft_lm_pretrain" / "best.ckpt").is_file()
    init = pretrain(resolved, data[1], args.out, budget, force=not args.reuse_pretrain)
    fits["pretrained (undistilled)"] = {"stage": "pretrain", "seconds": round(time.perf_counter() - start, 1),
                                        "steps": args.pretrain_steps, "reused": reused}  # fmt: skip
    exports["pretrained (undistilled)"] = export_pretrained(resolved, init, args.out)
    for on_policy in args.on_policy:
        for loss in args.losses if on_policy == 0 or args.on_policy_losses is None else args.on_policy_losses:
            name = f"{loss} λ={on_policy:g}"
            start = time.perf_counter()
            slug = f"{loss.replace('+', 'p')}_lambda{on_policy:g}"
            reused = args.reuse_distilled and (args.out / "drafters" / slug / "model.safetensors").is_file()
            exports[name] = distill(
                resolved, data, init, args.out, slug, loss, on_policy, budget, force=not args.reuse_distilled
            )
            fits[name] = {"stage": "distill", "loss": loss, "on_policy": on_policy, "steps": args.distill_steps,
                          "seconds": round(time.perf_counter() - start, 1), "reused": reused}  # fmt: skip
    drafters = {}
    for name, path in exports.items():
        network, info = load_network(path, target)
        fits[name]["val_tau_est"] = info["val_tau_est"]
        fits[name]["params"] = sum(p.numel() for p in network.parameters())
        if args.score is None or name in args.score:
            drafters[name] = network.as_drafter()
    prompts = prompt_ids("builtin:heldout", target.tokenizer, args.score_prompts)
    plain, rows = score_drafters(target, drafters, prompts, args.k, Sampling(), args.new_tokens)
    scored = {row.name: row for row in rows}
    for name, fit in fits.items():
        if name in scored:
            fit["verifier_tau"], fit["speedup"] = scored[name].tau, scored[name].speedup
    data_out = {"machine": machine(), "target": target.fingerprint, "args": {k: str(v) for k, v in vars(args).items()},
                "fits": fits, **block_dicts(plain, rows), "load_average": os.getloadavg(),
                "target_params": sum(p.numel() for p in target.model.parameters()),
                "scored_prompts": len(prompts)}  # fmt: skip
    md = markdown(data_out)
    write("draftlm", data_out, md)


if __name__ == "__main__":
    main()
