"""TLT: a drafter trained on the rollouts follows a target being trained; the rollouts stay exact and lossless."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_llama
from test_verifier import SMALL_V, depth_pvalues
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from draftsmith.cli import main
from draftsmith.core.draft import Draft
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.decode.verifier import plain_decode
from draftsmith.families.eagle.tlt import drafter as tlt_drafter
from draftsmith.families.eagle.tlt.drafter import AdaptiveDrafter, DrafterConfig, Recorder
from draftsmith.families.eagle.tlt.policy import Policy, PolicyConfig
from draftsmith.families.eagle.tlt.task import ArithmeticTask, problem, reward
from draftsmith.families.eagle.tlt.train import RolloutConfig, TLTConfig, roll_out, run_tlt
from draftsmith.families.registry import load_trained

pytestmark = pytest.mark.usefixtures("one_thread")

V = 32
EOS = V - 2


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of the addition task (digits, ``+``, ``=``, ``;``), filler words up to ``V``."""
    chars = list("0123456789+=;")
    words = {c: i for i, c in enumerate(chars)} | {f"x{i}": i for i in range(len(chars), V - 2)}
    words |= {"<eos>": EOS, "<unk>": V - 1}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>")


def tiny_target(seed: int = 0) -> Target:
    return Target(make_llama(seed=seed, vocab=V, eos=EOS), char_tokenizer(), name="tiny-arith")


DRIFT = TLTConfig(
    steps=12,
    warmup_steps=6,
    policy=PolicyConfig(lr=1e-2),
    drafter=DrafterConfig(steps=16, lr=1e-2),
    rollout=RolloutConfig(problems=4, max_new_tokens=16, measure_every=4),
)
"""A tiny target that SFT moves far in 12 steps, a drafter warmed up on it for 6."""


@pytest.fixture(scope="module")
def drift():
    target = tiny_target()
    before = {p: plain_decode(target, ids, 16, Sampling()).tokens for p, ids in prompts_of(target, 99)}
    run = run_tlt(target, DRIFT, progress=False)
    return target, run, before


def prompts_of(target: Target, step: int) -> list[tuple[str, list[int]]]:
    problems = ArithmeticTask().problems(4, step)
    return [(p.prompt, target.tokenizer(p.prompt, add_special_tokens=False)["input_ids"]) for p in problems]


def test_addition_problems_have_worked_solutions_and_a_checked_answer():
    p = problem(48, 37)
    assert (p.prompt, p.solution, p.answer) == ("48+37=", "8+7=15;4+3+1=8;85", 85)
    assert problem(5, 7).solution == "5+7=12;12" and problem(91, 9).solution == "1+9=10;9+0+1=10;100"
    assert reward(p, "8 + 7 = 1 5 ; 4 + 3 + 1 = 8 ; 8 5") == 1.0  # a char-level tokenizer decodes with spaces
    assert reward(p, "8+7=15;4+3+1=8;86") == 0.0 and reward(p, "") == 0.0
    task = ArithmeticTask(digits=3)
    assert task.problems(5, 2) == task.problems(5, 2) != task.problems(5, 3)
    assert all(100 <= int(q.prompt.split("+")[0]) <= 999 for q in task.problems(20, 0))


def test_adapted_drafter_accepts_more_than_the_frozen_one_after_the_target_moves(drift):
    target, run, before = drift
    measured = [r for r in run.record["steps"] if "frozen" in r]
    assert [r["step"] for r in measured] == [0, 4, 8, 11]
    first, last = measured[0], measured[-1]
    # step 0: the frozen drafter is the adapted one before any training step (same weights, same rollouts)
    assert first["adapted"]["tau"] == first["frozen"]["tau"] > 1.3
    # the target moved: its SFT loss fell and its greedy rollouts of held-out problems changed
    assert run.record["steps"][-1]["policy"]["loss"] < 0.7 * first["policy"]["loss"]
    after = {p: plain_decode(target, ids, 16, Sampling()).tokens for p, ids in prompts_of(target, 99)}
    assert sum(after[p] != before[p] for p in before) >= 3
    # after the drift: the frozen drafter lost its acceptance; the adapted one kept more than 1.3x of it
    tail = run.record["summary"]
    assert tail["tau_frozen_tail"] < first["frozen"]["tau"] - 0.2
    assert tail["tau_adapted_tail"] > 1.3 * tail["tau_frozen_tail"]
    assert last["adapted"]["tau"] > last["frozen"]["tau"]
    assert all(r["drafter_update"]["steps"] == DRIFT.drafter.steps for r in run.record["steps"])


def test_a_drafter_that_never_learns_accepts_as_the_frozen_one():
    """The drift experiment's control: without drafter steps the adapted drafter is the frozen one at every step."""
    cfg = TLTConfig(steps=5, warmup_steps=1, policy=DRIFT.policy, drafter=DrafterConfig(steps=0),
                    rollout=RolloutConfig(problems=2, max_new_tokens=12, measure_every=2))  # fmt: skip
    run = run_tlt(tiny_target(), cfg, progress=False)
    measured = [r for r in run.record["steps"] if "frozen" in r]
    assert len(measured) == 3 and all(r["adapted"]["tau"] == r["frozen"]["tau"] for r in measured)
    assert all(r["drafter_update"]["steps"] == 0 for r in run.record["steps"])


def test_greedy_rollouts_equal_plain_greedy_of_the_current_target_weights(drift):
    target, run, _ = drift
    assert all(r["adapted"]["greedy_exact"] == r["frozen"]["greedy_exact"] == 4 for r in run.record["steps"]
               if "frozen" in r)  # fmt: skip
    merged = run.policy.merged()  # the trained weights without peft: an independent forward
    prompts = [ids for _, ids in prompts_of(target, 123)]
    results, rollouts = roll_out(target, run.drafter, prompts, RolloutConfig(max_new_tokens=20, k=3), seed=0)
    for prompt, result, rollout in zip(prompts, results, rollouts, strict=True):
        assert result.tokens == plain_decode(target, prompt, 20, Sampling()).tokens
        hf = merged.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=EOS)
        assert result.tokens == hf[0, len(prompt) :].tolist()
        assert rollout.ids == prompt + result.tokens and sum(result.accepted) > 0


def test_recorded_features_are_the_targets_states_at_each_rollout_position(drift):
    target, run, _ = drift
    prompts = [ids for _, ids in prompts_of(target, 7)]
    _, rollouts = roll_out(target, run.drafter, prompts, RolloutConfig(max_new_tokens=14, k=4), seed=0)
    for r in rollouts:
        full = target(torch.tensor([r.ids]), feature_layers=(target.num_layers,))
        assert r.features[0].shape == (len(r.ids) - 1, target.hidden_size)
        torch.testing.assert_close(r.final, full.features[0][0, :-1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(r.features[0], r.final)  # EAGLE-1 reads the final state itself


def test_eagle3_drafter_records_its_own_layers_and_the_final_state():
    target = tiny_target()
    drafter = AdaptiveDrafter(target, DrafterConfig(version=3, steps=2))
    recorder = drafter.recorder(target)
    assert recorder.feature_layers == (*drafter.network.cfg.feature_layers, target.num_layers)
    prompts = [ids for _, ids in prompts_of(target, 0)]
    _, rollouts = roll_out(target, drafter, prompts, RolloutConfig(max_new_tokens=10), seed=0)
    r = rollouts[0]
    full = target(torch.tensor([r.ids]), feature_layers=recorder.feature_layers)
    for mine, theirs in zip((*r.features, r.final), full.features, strict=True):
        torch.testing.assert_close(mine, theirs[0, :-1], atol=1e-4, rtol=1e-4)
    trained = [p for p in drafter.network.parameters() if p.requires_grad]
    before = [p.clone() for p in trained]
    drafter.add(rollouts)
    assert drafter.update(target)["steps"] == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, trained, strict=True))


class GreedyDrafts(Recorder):
    """A broken recorder: it hands the verifier q's most likely tokens as the drafts, with q as what they were drawn
    from (they were not: dropping q altogether would stay lossless, a point mass being a valid q for any token)."""

    def propose(self, state, k, sampling, generator):
        draft = super().propose(state, k, sampling, generator)
        return Draft(draft.q.argmax(-1), draft.parents, draft.q)


def small_tlt_pair() -> tuple[Target, AdaptiveDrafter]:
    """A soft small-vocabulary target with a LoRA adapter moved by SFT, and an adaptive drafter trained a little."""
    target = Target(make_llama(seed=11, layers=1, hidden=32, vocab=SMALL_V))
    target.model.lm_head.weight.data.mul_(0.15)
    drafter = AdaptiveDrafter(target, DrafterConfig(steps=3, lr=1e-2))
    policy = Policy(target, PolicyConfig(lr=5e-2))
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        policy.sft([([1, 2, 3], torch.randint(0, SMALL_V, (4,), generator=g).tolist()) for _ in range(4)])
    _, rollouts = roll_out(target, drafter, [[1, 2, 3]] * 4, RolloutConfig(max_new_tokens=8, temperature=1.0), 1)
    drafter.add(rollouts)
    drafter.update(target)
    return target, drafter


def sampled_rollout_triples(target: Target, drafter: AdaptiveDrafter, n: int) -> torch.Tensor:
    """Counts of the first three tokens of ``n`` sampled TLT rollouts of [1, 2, 3] (K = 2: depths 1 and 2 decide
    x2 and x3)."""
    cfg = RolloutConfig(max_new_tokens=4, temperature=1.0, k=2)
    results, _ = roll_out(target, drafter, [[1, 2, 3]] * n, cfg, seed=5)
    counts = torch.zeros(SMALL_V, SMALL_V, SMALL_V)
    for r in results:
        counts[tuple(r.tokens[:3])] += 1
    return counts


def test_sampled_rollouts_are_distributed_as_the_current_target(monkeypatch):
    target, drafter = small_tlt_pair()
    depth1, depth2 = depth_pvalues(target, [1, 2, 3], Sampling(1.0), sampled_rollout_triples(target, drafter, 800))
    assert depth1 > 1e-3 and depth2 > 1e-3, (depth1, depth2)
    monkeypatch.setattr(tlt_drafter, "Recorder", GreedyDrafts)
    depth1, depth2 = depth_pvalues(target, [1, 2, 3], Sampling(1.0), sampled_rollout_triples(target, drafter, 800))
    assert min(depth1, depth2) < 1e-3, (depth1, depth2)


def test_grpo_step_moves_the_policy_toward_rewarded_rollouts_and_skips_equal_rewards():
    target = Target(make_llama(seed=1, vocab=V, eos=EOS))
    policy = Policy(target, PolicyConfig(update="grpo", group=2, lr=1e-2))
    good, bad = [5, 6, 7], [20, 21, 22]
    rows = [([1, 2], good), ([1, 2], bad)]
    before = [p.clone() for p in policy.params]
    assert policy.grpo(rows, [1.0, 1.0], 1.0)["skipped"]
    assert all(torch.equal(a, b) for a, b in zip(before, policy.params, strict=True))
    with torch.no_grad():
        start = [float(t.mean()) for t in policy._logprobs(rows, 1.0)]
    for _ in range(5):
        assert not policy.grpo(rows, [1.0, 0.0], 1.0)["skipped"]
    with torch.no_grad():
        end = [float(t.mean()) for t in policy._logprobs(rows, 1.0)]
    assert end[0] > start[0] and end[1] < start[1]


def test_grpo_run_rolls_each_problem_out_group_times_after_its_sft_steps():
    cfg = TLTConfig(steps=3, warmup_steps=1, policy=PolicyConfig(update="grpo", sft_steps=1, group=3, lr=1e-2),
                    drafter=DrafterConfig(steps=2), rollout=RolloutConfig(problems=2, max_new_tokens=10,
                    temperature=1.0, measure_every=1))  # fmt: skip
    run = run_tlt(tiny_target(), cfg, progress=False)
    steps = run.record["steps"]
    assert [r["rule"] for r in steps] == ["sft", "grpo", "grpo"]
    assert [r["adapted"]["tokens"] for r in steps][1] <= 2 * 3 * 10 and steps[1]["adapted"]["greedy_exact"] is None
    assert len(run.drafter.buffer) == 2 + 2 + 2 * 3 * 2  # the warm-up's, the SFT step's, two GRPO steps' (x group)
    assert all("skipped" in r["policy"] for r in steps[1:])


@pytest.fixture(scope="module")
def saved_target(tmp_path_factory):
    path = tmp_path_factory.mktemp("tlt") / "target"
    make_llama(seed=0, vocab=V, eos=EOS).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


@pytest.mark.slow
def test_tlt_command_logs_every_step_and_saves_a_drafter_for_the_trained_target(saved_target, tmp_path):
    out = tmp_path / "run"
    main(["tlt", "--target", str(saved_target), "--out", str(out), "--steps", "3", "--warmup-steps", "1",
          "--rollout.problems", "2", "--rollout.max_new_tokens", "10", "--rollout.measure_every", "2",
          "--drafter.steps", "2"])  # fmt: skip
    lines = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2] and ["frozen" in x for x in lines] == [True, False, True]
    record = json.loads((out / "tlt.json").read_text())
    assert record["steps"] == lines and record["summary"]["measured_steps"] == 2
    assert record["provenance"]["target"]["name"] == str(saved_target)
    trained = Target.from_pretrained(out / "target")
    drafter = load_trained(out / "drafter", trained)  # refused for another target: the fingerprint matches
    prompt = char_tokenizer()("12+34=", add_special_tokens=False)["input_ids"]
    from draftsmith.decode.verifier import SpeculativeDecoder

    spec = SpeculativeDecoder(trained, drafter, 3, Sampling()).generate(prompt, 12)
    assert spec.tokens == plain_decode(trained, prompt, 12, Sampling()).tokens
    main(["export", str(out / "drafter"), "--to", "vllm", "--out", str(tmp_path / "vllm")])
    assert (tmp_path / "vllm" / "config.json").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy.update", "grpo"], "set rollout.temperature > 0"),
        (["--drafter.version", "2"], "drafter.version must be 1 or 3"),
        (["--policy.lora.target_modules", "[nope]"], "policy.lora.target_modules"),
        (["--task.digits", "0"], "task.digits must be in 1..9"),
    ],
)
def test_tlt_mistakes_are_one_line(saved_target, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        main(["tlt", "--target", str(saved_target), "--out", str(tmp_path / "run"), "--steps", "1",
              "--warmup-steps", "0", *args])  # fmt: skip
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "draftsmith: error:" in err and message in err and "Traceback" not in err


def test_tlt_benchmark_refuses_a_bad_setting_in_one_line_before_loading_a_model(tmp_path):
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "benchmarks/tlt.py", "--quick", "--drafter-version", "2", "--out",
                          str(tmp_path / "run")], cwd=root, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == "tlt.py: error: drafter.version must be 1 or 3, got 2"
    assert not (tmp_path / "run").exists()
