"""The embedded default target: a small Llama trained locally on the Python standard library.

``draftsmith target build`` trains a byte-level BPE tokenizer and a small
Llama-architecture model on the stdlib's source (see ``data/corpus.py``),
reports held-out loss and perplexity beside the unigram baseline, and saves
both with ``save_pretrained``. It also trains a one-layer sibling LM with the
same tokenizer (what a model family's smallest member is to its largest): the
ready-made ``DraftLM`` baseline. Builds are cached by their config.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm.auto import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from draftsmith.core.files import made_once
from draftsmith.errors import DraftsmithError
from draftsmith.targets import corpus
from draftsmith.targets.cache import cache_home

EOS = "<|endoftext|>"
PAD = "<|pad|>"


@dataclass
class ModelShape:
    """Llama shape of one model of the default family."""

    layers: int = 4
    """Decoder layers."""
    hidden: int = 256
    """Hidden size."""
    heads: int = 4
    """Attention heads; head_dim = hidden / heads must be >= 64 for vLLM's CPU attention."""
    intermediate: int = 768
    """MLP width."""
    steps: int = 400
    """Optimizer steps."""
    lr: float = 3e-3
    """Peak learning rate (linear warmup, cosine decay)."""


@dataclass
class TargetBuildConfig:
    """How the default target is built."""

    vocab_size: int = 4096
    """BPE vocabulary size (special tokens included)."""
    seq_len: int = 128
    """Training sequence length."""
    batch_size: int = 16
    """Sequences per step."""
    heldout_percent: int = 5
    """Share of stdlib files held out (by path hash) for evaluation and prompts."""
    eval_tokens: int = 32768
    """Held-out tokens to evaluate on."""
    max_position: int = 2048
    """Context length of the saved models."""
    target: ModelShape = field(default_factory=ModelShape)
    """The target."""
    sibling: ModelShape | None = field(default_factory=lambda: ModelShape(layers=1, steps=140))
    """A one-layer LM with the same tokenizer (the DraftLM baseline); None to skip."""
    seed: int = 0
    """Seed for file order, init and batches."""

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]


FAST = TargetBuildConfig(
    vocab_size=1024,
    seq_len=128,
    batch_size=8,
    eval_tokens=4096,
    target=ModelShape(layers=2, hidden=128, heads=2, intermediate=256, steps=60, lr=3e-3),
    sibling=ModelShape(layers=1, hidden=128, heads=2, intermediate=256, steps=30, lr=3e-3),
)
"""A seconds-long build for tests and ``quickstart --fast``."""


DEMO = TargetBuildConfig(
    target=ModelShape(layers=20, hidden=128, heads=2, intermediate=384, steps=400, lr=3e-3),
    sibling=ModelShape(layers=1, hidden=128, heads=2, intermediate=384, steps=140, lr=3e-3),
)
"""The demo target (``demo``, what ``make demo`` trains drafters for): the default target's corpus, tokenizer and
budget in the shape of a real LLM where speculative decoding feels it, deep and narrow, so that a one-layer drafter
costs a few percent of a target step as on SmolLM2 (on the 4-layer default target it costs 30-40%, and no drafter can
win whatever it learns)."""


def default_target_dir(config: TargetBuildConfig) -> Path:
    return cache_home() / "targets" / f"stdlib-llama-{config.key()}"


def train_tokenizer(files: list[corpus.SourceFile], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((f.text for f in files), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=PAD)


def token_blocks(files: list[corpus.SourceFile], tokenizer, seq_len: int, max_tokens: int, seed: int) -> torch.Tensor:
    """Shuffle files, tokenize until ``max_tokens``, pack into (N, seq_len) blocks (eos between files)."""
    files = files[:]
    random.Random(seed).shuffle(files)
    stream: list[int] = []
    eos = tokenizer.eos_token_id
    for i in range(0, len(files), 64):
        for ids in tokenizer([f.text for f in files[i : i + 64]])["input_ids"]:
            stream.extend(ids + [eos])
        if len(stream) >= max_tokens:
            break
    n = min(len(stream), max_tokens) // seq_len
    return torch.tensor(stream[: n * seq_len]).view(n, seq_len)


def llama_config(shape: ModelShape, config: TargetBuildConfig, tokenizer) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=config.max_position,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )


@torch.no_grad()
def evaluate(model: LlamaForCausalLM, blocks: torch.Tensor, batch_size: int) -> float:
    """Mean next-token cross-entropy (nats) over held-out blocks."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(blocks), batch_size):
        batch = blocks[i : i + batch_size]
        loss = model(input_ids=batch, labels=batch).loss
        n = batch.numel() - len(batch)
        total, count = total + float(loss) * n, count + n
    return total / count


def unigram_loss(train: torch.Tensor, heldout: torch.Tensor, vocab: int) -> float:
    """Held-out cross-entropy of an add-one unigram model fitted on the training tokens."""
    counts = torch.bincount(train.flatten(), minlength=vocab).double() + 1
    logp = (counts / counts.sum()).log()
    return float(-logp[heldout.flatten()].mean())


def train_model(
    shape: ModelShape, config: TargetBuildConfig, tokenizer, train: torch.Tensor, heldout: torch.Tensor, name: str
) -> tuple[LlamaForCausalLM, dict]:
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(llama_config(shape, config, tokenizer))
    opt = torch.optim.AdamW(model.parameters(), lr=shape.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, shape.steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, shape.steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    gen = torch.Generator().manual_seed(config.seed)
    order = torch.randperm(len(train), generator=gen)
    start = time.perf_counter()
    bar = tqdm(range(shape.steps), desc=f"train {name}", unit="step", mininterval=1.0)
    model.train()
    for step in bar:
        idx = order[(torch.arange(config.batch_size) + step * config.batch_size) % len(train)]
        batch = train[idx]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    seconds = time.perf_counter() - start
    heldout_loss = evaluate(model, heldout, config.batch_size)
    stats = {
        "params": sum(p.numel() for p in model.parameters()),
        "train_tokens": shape.steps * config.batch_size * config.seq_len,
        "train_seconds": round(seconds, 1),
        "heldout_loss": round(heldout_loss, 4),
        "heldout_ppl": round(math.exp(heldout_loss), 2),
    }
    return model.eval(), stats


FAMILY_LAYERS = (2, 4, 8)
"""Decoder layers of the default family's members ``default-2``, ``default-4`` (the default target) and ``default-8``:
several targets of one family that share a tokenizer (what one S2D sorted draft LM serves)."""


def member_dir(layers: int, config: TargetBuildConfig) -> Path:
    """Where the default family's member of ``layers`` decoder layers is cached."""
    return cache_home() / "targets" / f"stdlib-llama-{config.key()}-{layers}l"


def build_member(
    layers: int,
    config: TargetBuildConfig | None = None,
    out: Path | None = None,
    base: Path | None = None,
    force: bool = False,
) -> Path:
    """Build (or reuse) the default family's member of ``layers`` decoder layers: the default target itself at its
    depth, else the default target's shape at that depth trained as it is (same corpus, steps, seed) with its
    tokenizer; returns its directory.

    Args:
        layers: decoder layers (the family: ``FAMILY_LAYERS``).
        config: the default target's build (default: ``TargetBuildConfig()``).
        out: where to save it (default: the cache, keyed by the build config and ``layers``).
        base: the default target's directory, whose tokenizer the member takes (default: ``build(config)``).
        force: rebuild even if a build exists.
    """
    config = config or TargetBuildConfig()
    if layers < 1:
        raise DraftsmithError(f"target default-{layers}: a member of the default family has at least 1 layer")
    if layers == config.target.layers and out is None:
        return build(config, force=force)
    out = Path(out) if out else member_dir(layers, config)

    def make(tmp: Path) -> None:
        base_dir = Path(base) if base else build(config)
        member = replace(config, target=replace(config.target, layers=layers), sibling=None)
        started = time.perf_counter()
        tokenizer = PreTrainedTokenizerFast.from_pretrained(base_dir)
        train_files, heldout_files = corpus.split(config.heldout_percent)
        need = member.target.steps * config.batch_size * config.seq_len
        train = token_blocks(train_files, tokenizer, config.seq_len, need, config.seed)
        heldout = token_blocks(heldout_files, tokenizer, config.seq_len, config.eval_tokens, config.seed)
        model, stats = train_model(member.target, member, tokenizer, train, heldout, f"default-{layers}")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        report = {"config": asdict(member), "base": str(base_dir), "target": stats,
                  "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
        (tmp / "build.json").write_text(json.dumps(report, indent=2))
        print(f"default-{layers}: {stats}")

    return made_once(out, _is_built, make, force)


def _is_built(out: Path) -> bool:
    return (out / "build.json").is_file()


def build(config: TargetBuildConfig | None = None, out: Path | None = None, force: bool = False) -> Path:
    """Build (or reuse) the default target; returns its directory (``sibling/`` inside when built)."""
    config = config or TargetBuildConfig()
    out = Path(out) if out else default_target_dir(config)

    def make(tmp: Path) -> None:
        torch.manual_seed(config.seed)
        started = time.perf_counter()
        train_files, heldout_files = corpus.split(config.heldout_percent)
        tokenizer = train_tokenizer(train_files, config.vocab_size)
        shapes = [config.target] + ([config.sibling] if config.sibling else [])
        need = max(s.steps for s in shapes) * config.batch_size * config.seq_len
        train = token_blocks(train_files, tokenizer, config.seq_len, need, config.seed)
        heldout = token_blocks(heldout_files, tokenizer, config.seq_len, config.eval_tokens, config.seed)
        report = {
            "config": asdict(config),
            "corpus": {
                "root": str(corpus.stdlib_root()),
                "train_files": len(train_files),
                "heldout_files": len(heldout_files),
                "train_blocks": len(train),
                "heldout_tokens": heldout.numel(),
            },
            "unigram_heldout_ppl": round(math.exp(unigram_loss(train, heldout, len(tokenizer))), 2),
        }
        tmp.mkdir(parents=True)
        for shape, sub in zip(shapes, ["target", "sibling"], strict=False):
            model, stats = train_model(shape, config, tokenizer, train, heldout, sub)
            model_dir = tmp if sub == "target" else tmp / "sibling"
            model.save_pretrained(model_dir)
            tokenizer.save_pretrained(model_dir)
            report[sub] = stats
            print(f"{sub}: {stats}")
        report["seconds"] = round(time.perf_counter() - started, 1)
        (tmp / "build.json").write_text(json.dumps(report, indent=2))

    return made_once(out, _is_built, make, force)
