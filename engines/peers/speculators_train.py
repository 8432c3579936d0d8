"""vllm-project/speculators' own EAGLE-3 trainer on draftsmith's packed corpus, on a CPU (issue 86).

Runs INSIDE speculators' venv (``.venv-speculators``, built by ``engines/peer_venv.sh``: speculators 0.9,
transformers 5.x, torch CPU); it does not import draftsmith, whose dependencies that venv lacks. The data step that
needs draftsmith runs in draftsmith's venv as a subprocess (``engines/peers/prepare.py``).

    .venv-speculators/bin/python engines/peers/speculators_train.py --tokens 250000 --epochs 1 \\
        --out runs/peers/speculators-250k [--lr 1e-3 --ttt-steps 3 --draft-vocab-size 4096 ...] [-- THEIR FLAGS]

Stages, each skipped when its output is already whole (a rerun resumes; the trainer itself resumes from its last
epoch checkpoint, speculators' own resumption):

1. ``prepare``: draftsmith's corpus as token rows (``prepare.py``, in ``.venv``), the first rows up to ``--tokens``
   generated tokens (``draftsmith.train.data.generated_prefix``'s rule, as ``benchmarks/scaling.py``'s subsets) and
   the held-out val corpus (``benchmarks/data/smollm2-val.tar.xz``), written as speculator-format JSONL
   (``{"input_ids", "loss_mask"}``) under ``OUT/rows/``.
2. ``dataset``: speculators' own preprocessing, ``load_and_preprocess_dataset`` (the code behind ``speculators
   prepare-data``; pre-tokenized rows pass through it with their loss mask, it shuffles with its seed 0 and counts
   the train rows' token frequencies into ``token_freq.pt``, from which the trainer builds ``d2t``/``t2d`` when a
   draft vocabulary is asked for), the train split then the val split saved as one dataset, ``OUT/data``.
3. ``hidden_states``: ``OUT/data/hidden_states/hs_{i}.safetensors``, the files their trainer reads offline
   (``FileTransfer``: ``token_ids`` [T] and ``hidden_states`` [T, 4, H]: the aux layers, then the final layer).
4. ``train``: ``speculators.train.cli.main(TrainConfig.resolve(argv))``, their launcher, in a child process
   (so that its peak RSS is the fit's alone): their model class, draft-vocabulary mapping, training-time-test
   loop, losses, optimizer, schedule and checkpoints. Checkpoints: ``OUT/checkpoints/<epoch>/`` (``config.json``
   + ``model.safetensors``, what ``draftsmith import`` reads).
5. ``OUT/fit.json``: wall-clock, tokens/s, peak RSS, steps, passes, the resolved hyperparameters, every replacement.

What the harness replaces in their launcher (device selection, process-group setup, kernel choice; never their
math), and why:

- R1 hidden-state extraction: their offline data comes from a vLLM server (``speculators launch-vllm`` +
  ``generate-offline-data``, vLLM's hidden-states connector), which needs a GPU. Here the target's HF model
  computes the same tensors on the CPU: aux layer id k = the input of decoder layer k (HF ``hidden_states[k]``,
  vLLM's ``hidden_states + residual`` before layer k), and the last entry the final layer's output before the final
  norm (vLLM's id ``num_layers`` with ``--include-last-layer``; their model applies ``verifier_norm`` to it), stored
  in their ``hidden_states_dtype`` (bf16). The target computes in ``--target-dtype`` (bfloat16: as vLLM serves
  SmolLM2, and as draftsmith's side of the comparison computes its features, ``benchmarks/scaling.py``'s dtype).
- R2 device: ``Trainer`` moves the model and batches to ``get_local_rank()`` (an int: ``cuda:0``) -> the CPU
  (``speculators.train.trainer.get_local_rank`` returns ``torch.device("cpu")``); the checkpointer's
  ``get_current_device()`` (``cuda:0`` without an accelerator) -> ``"cpu"`` for loading a checkpoint to resume.
- R3 autocast: ``Trainer.device_type`` falls back to ``"cuda"`` without an accelerator, where torch disables
  autocast (bf16 hidden states then meet fp32 weights); the harness sets it to ``"cpu"``: the same bf16 autocast
  their GPU runs use, on the CPU's bf16 (AMX) kernels.
- R4 ``torch.accelerator.synchronize`` (their step timer calls it every logged step, ``log_freq`` 1) raises on a
  machine without an accelerator: a no-op there (CPU ops are synchronous).
- R5 kernels: ``--draft-attn-impl sdpa`` instead of their default ``simple_flex_attention`` (flex attention's
  compiled kernels are CUDA/Triton; their own dense-mask SDPA path, same masks) and ``--loss-implementation
  eager`` instead of ``fused`` (Triton kernels; their eager losses compute the same divergences). Both are their
  own options, set on their command line.
- R6 process group: none to replace: without ``LOCAL_RANK`` their ``maybe_setup_distributed`` sets up nothing
  (one process, no NCCL); ``torch.compile`` of the forward is their own choice off without CUDA
  (``conditional_torch_compile``).

On a CUDA GPU (``--device``, by default the machine's) only R1 applies, on the GPU: their launcher runs as it is
there (R2-R4 switch themselves off with an accelerator; their default kernels, ``simple_flex_attention`` and the
fused losses, and their 12 loader workers); ``fit.json`` records the device and the replacements that applied.

Settings of this machine (not math, each recorded in ``fit.json``): ``--num-workers 0`` (their 12 spawned
dataloader workers each import torch: 2 cores, 23 GiB here; the loader only reads files); ``--train-data-ratio`` set
so that the train split is exactly the ``--tokens`` subset and the val split the held-out val corpus (their default
0.9 would hold out 10% of the subset); ``pin_memory`` left as is (no effect on a CPU, torch warns).

Their defaults (speculators 0.9.0, ``speculators train --speculator-type eagle3``; ``fit.json``'s
``hyperparameters`` holds the full resolved config): 1 decoder layer (llama), aux layers [2, L/2, L-3] of the target
(SmolLM2: [2, 15, 27]), ``norm_before_residual`` true, ``norm_before_fc`` true and ``norm_output`` true (their
EAGLE-3.1-style norms; ``fc_norm``, the paper's per-layer norm, off), the full target vocabulary as draft
vocabulary (``draft_vocab_size`` unset), sliding-window attention 2048 on every draft layer, loss ``kl_div``, TTT
3 steps, step loss decay 1.0, optimizer Muon (2-D weights, lr = ``lr``, momentum 0.95, weight decay 0.1,
``match_rms_adamw``) + AdamW (the rest, weight decay 0.01), lr 1e-3, linear schedule with 1% warmup, packed batches
of ``total_seq_len`` 8192 tokens, 20 epochs, seed 42, gradient clipping 1.0, bf16 hidden states and autocast.
Any of their flags after ``--`` is passed to their config unchanged.

Measured on this CPU (2 cores, load 8-12 from other jobs): their default ``total_seq_len`` 8192 with the full
49,152-token draft vocabulary was killed for memory (peak RSS 5.6 GB at 2048, about 2 GB more per 1024 tokens: the
[T, V] logits, their eager losses' fp32 softmaxes, per TTT step); a step is bound by element-wise work over those
[T, V] tensors (casts, argmax, the KL's softmax / xlogy / mul: ~80% of a profiled step, the matmuls ~10%), so a
reduced ``--draft-vocab-size`` is what speeds it up most.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")

REPLACEMENTS = {
    "R1 hidden states": "vLLM server extraction -> the target's HF model on the CPU: aux id k = HF hidden_states[k] "
    "(input of decoder layer k), last entry the final layer's output before the final norm; stored bf16",
    "R2 device": "Trainer's get_local_rank() (cuda:0) -> torch.device('cpu'); checkpointer's get_current_device() "
    "-> 'cpu'",
    "R3 autocast": "Trainer.device_type 'cuda' fallback (autocast disabled on a CPU) -> 'cpu' (bf16 autocast)",
    "R4 synchronize": "torch.accelerator.synchronize -> no-op without an accelerator (their step timer)",
    "R5 kernels": "--draft-attn-impl sdpa (not simple_flex_attention), --loss-implementation eager (not fused Triton)",
    "R6 process group": "none: no LOCAL_RANK, their maybe_setup_distributed sets up nothing; torch.compile off by "
    "their conditional_torch_compile without CUDA",
}
PREPARE_SEQ_LENGTH = 8192
"""``speculators prepare-data --seq-length``'s default: rows are cut there (none of the corpus's is that long)."""
MACHINE_SETTINGS = {
    "num_workers": "0 (their default 12 spawned workers, each importing torch, on 2 cores)",
    "train_data_ratio": "the --tokens subset exactly as train split, the held-out val corpus as val split",
}
ON_GPU = ("R1 hidden states",)
"""On a CUDA GPU their launcher runs as it is (R2-R4 switch themselves off there, R5's kernels are their defaults:
``simple_flex_attention`` and the fused Triton losses, their 12 loader workers); only R1 stays (the target's HF
model computes the hidden states, on the GPU, instead of a vLLM server)."""


def device_of(asked: str) -> str:
    """``--device``: ``auto`` is cuda where torch sees a GPU, else cpu."""
    if asked != "auto":
        return asked
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=None, help="generated tokens of the corpus's first rows (all: unset)")
    p.add_argument("--epochs", type=int, default=None, help="passes over the rows (their default: 20)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--corpus", type=Path, default=ROOT / "benchmarks" / "data" / "smollm2-1m.tar.xz")
    p.add_argument("--val", type=Path, default=ROOT / "benchmarks" / "data" / "smollm2-val.tar.xz")
    p.add_argument("--val-rows", type=int, default=None, help="the val corpus's first rows (all: unset)")
    p.add_argument("--target", default="smollm2", help="draftsmith's target name or an HF dir")
    p.add_argument("--target-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--draftsmith-python", type=Path, default=ROOT / ".venv" / "bin" / "python")
    p.add_argument("--total-seq-len", type=int, default=None, help="their packed batch length (default 8192)")
    p.add_argument("--target-layer-ids", type=int, nargs="+", default=None, help="their aux layers (default theirs)")
    # their hyperparameters, unset = their default (forwarded to their config when set)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--ttt-steps", type=int, default=None)
    p.add_argument("--ttt-step-loss-decay", type=float, default=None)
    p.add_argument("--draft-vocab-size", type=int, default=None)
    p.add_argument("--optimizer", choices=["adamw", "muon"], default=None)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="where the target and their trainer run (auto: cuda where torch sees a GPU, else cpu)",
    )
    p.add_argument("--stage", default="all", help=argparse.SUPPRESS)
    return p.parse_known_args(argv)


def log(msg: str) -> None:
    print(f"[speculators_train {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_json(path: Path, record: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str))
    tmp.replace(path)


# -- 1. prepare --------------------------------------------------------------------------------------------------


def prefix_rows(cumsum: list[int], tokens: int | None) -> tuple[int, int]:
    """``prepare.prefix_rows`` (draftsmith's ``generated_prefix`` rule over a cumsum), repeated here: this venv
    cannot import draftsmith's side."""
    if not cumsum:
        return 0, 0
    if tokens is None or tokens >= cumsum[-1]:
        return len(cumsum), cumsum[-1]
    i = next(j for j, c in enumerate(cumsum) if c >= max(1, tokens))
    return i + 1, cumsum[i]


def stage_prepare(a: argparse.Namespace) -> dict:
    out = a.out / "rows"
    done = out / "rows.json"
    if done.is_file():
        record = json.loads(done.read_text())
        if record["request"] == [a.tokens, a.val_rows, str(a.corpus), str(a.val), a.target]:
            return record
    if not a.draftsmith_python.is_file():
        sys.exit(f"--draftsmith-python {a.draftsmith_python}: no such Python (draftsmith's venv, made by `make setup`)")
    cmd = [str(a.draftsmith_python), str(ROOT / "engines" / "peers" / "prepare.py"), "--corpus", str(a.corpus)]
    cmd += ["--val", str(a.val), "--target", a.target]
    log("prepare: " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"prepare.py failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    dirs = json.loads(proc.stdout.strip().splitlines()[-1])
    out.mkdir(parents=True, exist_ok=True)
    meta = json.loads((Path(dirs["train"]) / "meta.json").read_text())
    rows, generated = prefix_rows(meta["generated_cumsum"], a.tokens)
    counts = {}
    for split, src, keep in (("train", dirs["train"], rows), ("val", dirs["val"], a.val_rows)):
        n = total = gen = 0
        with open(Path(src) / "rows.jsonl") as f, open(out / f"{split}.jsonl", "w") as g:
            for line in f:
                if keep is not None and n >= keep:
                    break
                row = json.loads(line)
                n, total, gen = n + 1, total + len(row["input_ids"]), gen + sum(row["loss_mask"])
                g.write(line)
        counts[split] = {"rows": n, "tokens": total, "generated_tokens": gen}
    assert counts["train"]["generated_tokens"] == generated, (counts, generated)
    record = {
        "request": [a.tokens, a.val_rows, str(a.corpus), str(a.val), a.target],
        "target": dirs["target"],
        "corpus_target": meta.get("target"),
        **counts,
    }
    write_json(done, record)
    log(f"prepare: train {counts['train']}, val {counts['val']}")
    return record


# -- 2. dataset (their preprocessing) ----------------------------------------------------------------------------


def stage_dataset(a: argparse.Namespace, rows: dict, seq_len: int) -> dict:
    data = a.out / "data"
    done = data / "harness_dataset.json"
    request = {"rows": rows["request"], "seq_length": seq_len}
    if done.is_file() and json.loads(done.read_text()).get("request") == request:
        return json.loads(done.read_text())
    import shutil

    from datasets import concatenate_datasets
    from speculators.data_generation.preprocessing import load_and_preprocess_dataset

    if data.exists():
        shutil.rmtree(data)
    data.mkdir(parents=True)
    parts = {}
    for split in ("train", "val"):
        parts[split], _ = load_and_preprocess_dataset(
            target_model_path=rows["target"],
            train_data_paths=[str(a.out / "rows" / f"{split}.jsonl")],
            seq_length=seq_len,
            build_dataset_num_proc=1,
            token_freq_path=data / "token_freq.pt",
            skip_token_freq=split != "train",  # the draft vocabulary from the train rows only
        )
    n_train, n_val = len(parts["train"]), len(parts["val"])
    if n_train != rows["train"]["rows"] or n_val != rows["val"]["rows"]:
        sys.exit(f"their preprocessing kept {n_train}/{n_val} of {rows['train']['rows']}/{rows['val']['rows']} rows")
    both = concatenate_datasets([parts["train"], parts["val"]])
    both.save_to_disk(str(data))
    record = {"request": request, "train_rows": n_train, "val_rows": n_val}
    write_json(done, record)
    return record


# -- 3. hidden states (R1) ---------------------------------------------------------------------------------------


def aux_layer_ids(target: str, given: list[int] | None) -> list[int]:
    from speculators.models.utils import resolve_target_layer_ids

    return resolve_target_layer_ids(given, target)


def stage_hidden_states(a: argparse.Namespace, rows: dict, layer_ids: list[int]) -> dict:
    import torch
    from datasets import load_from_disk
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    data = a.out / "data"
    hs_dir = data / "hidden_states"
    done = data / "harness_hidden_states.json"
    request = {"target": rows["target"], "target_dtype": a.target_dtype, "aux_layer_ids": layer_ids}
    if a.device != "cpu":  # a CPU run's request stays as it was (its files are reused)
        request["device"] = a.device
    if (hs_dir / "request.json").is_file() and json.loads((hs_dir / "request.json").read_text()) != request:
        import shutil

        log(f"hidden states: {hs_dir} holds another request's files: computed again")
        shutil.rmtree(hs_dir)
        done.unlink(missing_ok=True)
    if done.is_file():
        return json.loads(done.read_text())
    hs_dir.mkdir(exist_ok=True)
    write_json(hs_dir / "request.json", request)
    ds = load_from_disk(str(data)).with_format(None)
    todo = [i for i in range(len(ds)) if not (hs_dir / f"hs_{i}.safetensors").is_file()]
    dtype = getattr(torch, a.target_dtype)
    model = AutoModelForCausalLM.from_pretrained(rows["target"], dtype=dtype).eval().to(a.device)
    num_layers = model.config.num_hidden_layers
    captured = {}
    model.model.norm.register_forward_pre_hook(lambda mod, args: captured.__setitem__("pre_norm", args[0]))
    log(
        f"hidden states: {len(todo)} of {len(ds)} rows to compute, aux layers {layer_ids} + final ({num_layers}), "
        f"target in {a.target_dtype} on {a.device}"
    )
    order = sorted(todo, key=lambda i: ds[i]["seq_len"])
    start, tokens, checked = time.perf_counter(), 0, False
    budget = 4096  # tokens (padded) per forward
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * ds[i]["seq_len"] > budget:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    with torch.inference_mode():
        for b, idx in enumerate(batches):
            seqs = [ds[i]["input_ids"] for i in idx]
            width = max(len(s) for s in seqs)
            ids = torch.zeros(len(seqs), width, dtype=torch.long)
            mask = torch.zeros(len(seqs), width, dtype=torch.long)
            for r, s in enumerate(seqs):
                ids[r, : len(s)], mask[r, : len(s)] = torch.tensor(s), 1
            out = model.model(input_ids=ids.to(a.device), attention_mask=mask.to(a.device), output_hidden_states=True)
            final = captured.pop("pre_norm")
            if not checked:  # HF's last hidden_states entry is the normed one: ours is its input
                normed = model.model.norm(final)
                assert torch.allclose(normed, out.hidden_states[-1], atol=1e-4), "final norm input mismatch"
                checked = True
            stack = torch.stack([*(out.hidden_states[k] for k in layer_ids), final], dim=2).cpu()  # [B, T, 4, H]
            for r, i in enumerate(idx):
                n = len(seqs[r])
                path = hs_dir / f"hs_{i}.safetensors"
                tmp = hs_dir / f"hs_{i}.safetensors.part"
                save_file(
                    {"hidden_states": stack[r, :n].to(torch.bfloat16).contiguous(), "token_ids": ids[r, :n].clone()},
                    str(tmp),
                )
                tmp.replace(path)
                tokens += n
            if b % 20 == 0 or b == len(batches) - 1:
                rate = tokens / max(time.perf_counter() - start, 1e-9)
                log(f"hidden states: batch {b + 1}/{len(batches)}, {tokens} tokens, {rate:.0f} tokens/s")
    record = {
        "rows": len(ds),
        "layer_ids": [*layer_ids, num_layers],
        "target_dtype": a.target_dtype,
        "stored_dtype": "bfloat16",
        "seconds": round(time.perf_counter() - start, 1),
        "tokens_computed": tokens,
    }
    write_json(done, record)
    return record


# -- 4. train (their launcher, patched: R2-R5) -------------------------------------------------------------------


def their_argv(a: argparse.Namespace, rows: dict, data: dict, passthrough: list[str]) -> list[str]:
    n_train, n_val = data["train_rows"], data["val_rows"]
    argv = [
        "--speculator-type", "eagle3",
        "--verifier-name-or-path", rows["target"],
        "--data-path", str(a.out / "data"),
        "--save-path", str(a.out / "checkpoints"),
        "--log-dir", str(a.out / "logs"),
        *(["--draft-attn-impl", "sdpa", "--loss-implementation", "eager"] if a.device == "cpu" else []),  # R5
        *(["--num-workers", "0"] if a.device == "cpu" else []),  # MACHINE_SETTINGS; a GPU: their 12
        "--train-data-ratio", repr((n_train + 0.5) / (n_train + n_val)),
    ]  # fmt: skip
    options = {
        "--epochs": a.epochs,
        "--lr": a.lr,
        "--ttt-steps": a.ttt_steps,
        "--ttt-step-loss-decay": a.ttt_step_loss_decay,
        "--draft-vocab-size": a.draft_vocab_size,
        "--optimizer": a.optimizer,
        "--max-steps": a.max_steps,
        "--total-seq-len": a.total_seq_len,
    }
    for flag, value in options.items():
        if value is not None:
            argv += [flag, str(value)]
    if a.target_layer_ids:
        argv += ["--target-layer-ids", *map(str, a.target_layer_ids)]
    return argv + passthrough


def install_cpu_patches(record: dict, metrics_path: Path) -> None:
    """R2-R4 (see the module docstring), and a JSONL copy of their per-step metric records, and timings."""
    import logging

    import speculators.train.checkpointer as checkpointer
    import speculators.train.cli as cli
    import speculators.train.trainer as trainer_mod
    import torch

    if not torch.accelerator.is_available():
        torch.accelerator.synchronize = lambda *args, **kwargs: None  # R4
        trainer_mod.get_local_rank = lambda: torch.device("cpu")  # R2
        checkpointer.get_current_device = lambda: "cpu"  # R2

    class JsonLines(logging.Handler):
        def emit(self, rec: logging.LogRecord) -> None:
            if isinstance(rec.msg, dict):
                with open(metrics_path, "a") as f:
                    f.write(json.dumps({"time": time.time(), **rec.msg}, default=float) + "\n")

    setup = cli.setup_metric_logger

    def setup_metric_logger(*args, **kwargs):
        setup(*args, **kwargs)
        logging.getLogger("speculators.metrics").addHandler(JsonLines())

    cli.setup_metric_logger = setup_metric_logger

    class CPUTrainer(trainer_mod.Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if not torch.accelerator.is_available():
                self.device_type = "cpu"  # R3
            record["steps_per_epoch"] = len(self.train_loader)
            record["start_epoch"] = self.current_epoch
            record["device_type"] = self.device_type

        def train_epoch(self, epoch, **kwargs):
            t0, s0 = time.perf_counter(), self.global_step
            super().train_epoch(epoch, **kwargs)
            record.setdefault("epochs", []).append(
                {"epoch": epoch, "seconds": round(time.perf_counter() - t0, 2), "steps": self.global_step - s0}
            )

        def val_epoch(self, epoch):
            t0 = time.perf_counter()
            metrics = super().val_epoch(epoch)
            record.setdefault("val", []).append(
                {"epoch": epoch, "seconds": round(time.perf_counter() - t0, 2), "metrics": metrics}
            )
            return metrics

    cli.Trainer = CPUTrainer


def stage_train_child(a: argparse.Namespace, argv: list[str]) -> None:
    """In the child process: their launcher with R2-R5; writes ``OUT/train_record.json``."""
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    record: dict = {"argv": argv, "torch_threads": None}
    install_cpu_patches(record, a.out / "metrics.jsonl")
    import torch

    record["torch_threads"] = torch.get_num_threads()
    cfg = TrainConfig.resolve(argv)
    record["hyperparameters"] = cfg.flatten()
    start = time.perf_counter()
    main(cfg)
    record["seconds"] = round(time.perf_counter() - start, 2)
    record["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
    write_json(a.out / "train_record.json", record)


def last_checkpoint(out: Path) -> Path | None:
    epochs = sorted((int(p.name), p) for p in (out / "checkpoints").glob("[0-9]*") if (p / "config.json").is_file())
    return epochs[-1][1] if epochs else None


def run(a: argparse.Namespace, passthrough: list[str]) -> dict:
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    a.device = device_of(a.device)
    t0 = time.perf_counter()
    rows = stage_prepare(a)
    data = stage_dataset(a, rows, PREPARE_SEQ_LENGTH)
    layer_ids = aux_layer_ids(rows["target"], a.target_layer_ids)
    hs = stage_hidden_states(a, rows, layer_ids)
    argv = their_argv(a, rows, data, passthrough)
    record_path = a.out / "train_record.json"
    if not record_path.is_file() or json.loads(record_path.read_text()).get("argv") != argv:
        ckpts, asked = a.out / "checkpoints", a.out / "checkpoints" / "harness_argv.json"
        if asked.is_file() and json.loads(asked.read_text()) != argv:
            import shutil  # another command's checkpoints: their trainer would resume from them

            log(f"train: {ckpts} holds another command's checkpoints: trained again")
            shutil.rmtree(ckpts)
            (a.out / "metrics.jsonl").unlink(missing_ok=True)
        ckpts.mkdir(parents=True, exist_ok=True)
        write_json(asked, argv)
        log("train: speculators.train " + " ".join(argv))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--stage", "train", "--out", str(a.out), "--", *argv]
        proc = subprocess.run(cmd, cwd=ROOT)
        if proc.returncode != 0:
            sys.exit(f"their trainer failed (exit {proc.returncode}); log above, metrics in {a.out / 'metrics.jsonl'}")
    train = json.loads(record_path.read_text())
    hp = train["hyperparameters"]
    epochs_run = train.get("epochs", [])
    fit_seconds = sum(e["seconds"] for e in epochs_run)
    steps = sum(e["steps"] for e in epochs_run)
    steps_per_epoch = train.get("steps_per_epoch") or 1
    passes = round(steps / steps_per_epoch, 3)
    generated, positions = rows["train"]["generated_tokens"], rows["train"]["tokens"]
    fit = {
        "trainer": "speculators",
        "speculators_version": version("speculators"),
        "torch_version": version("torch"),
        "transformers_version": version("transformers"),
        "checkpoint": str(last_checkpoint(a.out)),
        "rows": rows["train"]["rows"],
        "tokens": generated,
        "positions": positions,
        "val": rows["val"],
        "steps": steps,
        "steps_per_epoch": steps_per_epoch,
        "passes": passes,
        "fit_seconds": round(fit_seconds, 1),
        "val_seconds": round(sum(v["seconds"] for v in train.get("val", [])), 1),
        "train_process_seconds": train["seconds"],
        "hidden_states_seconds": hs["seconds"],
        "wall_seconds_this_call": round(time.perf_counter() - t0, 1),
        "tokens_per_s": round(generated * passes / fit_seconds, 1) if fit_seconds else None,
        "positions_per_s": round(positions * passes / fit_seconds, 1) if fit_seconds else None,
        "tokens_per_s_with_hidden_states": round(generated * passes / (fit_seconds + hs["seconds"]), 1)
        if fit_seconds
        else None,
        "peak_rss_gb": train["peak_rss_gb"],
        "torch_threads": train["torch_threads"],
        "load": [round(x, 2) for x in os.getloadavg()],
        "epochs": epochs_run,
        "val_metrics": train.get("val"),
        "hidden_states": hs,
        "device": a.device,
        "replacements": REPLACEMENTS if a.device == "cpu" else {k: REPLACEMENTS[k] for k in ON_GPU},
        "machine_settings": {k: v for k, v in MACHINE_SETTINGS.items() if a.device == "cpu" or k != "num_workers"},
        "their_argv": argv,
        "hyperparameters": hp,
    }
    write_json(a.out / "fit.json", fit)
    log(
        f"fit: {steps} steps, {passes} passes, {fit['fit_seconds']} s, {fit['tokens_per_s']} generated tokens/s, "
        f"peak RSS {fit['peak_rss_gb']} GB -> {a.out / 'fit.json'}; checkpoint {fit['checkpoint']}"
    )
    return fit


def version(name: str) -> str:
    from importlib.metadata import version as v

    return v(name)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    passthrough: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    a, unknown = parse_args(argv)
    if unknown:
        sys.exit(f"unknown arguments {unknown}: put their flags after --")
    if a.stage == "train":
        stage_train_child(a, passthrough)
        return
    run(a, passthrough)


if __name__ == "__main__":
    main()
