"""TLT: a drafter that follows a target being trained (``draftsmith tlt``; ``docs/tlt.md``).

TLT (Hu et al. 2025, "Taming the Long-Tail: Efficient Reasoning RL Training with Adaptive Drafter",
arXiv:2511.16665) speeds up RL's rollouts with speculative decoding although the target changes every step: a light
drafter is trained continuously on the rollouts (``families.eagle.tlt.drafter``). This loop runs that on one machine:

1. warm-up: ``warmup_steps`` steps of rollouts of the initial target train the drafter (skipped with an ``init``);
   a copy of it is frozen there: the baseline, a drafter trained once and left as the target drifts.
2. each training step: the step's problems (``families.eagle.tlt.task``) are rolled out by speculative decoding with the adaptive
   drafter through the verifier (exact for greedy, lossless for sampling), recording the target's features; on
   measured steps the same problems are decoded with the frozen drafter and plainly (acceptance τ of each, wall
   time of each); the target takes one update (``families.eagle.tlt.policy``: SFT or GRPO, a LoRA adapter); the drafter takes its
   steps on the rollout buffer, timed apart (TLT runs them on idle GPUs; here they run between steps).
3. the end: the adapted drafter is saved as a native drafter (``draftsmith export`` takes it) for the trained target,
   saved beside it with its adapter merged.

Each step's record is a line of ``OUT/log.jsonl``; ``OUT/tlt.json`` holds the config, provenance, every record and a
summary.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.core.draft import DecodeResult, Drafter
from draftsmith.core.manifest import provenance, write_manifest
from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.decode.metrics import drafter_metrics, prompt_windows
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.families.eagle.tlt.drafter import AdaptiveDrafter, DrafterConfig, Rollout
from draftsmith.families.eagle.tlt.policy import Policy, PolicyConfig
from draftsmith.families.eagle.tlt.task import ArithmeticTask, Problem, reward
from draftsmith.targets import ResolvedTarget


@dataclass(frozen=True)
class RolloutConfig:
    """How each step's rollouts are decoded and measured."""

    problems: int = 8
    """Problems per training step (GRPO rolls each out ``policy.group`` times)."""
    max_new_tokens: int = 48
    """Longest rollout."""
    temperature: float = 0.0
    """0: greedy rollouts; > 0: sampled (GRPO needs it), verified losslessly."""
    k: int = 4
    """Tokens drafted per verification round."""
    measure_every: int = 1
    """Decode the step's rollouts with the frozen drafter and plainly every this many steps (and the last)."""

    def __post_init__(self) -> None:
        for name in ("problems", "max_new_tokens", "k", "measure_every"):
            if getattr(self, name) < 1:
                raise DraftsmithError(f"rollout.{name} must be positive, got {getattr(self, name)}")
        if not self.temperature >= 0:
            raise DraftsmithError(f"rollout.temperature must be >= 0, got {self.temperature:g}")


@dataclass(frozen=True)
class TLTConfig:
    """A TLT run: the training, the task, the target's updates, the drafter and the rollouts."""

    steps: int = 200
    """Training steps of the target."""
    warmup_steps: int = 8
    """Drafter-only steps on the initial target before training (the frozen drafter is this one)."""
    seed: int = 0
    """Seed of the rollouts' sampling and of torch."""
    task: ArithmeticTask = field(default_factory=ArithmeticTask)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup_steps < 0:
            raise DraftsmithError(
                f"steps must be positive and warmup_steps >= 0, got {self.steps}, {self.warmup_steps}"
            )
        if self.policy.update == "grpo" and self.rollout.temperature == 0:
            raise DraftsmithError("policy.update grpo samples its rollouts: set rollout.temperature > 0 (e.g. 1.0)")


def encode(target: Target, text: str) -> list[int]:
    return target.tokenizer(text, add_special_tokens=False)["input_ids"]


def rows_of(target: Target, problems: list[Problem], group: int) -> list[tuple[Problem, list[int]]]:
    """Each problem ``group`` times with its prompt's tokens."""
    return [(p, encode(target, p.prompt)) for p in problems for _ in range(group)]


def decode(
    target: Target, drafter: Drafter | None, prompts: list[list[int]], cfg: RolloutConfig, seed: int
) -> list[DecodeResult]:
    """Each prompt decoded with ``drafter`` through the verifier (None: plain decoding), prompt i seeded (seed, i)."""
    sampling = Sampling(cfg.temperature)
    decoder = SpeculativeDecoder(target, drafter, cfg.k, sampling) if drafter is not None else None
    out = []
    for i, prompt in enumerate(prompts):
        g = torch.Generator().manual_seed(seed * 100_003 + i)
        if decoder is None:
            out.append(plain_decode(target, prompt, cfg.max_new_tokens, sampling, g))
        else:
            out.append(decoder.generate(prompt, cfg.max_new_tokens, g))
    return out


def roll_out(
    target: Target, drafter: AdaptiveDrafter, prompts: list[list[int]], cfg: RolloutConfig, seed: int
) -> tuple[list[DecodeResult], list[Rollout]]:
    """The rollouts, decoded with the adaptive drafter and recorded for it."""
    recorder = drafter.recorder(target)
    sampling = Sampling(cfg.temperature)
    decoder = SpeculativeDecoder(target, recorder, cfg.k, sampling)
    results, rollouts = [], []
    for i, prompt in enumerate(prompts):
        g = torch.Generator().manual_seed(seed * 100_003 + i)
        results.append(decoder.generate(prompt, cfg.max_new_tokens, g))
        rollouts.append(recorder.take(len(prompt), len(prompt) + len(results[-1].tokens)))
    return results, rollouts


def acceptance(name: str, results: list[DecodeResult], plain: list[DecodeResult] | None, cfg: RolloutConfig) -> dict:
    """τ, α and wall time of one drafter's decodes (with plain decoding of the same prompts: speedup, exactness)."""
    if plain is None:
        pooled = prompt_windows(results, 1)[0]
        return {"tau": pooled["tau"], "alpha": pooled["alpha"], "seconds": sum(r.seconds for r in results),
                "tokens": sum(len(r.tokens) for r in results)}  # fmt: skip
    m = drafter_metrics(name, cfg.k, results, plain, cfg.temperature == 0)
    keep = ("tau", "alpha", "seconds", "tokens", "speedup", "greedy_exact", "cost_ratio")
    return {key: getattr(m, key) for key in keep}


def train_step(
    step: int, target: Target, policy: Policy, drafter: AdaptiveDrafter, frozen: Drafter, cfg: TLTConfig
) -> dict:
    """One training step (rollouts, measurements, the target's update, the drafter's): its log record."""
    rule = cfg.policy.rule(step)
    rows = rows_of(target, cfg.task.problems(cfg.rollout.problems, step), cfg.policy.group if rule == "grpo" else 1)
    prompts = [ids for _, ids in rows]
    seed = cfg.seed * 1_000_003 + cfg.warmup_steps + step
    results, rollouts = roll_out(target, drafter, prompts, cfg.rollout, seed)
    record: dict = {"step": step, "rule": rule}
    measured = step % cfg.rollout.measure_every == 0 or step == cfg.steps - 1
    plain = decode(target, None, prompts, cfg.rollout, seed) if measured else None
    record["adapted"] = acceptance("adapted", results, plain, cfg.rollout)
    if measured:
        record["frozen"] = acceptance("frozen", decode(target, frozen, prompts, cfg.rollout, seed), plain, cfg.rollout)
        record["plain"] = {"seconds": sum(r.seconds for r in plain), "tokens": sum(len(r.tokens) for r in plain)}
    completions = [target.tokenizer.decode(r.tokens, skip_special_tokens=True) for r in results]
    rewards = [reward(p, text) for (p, _), text in zip(rows, completions, strict=True)]
    record["reward"] = sum(rewards) / len(rewards)
    record["example"] = rows[0][0].prompt + completions[0]
    record["rollout_tokens"] = sum(len(r.tokens) for r in results) / len(results)
    start = time.perf_counter()
    if rule == "sft":
        eos = [target.eos_token_id] if target.eos_token_id is not None else []
        record["policy"] = policy.sft([(ids, encode(target, p.solution) + eos) for p, ids in rows])
    else:
        record["policy"] = policy.grpo([(ids, r.tokens) for (_, ids), r in zip(rows, results, strict=True)],
                                       rewards, cfg.rollout.temperature)  # fmt: skip
    record["policy"]["seconds"] = time.perf_counter() - start
    drafter.add(rollouts)
    record["drafter_update"] = drafter.update(target)
    return record


def warm_up(target: Target, drafter: AdaptiveDrafter, cfg: TLTConfig, progress: bool = True) -> list[dict]:
    """The drafter's steps on the initial target's rollouts (drawn from steps -1, -2, ...); their τ and losses."""
    records = []
    for w in tqdm(range(cfg.warmup_steps), desc="tlt warm-up", unit="step", disable=not progress):
        prompts = [ids for _, ids in rows_of(target, cfg.task.problems(cfg.rollout.problems, -1 - w), 1)]
        results, rollouts = roll_out(target, drafter, prompts, cfg.rollout, cfg.seed * 1_000_003 + w)
        drafter.add(rollouts)
        records.append(
            {"warmup": w, "tau": prompt_windows(results, 1)[0]["tau"], "drafter_update": drafter.update(target)}
        )
    return records


def summarize(records: list[dict]) -> dict:
    """Totals of the run, and the means over the measured steps of its second half (after the drift: ``tail``)."""
    measured = [r for r in records if "frozen" in r]
    last = [r for r in measured if r["step"] >= len(records) // 2] or measured[-1:]
    mean = lambda xs: sum(xs) / max(1, len(xs))  # noqa: E731
    tau_adapted, tau_frozen = mean([r["adapted"]["tau"] for r in last]), mean([r["frozen"]["tau"] for r in last])
    seconds = {name: sum(r[name]["seconds"] for r in measured) for name in ("adapted", "frozen", "plain")}
    return {
        "measured_steps": len(measured),
        "tail_steps": [r["step"] for r in last],
        "tau_adapted_tail": tau_adapted,
        "tau_frozen_tail": tau_frozen,
        "tau_ratio_tail": tau_adapted / tau_frozen if tau_frozen else None,
        "tau_adapted_first": measured[0]["adapted"]["tau"] if measured else None,
        "tau_frozen_first": measured[0]["frozen"]["tau"] if measured else None,
        "rollout_seconds": seconds,
        "speedup_adapted": seconds["plain"] / seconds["adapted"] if seconds["adapted"] else None,
        "speedup_frozen": seconds["plain"] / seconds["frozen"] if seconds["frozen"] else None,
        "drafter_update_seconds": sum(r["drafter_update"]["seconds"] for r in records),
        "policy_update_seconds": sum(r["policy"]["seconds"] for r in records),
        "reward_first": records[0]["reward"],
        "reward_last": records[-1]["reward"],
    }


def save(target: Target, policy: Policy, drafter: AdaptiveDrafter, out: Path) -> dict:
    """The trained target (adapter merged) in ``out/target`` and the adapted drafter for it in ``out/drafter``."""
    model = policy.merged()
    model.save_pretrained(out / "target")
    target.tokenizer.save_pretrained(out / "target")
    trained = Target(model, target.tokenizer, name=str((out / "target").absolute()), batch_invariant=False)
    save_native(drafter.network, trained, out / "drafter")
    return {"target": str(out / "target"), "drafter": str(out / "drafter")}


@dataclass
class TLTRun:
    """What a TLT run leaves: its record (``OUT/tlt.json``), the adapted and the frozen drafter, the trained policy."""

    record: dict
    drafter: AdaptiveDrafter
    frozen: Drafter
    policy: Policy


def run_tlt(target: Target, cfg: TLTConfig, out: Path | None = None, progress: bool = True) -> TLTRun:
    """Run TLT on ``target`` (trained in place: it gets a LoRA adapter); with ``out``, the log, the record, the
    trained target and the adapted drafter are written there."""
    torch.manual_seed(cfg.seed)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "log.jsonl").write_text("")
    drafter = AdaptiveDrafter(target, cfg.drafter)
    warm = warm_up(target, drafter, cfg, progress)
    frozen = drafter.frozen()
    policy = Policy(target, cfg.policy)
    records = []
    bar = tqdm(range(cfg.steps), desc="tlt", unit="step", disable=not progress)
    for step in bar:
        records.append(train_step(step, target, policy, drafter, frozen, cfg))
        if "frozen" in records[-1]:
            bar.set_postfix(tau=f"{records[-1]['adapted']['tau']:.2f}/{records[-1]['frozen']['tau']:.2f}")
        if out is not None:
            with open(out / "log.jsonl", "a") as f:
                f.write(json.dumps(records[-1]) + "\n")
    result = {"config": asdict(cfg), "provenance": provenance(target.fingerprint, cfg.seed), "warmup": warm,
              "steps": records, "summary": summarize(records)}  # fmt: skip
    if out is not None:
        result["saved"] = save(target, policy, drafter, out)
        (out / "tlt.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        write_manifest(out, target=target.fingerprint, seed=cfg.seed, stage={"tlt": asdict(cfg)})
    return TLTRun(result, drafter, frozen, policy)


DEFAULT_TASK, DEFAULT_POLICY, DEFAULT_DRAFTER, DEFAULT_ROLLOUT = (
    ArithmeticTask(),
    PolicyConfig(),
    DrafterConfig(),
    RolloutConfig(),
)
"""``draftsmith tlt``'s defaults (frozen: shared safely)."""


def tlt(
    target: ResolvedTarget,
    out: Path = Path("runs/tlt"),
    steps: int = 200,
    warmup_steps: int = 8,
    seed: int = 0,
    task: ArithmeticTask = DEFAULT_TASK,
    policy: PolicyConfig = DEFAULT_POLICY,
    drafter: DrafterConfig = DEFAULT_DRAFTER,
    rollout: RolloutConfig = DEFAULT_ROLLOUT,
    overwrite: bool = False,
) -> Path:
    """TLT: train a target (LoRA, SFT or GRPO) while a drafter trained on its rollouts follows it.

    The rollouts are decoded by speculative decoding with that drafter (exact, lossless); each step logs its
    acceptance and a frozen drafter's, and the rollouts' wall time with each and without speculation; the adapted
    drafter is saved at the end (``docs/tlt.md``).

    Args:
        target: ``default``, ``smollm2`` or a local Hugging Face causal-LM directory, in float32 unless ``--dtype``
            says otherwise (the adapter trains in full precision; from Python a ``targets.ResolvedTarget``:
            ``draftsmith.cli`` resolves it once).
        out: run directory: ``log.jsonl`` (a line per step), ``tlt.json``, ``target/`` (trained), ``drafter/``.
        steps: training steps of the target.
        warmup_steps: drafter-only steps on the initial target first (the frozen drafter is the result).
        seed: seed of the sampling and of torch.
        task: the addition problems (operand digits, seed).
        policy: the target's update (``sft`` or ``grpo``), learning rate, LoRA adapter, GRPO group.
        drafter: the adaptive EAGLE drafter (version, init, learning rate, steps per training step, buffer).
        rollout: problems per step, rollout length, temperature, K, how often the baselines are measured.
        overwrite: replace a finished run in ``out``.
    """
    from draftsmith.targets import load_target

    out = Path(out)
    if (out / "tlt.json").exists() and not overwrite:
        raise DraftsmithError(f"--out {out} holds a finished TLT run (pass --overwrite to replace it)")
    if out.exists() and not out.is_dir():
        raise DraftsmithError(f"--out {out} is a file, not a directory")
    cfg = TLTConfig(steps, warmup_steps, seed, task, policy, drafter, rollout)
    run = run_tlt(load_target(target), cfg, out)
    s = run.record["summary"]
    print(f"τ over the second half's measured steps: adapted {s['tau_adapted_tail']:.2f}, "
          f"frozen {s['tau_frozen_tail']:.2f}; rollouts {s['speedup_adapted']:.2f}x plain decoding's speed")  # fmt: skip
    print(f"adapted drafter: {run.record['saved']['drafter']} (for the trained target {run.record['saved']['target']})")
    return out
