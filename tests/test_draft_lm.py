"""Draft LMs: distillation losses, on-policy student data, training, checkpoints the verifier scores, LoRA."""

from __future__ import annotations

import json
import math
from pathlib import Path

import datasets
import lightning as L
import pytest
import torch
from conftest import VOCAB, make_llama, make_tokenizer

from draftsmith.cli import main
from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.generate import generate
from draftsmith.errors import DraftsmithError
from draftsmith.eval.score import score_drafters
from draftsmith.families.draft_lm.module import DraftLMModule
from draftsmith.families.registry import load_network
from draftsmith.families.student import StudentShape
from draftsmith.layers import losses
from draftsmith.layers.lora import Lora
from draftsmith.layers.module import OptimConfig
from draftsmith.targets import resolve_target
from draftsmith.train.data import GeneratedDataModule

ROOT = Path(__file__).parent.parent
P = [0.6, 0.3, 0.1]  # teacher
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
Q = [0.2, 0.4, 0.4]  # student


def logits(probs: list[float], requires_grad: bool = False) -> torch.Tensor:
    return torch.tensor(probs).log().requires_grad_(requires_grad)


def kl(a: list[float], b: list[float]) -> float:
    return sum(x * math.log(x / y) for x, y in zip(a, b, strict=True))


# -- losses ------------------------------------------------------------------------------------------
def test_divergences_equal_their_hand_computed_values():
    s, t = logits(Q), logits(P)
    assert float(losses.forward_kl(s, t)) == pytest.approx(kl(P, Q), abs=1e-6)  # 0.3819...
    assert float(losses.reverse_kl(s, t)) == pytest.approx(kl(Q, P), abs=1e-6)  # 0.4013...
    m = [0.5 * (p + q) for p, q in zip(P, Q, strict=True)]  # [0.4, 0.35, 0.25]
    assert float(losses.jsd(s, t, beta=0.5)) == pytest.approx(0.5 * kl(P, m) + 0.5 * kl(Q, m), abs=1e-6)
    m = [0.2 * p + 0.8 * q for p, q in zip(P, Q, strict=True)]
    assert float(losses.jsd(s, t, beta=0.2)) == pytest.approx(0.2 * kl(P, m) + 0.8 * kl(Q, m), abs=1e-6)
    assert float(losses.tvd(s, t)) == pytest.approx(0.4, abs=1e-6)  # ½(0.4 + 0.1 + 0.3)
    assert float(losses.tvd_plus_plus(s, t, torch.tensor(True))) == pytest.approx(0.4, abs=1e-6)
    assert float(losses.forward_kl(t, t)) == pytest.approx(0.0, abs=1e-6)


def test_temperature_softens_both_distributions():
    s, t = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([0.0, 3.0, 1.0])
    for name in ("fkl", "rkl", "jsd", "tvd"):
        fn = {"fkl": losses.forward_kl, "rkl": losses.reverse_kl, "jsd": losses.jsd, "tvd": losses.tvd}[name]
        assert float(fn(s, t, temperature=2.0)) == pytest.approx(float(fn(s / 2, t / 2)), abs=1e-6)
        assert float(fn(s, t, temperature=2.0)) < float(fn(s, t))  # softer distributions are closer here


@pytest.mark.parametrize("name", losses.DIVERGENCES)
def test_gradient_raises_the_student_where_the_teacher_has_more_mass(name):
    s = logits(Q, requires_grad=True)
    losses.distillation_loss(name, s[None], logits(P)[None], torch.ones(1)).backward()
    assert s.grad[0] < 0  # p > q: descending raises token 0's logit
    assert s.grad[2] > 0  # p < q: lowers token 2's
    assert float(s.grad.sum()) == pytest.approx(0.0, abs=1e-6)  # softmax: shifting all logits changes nothing


def test_loss_mask_drops_positions():
    s = torch.stack([logits(Q), torch.tensor([9.0, -9.0, 0.0])])  # second position: far from the teacher
    t = torch.stack([logits(P), logits(P)])
    for name in losses.DIVERGENCES:
        masked = losses.distillation_loss(name, s, t, torch.tensor([1, 0]))
        alone = losses.distillation_loss(name, s[:1], t[:1], torch.ones(1))
        assert float(masked) == pytest.approx(float(alone), abs=1e-6), name


def test_tvd_plus_plus_is_the_papers_normalised_policy_gradient():
    """∇ TVD = -E_{x~q}[1{p > q} ∇ log q] (Goel et al. 2024, arXiv:2403.00858); TVD++ uses (r - μ) / σ with
    μ, σ the reward's mean and standard deviation under q over the batch's masked positions."""
    g = torch.Generator().manual_seed(0)
    s0, t = torch.randn(3, 5, 7, generator=g), torch.randn(3, 5, 7, generator=g) * 2
    mask = torch.rand(3, 5, generator=g) > 0.3

    def grad(loss_fn) -> torch.Tensor:
        s = s0.clone().requires_grad_(True)
        loss_fn(s).backward()
        return s.grad

    p = torch.softmax(t, -1)
    m = mask.float()[..., None]
    q0 = torch.softmax(s0, -1)
    r = (p > q0).float()
    mu = (q0 * r * m).sum() / m.sum()
    sigma = ((q0 * (r - mu) ** 2 * m).sum() / m.sum()).sqrt()

    def reference(reward: torch.Tensor):  # the policy-gradient form -sum_t E_{x~q}[reward(x) ∇ log q(x)]
        return lambda s: -(q0 * reward * torch.log_softmax(s, -1) * m).sum()

    tvd = grad(lambda s: (losses.tvd(s, t) * mask).sum())
    assert torch.allclose(tvd, grad(reference(r)), atol=1e-6)  # the TVD gradient lemma
    tvdpp = grad(lambda s: (losses.tvd_plus_plus(s, t, mask) * mask).sum())
    assert torch.allclose(tvdpp, grad(reference((r - mu) / sigma)), atol=1e-5)
    assert torch.allclose(tvdpp, tvd / sigma, atol=1e-5)  # exact expectation: the baseline μ cancels
    assert not torch.allclose(tvdpp, tvd, atol=1e-3)


def test_stored_topk_teacher_keeps_its_tokens_and_spreads_the_rest():
    ids, lp = torch.tensor([[3, 1]]), torch.tensor([[0.5, 0.3]]).log()
    full = losses.topk_teacher_logprobs(ids, lp, vocab_size=6)[0].exp()
    assert torch.allclose(full, torch.tensor([0.05, 0.3, 0.05, 0.5, 0.05, 0.05]), atol=1e-6)


def test_unknown_loss_and_bad_beta_are_errors():
    with pytest.raises(ValueError, match="unknown distillation loss 'kll'"):
        losses.distillation_loss("kll", logits(Q), logits(P), torch.tensor(1))
    with pytest.raises(ValueError, match="beta"):
        losses.jsd(logits(Q), logits(P), beta=1.0)


# -- the draft LM family ------------------------------------------------------------------------------
def words(g: torch.Generator, n: int) -> str:
    return " ".join(f"w{i}" for i in torch.randint(0, VOCAB - 2, (n,), generator=g).tolist())


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    """A saved 4-layer tiny target, sampled training data (with top-k log-probs) and greedy validation data."""
    root = tmp_path_factory.mktemp("draft_lm")
    make_llama(seed=0, layers=4).save_pretrained(root / "target")
    make_tokenizer().save_pretrained(root / "target")
    make_llama(seed=3, layers=1).save_pretrained(root / "student")
    make_tokenizer().save_pretrained(root / "student")
    g = torch.Generator().manual_seed(0)
    for name, n in [("train", 96), ("val", 8)]:
        lines = "".join(json.dumps({"prompt": words(g, 2 + i % 7)}) + "\n" for i in range(n))
        (root / f"{name}.jsonl").write_text(lines)
    common = {"max_new_tokens": 24, "device": "cpu", "shard_size": 64}
    generate(
        resolve_target(str(root / "target")),
        str(root / "train.jsonl"),
        root / "data-train",
        temperature=1.0,
        store_topk=8,
        **common,
    )
    generate(
        resolve_target(str(root / "target")), str(root / "val.jsonl"), root / "data-val", temperature=0.0, **common
    )
    return {k: root / k for k in ("target", "student", "data-train", "data-val")}


TINY = StudentShape(layers=1, hidden=48, heads=2, intermediate=96)


def module(setup, **kwargs) -> DraftLMModule:
    kwargs = {"shape": TINY, "optim": OptimConfig(lr=3e-3, warmup_steps=5), **kwargs}
    return DraftLMModule(str(setup["target"]), **kwargs)


def datamodule(setup, batch_size: int = 8) -> GeneratedDataModule:
    return GeneratedDataModule(str(setup["data-train"]), str(setup["data-val"]), batch_size=batch_size, max_length=64)


def trainer(tmp_path, steps: int) -> L.Trainer:
    return L.Trainer(
        max_steps=steps,
        default_root_dir=tmp_path,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


@pytest.mark.slow
def test_distillation_lowers_validation_loss_and_raises_tau_estimate_to_the_verifiers(setup, tmp_path):
    model, data = module(setup, loss="fkl"), datamodule(setup)
    before = trainer(tmp_path, 0).validate(model, data, verbose=False)[0]
    trainer(tmp_path, 40).fit(model, data)
    after = trainer(tmp_path, 0).validate(model, data, verbose=False)[0]
    assert after["val/loss"] < 0.7 * before["val/loss"]
    assert after["val/tau_est"] > before["val/tau_est"] + 0.3

    # teacher-forced acceptance on greedy validation text is the verifier's, round for round
    target = Target.from_pretrained(setup["target"])
    rows = datasets.load_from_disk(str(setup["data-val"]))
    prompts = [r["input_ids"][: r["prompt_len"]] for r in rows]
    scored = score_drafters(target, {"dl": model.drafter.as_drafter()}, prompts, 4, Sampling(0.0), 24, 0, False)[1]
    assert scored[0].greedy_exact == len(prompts)
    assert scored[0].tau_full == pytest.approx(after["val/tau_est"], rel=1e-6)


class CountCalls:
    """Forward hook recording the sequence length of each call of the student's HF model."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.lengths: list[int] = []
        model.register_forward_hook(lambda mod, args, kwargs, out: self.lengths.append(kwargs["input_ids"].shape[1]),
                                    with_kwargs=True)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("on_policy", [0.0, 1.0])
def test_on_policy_batches_are_sampled_by_the_student(setup, tmp_path, on_policy):
    model, data = module(setup, on_policy=on_policy, student_temperature=0.0), datamodule(setup, batch_size=4)
    calls = CountCalls(model.drafter.model.get_base_model() if model.lora else model.drafter.model)
    trainer(tmp_path, 3).fit(model, data)
    decoding_steps = sum(n == 1 for n in calls.lengths)  # the student's own generation, one token per call
    if on_policy == 0:
        assert model.on_policy_batches == 0 and decoding_steps == 0
        return
    assert model.on_policy_batches == 3 and decoding_steps >= 3 * 10

    # what the student generated is its own greedy continuation of each prompt, and not the data's
    batch = next(iter(data.train_dataloader()))
    student = model.student_batch(batch, seed=0)
    ids, mask = student["input_ids"], student["loss_mask"].bool()
    for i in range(len(ids)):
        prompt_len = int(batch["loss_mask"][i].argmax())
        assert torch.equal(ids[i, :prompt_len], batch["input_ids"][i, :prompt_len])
        assert int(mask[i].int().argmax()) == prompt_len and int(mask[i].sum()) == int(batch["loss_mask"][i].sum())
    with torch.no_grad():
        predicted = model.drafter(ids, student["attention_mask"]).argmax(-1)  # row t predicts t+1
    generated = mask[:, 1:]
    assert torch.equal(predicted[:, :-1][generated], ids[:, 1:][generated])
    assert not torch.equal(ids[mask], batch["input_ids"][batch["loss_mask"].bool()])


@pytest.mark.slow
def test_stored_topk_teacher_trains_without_the_target_in_the_step(setup, tmp_path):
    model, data = module(setup, loss="fkl", teacher="topk"), datamodule(setup)
    data.setup()
    batch = next(iter(data.train_dataloader()))
    assert batch["topk_ids"].shape[:2] == batch["input_ids"].shape and batch["topk_ids"].shape[2] == 8
    # the stored top-1 is the online target's argmax on every generated position
    rows = batch["loss_mask"][:, 1:].bool()
    online = Target.from_pretrained(setup["target"])(batch["input_ids"], attention_mask=batch["attention_mask"])
    assert torch.equal(batch["topk_ids"][:, :-1, 0][rows], online.logits[:, :-1].argmax(-1)[rows])
    model.train()
    assert model.target_forward(batch) is None
    assert torch.isfinite(model.losses(batch, None)["loss"])


def test_lora_student_merged_equals_unmerged_and_exports_plain_weights(setup, tmp_path):
    model = module(setup, init=str(setup["student"]), lora=Lora(r=4, alpha=8, target_modules=ALL_LINEAR))
    network = model.drafter
    trainable = {n for n, p in network.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():  # a trained adapter: B is zero at init
        for name, p in network.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ids = torch.randint(0, VOCAB - 2, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        unmerged, merged = network(ids), network.merged()(ids)
        base = network.model.get_base_model()
        with network.model.disable_adapter():
            plain = base(input_ids=ids).logits
    assert torch.allclose(unmerged, merged, atol=1e-5)
    assert not torch.allclose(unmerged, plain, atol=1e-2)  # the adapter does change the model
    out = save_native(network, model.target, tmp_path / "export")
    loaded, info = load_network(out, model.target)
    assert info["config"]["lora"] is None and not any("lora" in k for k in loaded.state_dict())
    with torch.no_grad():
        assert torch.allclose(loaded(ids), unmerged, atol=1e-5)


@pytest.mark.slow
def test_fit_cli_checkpoint_is_scored_by_the_cli_with_exact_greedy_output(setup, tmp_path):
    main(
        [
            "fit",
            f"--config={ROOT / 'configs' / 'draft_lm.yaml'}",
            f"--model.init_args.target={setup['target']}",
            f"--model.init_args.init={setup['student']}",
            "--model.init_args.loss=tvd++",
            "--model.init_args.on_policy=0.5",
            f"--data.train={setup['data-train']}",
            f"--data.val={setup['data-val']}",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
            "--trainer.max_steps=12",
            "--trainer.max_epochs=-1",
            "--trainer.check_val_every_n_epoch=null",
            "--trainer.val_check_interval=6",
        ]
    )
    ckpt = tmp_path / "csv" / "version_0" / "checkpoints" / "best.ckpt"
    prompts = write_prompts(tmp_path)
    main(["score", f"--target={setup['target']}", f"--drafter=dl={ckpt}", f"--prompts={prompts}",
          "--max-new-tokens=16", f"--out={tmp_path / 'score'}"])  # fmt: skip
    report = json.loads((tmp_path / "score" / "report.json").read_text())
    row = report["drafters"][0]
    assert row["name"] == "dl" and row["greedy_exact"] == row["prompts"] == 3
    assert report["target"] == Target.from_pretrained(setup["target"]).fingerprint


def write_prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["w1 w2 w3", "w5 w6", "w7 w8 w9 w10"]))
    return path


def test_student_with_another_vocabulary_is_refused(setup, tmp_path):
    make_llama(seed=3, layers=1, vocab=VOCAB + 32).save_pretrained(tmp_path / "wide")
    with pytest.raises(DraftsmithError, match="model.init: .* has 128 output tokens, the target 96"):
        module(setup, init=str(tmp_path / "wide"))


@pytest.mark.slow
def test_corpus_pretraining_lowers_heldout_loss_and_seeds_the_distillation_stage(tmp_path, setup):
    from draftsmith.targets import corpus
    from draftsmith.targets import default as default_target
    from draftsmith.train.corpus_data import CorpusDataModule

    tokenizer = default_target.train_tokenizer(corpus.split(5)[0][:40], vocab_size=300)
    make_llama(seed=0, vocab=len(tokenizer)).save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    data = CorpusDataModule(str(tmp_path / "target"), seq_len=32, max_tokens=8192, val_tokens=1024, batch_size=8)
    model = DraftLMModule(str(tmp_path / "target"), shape=TINY, loss="ce", optim=OptimConfig(lr=1e-2, warmup_steps=3))
    before = trainer(tmp_path, 0).validate(model, data, verbose=False)[0]
    fit = trainer(tmp_path, 30)
    fit.fit(model, data)
    after = trainer(tmp_path, 0).validate(model, data, verbose=False)[0]
    assert before["val/loss"] == pytest.approx(math.log(len(tokenizer)), rel=0.1)  # untrained: ~uniform
    assert after["val/loss"] < before["val/loss"] - 1.0  # held-out stdlib text, next-token cross-entropy

    fit.save_checkpoint(tmp_path / "pretrained.ckpt")  # stage 2 starts from it
    stage2 = DraftLMModule(str(tmp_path / "target"), init=str(tmp_path / "pretrained.ckpt"), loss="fkl")
    for (name, a), b in zip(model.drafter.state_dict().items(), stage2.drafter.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(DraftsmithError, match="data.tokenizer .* is not the tokenizer of target"):
        data.check_target(Target.from_pretrained(setup["target"]))


class KeepBatches(L.Callback):
    """Keeps each training batch in memory (``train_helpers.RecordBatches`` writes them per rank to files); saves a
    checkpoint to ``save_at`` after step 5 (mid-epoch, as ModelCheckpoint or a SLURM requeue does)."""

    def __init__(self, save_at: Path | None = None) -> None:
        self.seen: list[torch.Tensor] = []
        self.save_at = save_at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen.append(batch["input_ids"].clone())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.save_at is not None and trainer.global_step == 5:
            trainer.save_checkpoint(self.save_at)


def test_corpus_pretraining_resumed_mid_epoch_trains_on_the_batches_of_an_uninterrupted_run(tmp_path):
    from draftsmith.targets import corpus
    from draftsmith.targets import default as default_target
    from draftsmith.train.corpus_data import CorpusDataModule

    tokenizer = default_target.train_tokenizer(corpus.split(5)[0][:5], vocab_size=160)
    make_llama(seed=0, layers=1, vocab=len(tokenizer)).save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")

    def run(record: KeepBatches, ckpt: Path | None = None) -> DraftLMModule:
        data = CorpusDataModule(str(tmp_path / "target"), seq_len=16, max_tokens=2048, val_tokens=256, batch_size=8)
        model = DraftLMModule(str(tmp_path / "target"), shape=TINY, loss="ce", optim=OptimConfig(warmup_steps=3))
        fit = L.Trainer(
            max_steps=24, default_root_dir=tmp_path, accelerator="cpu", logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, callbacks=[record],
        )  # fmt: skip
        fit.fit(model, data, ckpt_path=ckpt, weights_only=False)  # our own checkpoint (its hparams hold OptimConfig)
        return model

    whole = KeepBatches(save_at=tmp_path / "step5.ckpt")
    whole_model = run(whole)  # 2,048 tokens = 128 blocks = 16 batches an epoch: 1.5 epochs
    assert len(whole.seen) == 24 and not torch.equal(whole.seen[0], whole.seen[16])
    rest = KeepBatches()
    resumed_model = run(rest, tmp_path / "step5.ckpt")
    assert len(rest.seen) == 19
    for step, (want, got) in enumerate(zip(whole.seen[5:], rest.seen, strict=True), start=5):
        assert torch.equal(want, got), f"step {step} trained on another batch"
    for (name, a), b in zip(whole_model.state_dict().items(), resumed_model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_draft_lm_with_tied_embeddings_saves_and_loads_natively(target, tmp_path):
    from draftsmith.layers.causal_lm import DraftLMConfig, DraftLMNetwork

    lm = make_llama(seed=3, layers=1)
    lm.config.tie_word_embeddings = True
    lm.tie_weights()
    assert lm.lm_head.weight.data_ptr() == lm.model.embed_tokens.weight.data_ptr()
    hf_config = json.loads(lm.config.to_json_string(use_diff=False))
    save_native(DraftLMNetwork(DraftLMConfig(hf_config, None), lm), target, tmp_path / "lm")
    loaded, _ = load_network(tmp_path / "lm", target)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), lm(input_ids=ids).logits)


def test_a_checkpoint_pickled_before_the_student_moved_still_finds_its_shape():
    """``StudentShape`` moved to ``families/student.py``; a draft LM or S2D checkpoint written before pickled its
    hyperparameters' shape under ``families/draft_lm/module.py``, and resuming or loading it unpickles that name."""
    import pickle

    from draftsmith.families.student import StudentShape

    old = pickle.dumps(StudentShape(layers=3), protocol=0).replace(  # protocol 0 names the class as text
        b"draftsmith.families.student", b"draftsmith.families.draft_lm.module"
    )
    assert b"draft_lm.module" in old and pickle.loads(old) == StudentShape(layers=3)
