"""SpecForge's own EAGLE-3 trainer on draftsmith's corpus, on a CPU (issue 86). Runs in SpecForge's venv
(``engines/peer_venv.sh specforge``); imports no draftsmith.

What a SpecForge user does for an offline EAGLE-3 run, step by step, with SpecForge's code wherever it runs here:

1. features: SpecForge's offline feature files (what ``scripts/prepare_hidden_states.py`` writes) for the corpus's
   first rows up to ``--tokens`` generated tokens (the rows ``prepare_specforge.py`` wrote; the prefix rule of
   ``draftsmith.train.data.generated_prefix``): per row ``input_ids``, ``loss_mask``, ``aux_hidden_state``
   ``(1, T, 3H)`` and ``hidden_state`` ``(1, T, H)``, built by SpecForge's ``OfflineCaptureLayout.materialize``, one
   ``data_{i}.ckpt`` in ``rows_{g}-{g+2000}/`` as the script groups them, a row with a NaN skipped as it skips them;
   files already written are kept (a finished conversion is not redone).
2. train: ``specforge train --config OUT/run.yaml`` (SpecForge's CLI, in a child process) in offline
   ``local_colocated`` mode, one process: its draft config derived from the target
   (``resolve_draft_config``), its vocabulary mapping (d2t/t2d) counted from the features' loss-masked tokens
   (``_ensure_offline_vocab_mapping``), its ``OnlineEagle3Model`` (training-time test, KL loss to the target head's
   distribution), ``BF16Optimizer`` (AdamW, fp32 masters, grad-norm clip, warmup + cosine), its data-parallel
   wrapper, data loader and checkpointing, all at SpecForge's defaults unless a flag overrides them (``--lr``,
   ``--ttt-length``, ``--draft-vocab``, ``--batch-size``, ``--warmup-ratio``, ``--lr-scheduler``, ``--max-length``,
   ``--epochs``, ``--tokens``: a control with draftsmith's recipe). Logged every ``--log-interval`` (10) steps
   instead of 50 (logging only); ``--profile-steps N`` runs SpecForge's own profiler window and summarises it.
3. export: ``specforge export --to sglang`` of the final checkpoint -> ``OUT/draft`` (SGLang's
   ``LlamaForCausalLMEagle3`` layout), which ``draftsmith import`` reads.

SpecForge's defaults (``specforge.config.TrainingConfig`` / ``DataConfig`` / the EAGLE-3 provider, 0.2.0), recorded
in ``OUT/fit.json`` as resolved: learning_rate 1e-4, num_epochs 1, batch_size 1, accumulation_steps 1, warmup_ratio
0.015, lr_scheduler cosine, max_grad_norm 0.5, ttt_length 7, draft_vocab_size 32000 (target-derived draft config),
one draft layer, max_length 2048, torch_dtype bfloat16, seed 42, capture layers ``[1, L/2 - 1, L - 4]``
(``resolve_eagle_capture_layers``; SGLang captures the input of layer id + 1, i.e. HF ``hidden_states[id + 1]``).
Their example configs train more epochs (e.g. qwen2.5-7b offline: 10 epochs, lr 5e-5); this harness keeps the
schema's defaults and takes ``--epochs``.

Replacements for a CPU (device selection, process-group setup, kernel choice; none of their math); on a CUDA GPU
(``--device``, by default the machine's) only the first and the last apply (the capture then runs on the GPU), and
SpecForge's trainer runs as it is: its device, FSDP, flex attention and Triton loss:

- target capture: SGLang's patched model runner (CUDA, ``sglang`` not installed) -> a transformers forward of the
  same target (``attn_implementation="sdpa"``, the target's config dtype as ``prepare_hidden_states.py`` loads it),
  taking ``hidden_states[id + 1]`` for each SpecForge capture id (SGLang's ``layers_to_capture = id + 1``: the
  residual stream entering that layer) and the final normed hidden state (what SGLang hands its logits processor);
  no LM head is run, as SpecForge's capture skips it. The states are stored in the run's ``model.torch_dtype``
  (bf16): SpecForge's ``TargetHead`` is bf16 and refuses fp32 states, and the hub's SmolLM2-135M-Instruct config is
  bf16, so SGLang would capture bf16 there; draftsmith's converted target dir says float32, so the forward runs in
  fp32 and its states are rounded to bf16 once.
- device: ``SPECFORGE_DEVICE=cpu`` (SpecForge's own switch; ``get_local_device`` -> cpu), so ``init_distributed``
  makes a gloo group of one process (its own cpu -> gloo table) with the env its CLI sets for one process.
- wrapper: FSDP refuses a CPU ("FSDP needs a non-CPU accelerator device") -> ``training.fsdp_sharding=NO_SHARD``,
  SpecForge's own DDP path (its backend wraps NO_SHARD in DDP over the gloo group). One process either way: the same
  bf16 parameters (the draft is built in ``torch_dtype``), the same gradients, the same fp32 AdamW masters.
- attention kernel: ``training.attention_backend=sdpa`` instead of the default ``flex_attention`` (torch's compiled
  flex-attention, SpecForge's GPU path); SpecForge's sdpa path computes the same training-time-test attention.
- loss kernel: ``specforge.core.loss.LogSoftmaxLoss`` is a Triton kernel (forward and backward; ``import triton`` at
  module import, and Triton has no CPU backend) -> the same function in torch ops, the math of that module's own
  reference ``_compute_loss``: per position ``-sum(target_p * log_softmax(logits.float()))`` where
  ``position_mask`` is set, else 0, averaged over all B*T positions; autograd gives the kernel's gradient
  (``softmax * sum(target_p) - target_p``, scaled by 1/(B*T)). Installed as the module ``specforge.core.loss``
  before SpecForge's CLI runs (``python specforge_train.py --specforge ARGS`` = ``specforge ARGS`` with it).
- target files: SpecForge's ``TargetHead`` reads the LM head through a ``*.index.json`` and the key ``lm_head.weight``;
  SmolLM2 ships one unsharded ``model.safetensors`` with tied embeddings. ``OUT/target`` holds links to the target's
  files plus a ``model.safetensors.index.json`` naming that file, and ``model.lm_head_key`` is set to
  ``model.embed_tokens.weight`` (the tied head's tensor): data layout and a config field, not code.

    .venv-specforge/bin/python engines/peers/specforge_train.py --data runs/peers/data/smollm2-1m \\
        --target ~/.cache/draftsmith/targets/smollm2-135m-instruct-float32 --tokens 250000 --epochs 1 \\
        --out runs/peers/specforge-250k
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

FILE_GROUP_SIZE = 2000  # prepare_hidden_states.py's --file-group-size default
RUN_ID = "specforge-eagle3"
REPLACEMENTS = [
    "target capture: transformers forward (sdpa, target config dtype) instead of SGLang's model runner; "
    "aux = HF hidden_states[id + 1] per SpecForge capture id, hidden_state = final normed hidden state",
    "device: SPECFORGE_DEVICE=cpu -> SpecForge's init_distributed makes a gloo group of 1 process",
    "wrapper: training.fsdp_sharding=NO_SHARD (SpecForge's DDP path; FSDP needs an accelerator)",
    "attention kernel: training.attention_backend=sdpa instead of flex_attention",
    "loss kernel: specforge.core.loss.LogSoftmaxLoss (Triton) -> torch ops with its reference _compute_loss's math",
    "target files: OUT/target links + model.safetensors.index.json (TargetHead needs an index); "
    "model.lm_head_key=model.embed_tokens.weight (tied embeddings)",
]
ON_GPU = (REPLACEMENTS[0], REPLACEMENTS[-1])
"""On a CUDA GPU SpecForge's trainer runs as it is (its device, FSDP, flex attention and Triton loss); the target's
capture by transformers (on the GPU) and the target files' index stay."""


def device_of(asked: str) -> str:
    """``--device``: ``auto`` is cuda where torch sees a GPU, else cpu."""
    if asked != "auto":
        return asked
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def install_torch_loss() -> None:
    """``specforge.core.loss`` without Triton: ``LogSoftmaxLoss.apply(logits, target_p, position_mask)`` in torch
    ops (the module's reference ``_compute_loss``; positions whose mask is 0 contribute 0, as the kernel skips them)."""
    import types

    import torch

    class LogSoftmaxLoss:
        @staticmethod
        def apply(logits, target, position_mask):
            per_position = -(target.float() * torch.log_softmax(logits.float(), dim=-1)).sum(-1)
            keep = position_mask.reshape(per_position.shape).bool()
            return torch.where(keep, per_position, torch.zeros_like(per_position)).mean()

    module = types.ModuleType("specforge.core.loss")
    module.LogSoftmaxLoss = LogSoftmaxLoss
    module.__doc__ = (
        "draftsmith's CPU stand-in for SpecForge's Triton LogSoftmaxLoss (engines/peers/specforge_train.py)"
    )
    sys.modules["specforge.core.loss"] = module


def specforge_cli(argv: list[str]) -> int:
    """SpecForge's CLI (``specforge ARGS``), with the torch loss installed where it runs on the CPU (``main`` sets
    ``SPECFORGE_DEVICE=cpu`` there; on a GPU its Triton kernel runs)."""
    if os.environ.get("SPECFORGE_DEVICE") == "cpu":
        install_torch_loss()
    from specforge.cli import main as specforge_main

    return specforge_main(argv)


def log(msg: str) -> None:
    print(f"[specforge_train] {msg}", flush=True)


def select_rows(data: Path, tokens: int | None) -> tuple[int, int]:
    """(rows, generated tokens) of the shortest prefix holding ``tokens`` generated tokens (all rows if None or
    more than the corpus holds): ``draftsmith.train.data.generated_prefix``'s rule over ``meta.json``'s totals."""
    cumsum = json.loads((data / "meta.json").read_text())["generated_cumsum"]
    if tokens is None:
        return len(cumsum), cumsum[-1]
    for i, total in enumerate(cumsum):
        if total >= tokens:
            return i + 1, total
    return len(cumsum), cumsum[-1]


def read_rows(data: Path, n: int) -> list[dict]:
    rows = []
    with open(data / "rows.jsonl") as f:
        for line in f:
            if len(rows) == n:
                break
            rows.append(json.loads(line))
    return rows


def target_view(target: Path, out: Path) -> Path:
    """``out``: links to ``target``'s files plus the ``model.safetensors.index.json`` SpecForge's TargetHead reads."""
    from safetensors import safe_open

    out.mkdir(parents=True, exist_ok=True)
    for f in target.iterdir():
        link = out / f.name
        if not link.exists():
            link.symlink_to(f.resolve())
    index = out / "model.safetensors.index.json"
    if not index.exists() and (target / "model.safetensors").is_file():
        with safe_open(target / "model.safetensors", framework="pt") as f:
            weight_map = {k: "model.safetensors" for k in f.keys()}  # noqa: SIM118 (a safe_open, not a dict)
        index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    return out


def base_config(a, out: Path) -> dict:
    """The run's SpecForge config (as ``specforge train --config`` reads it); CLI overrides only where given."""
    training = {
        "strategy": "eagle3",
        **({"attention_backend": "sdpa", "fsdp_sharding": "NO_SHARD"} if a.device == "cpu" else {}),
        "num_epochs": a.epochs,
        "log_interval": a.log_interval,
    }
    for key, value in (
        ("learning_rate", a.lr),
        ("ttt_length", a.ttt_length),
        ("batch_size", a.batch_size),
        ("warmup_ratio", a.warmup_ratio),
        ("lr_scheduler", a.lr_scheduler),
        ("max_steps", a.max_steps),
        ("seed", a.seed),
    ):
        if value is not None:
            training[key] = value
    data = {"hidden_states_path": str(out / "features"), "cache_dir": str(out / "cache")}
    if a.max_length is not None:
        data["max_length"] = a.max_length
    if a.workers is not None:
        data["dataloader_num_workers"] = a.workers
    model = {
        "target_model_path": str(out / "target"),
        "draft_model_config": str(out / "draft_config.json"),
        "embedding_key": "model.embed_tokens.weight",
        "lm_head_key": a.lm_head_key,
    }
    raw = {"model": model, "data": data, "training": training, "run_id": RUN_ID, "output_dir": str(out / "train")}
    if a.profile_steps:  # SpecForge's own profiler window (torch.profiler, a chrome trace in output_dir)
        raw["profiling"] = {"enabled": True, "start_step": 1, "num_steps": a.profile_steps, "record_shapes": True}
        training["max_steps"] = 1 + a.profile_steps
    return raw


def eagle3():
    """SpecForge's registered EAGLE-3 algorithm (its providers: draft config, capture layout, ...)."""
    from specforge.algorithms.builtin import builtin_algorithm_registry

    return builtin_algorithm_registry().resolve("eagle3")


def resolved_config(raw: dict):
    from specforge.config import Config

    return Config.model_validate(raw)


def write_draft_config(raw: dict, out: Path, draft_vocab: int | None) -> dict:
    """SpecForge's target-derived EAGLE-3 draft config (``resolve_draft_config``), ``draft_vocab_size`` overridden
    only when asked; written to ``OUT/draft_config.json`` for training and export."""
    path = out / "draft_config.json"
    if path.is_file():
        return json.loads(path.read_text())
    from specforge.training.model_loading import resolve_draft_config

    generated = dict(raw, model={k: v for k, v in raw["model"].items() if k != "draft_model_config"})
    cfg = resolved_config(generated)
    provider = eagle3().providers.model.draft_config
    config = resolve_draft_config(cfg, provider=provider)
    if draft_vocab is not None:
        config.draft_vocab_size = draft_vocab
    config.to_json_file(str(path))
    return json.loads(path.read_text())


def capture_layers(raw: dict, out: Path) -> list[int]:
    """SpecForge's EAGLE-3 capture ids for this draft config and target (``resolve_eagle_capture_layers``)."""
    from specforge.algorithms.model_providers import resolve_eagle_capture_layers
    from transformers import AutoConfig

    cfg = resolved_config(raw)
    draft = json.loads((out / "draft_config.json").read_text())
    return resolve_eagle_capture_layers(cfg, draft, AutoConfig.from_pretrained(cfg.model.target_model_path))


def feature_path(features: Path, idx: int) -> Path:
    """``HiddenStatesGenerator._get_file_path``'s layout."""
    group = (idx // FILE_GROUP_SIZE) * FILE_GROUP_SIZE
    return features / f"rows_{group}-{group + FILE_GROUP_SIZE}" / f"data_{idx}.ckpt"


def write_features(
    rows: list[dict], target: Path, features: Path, layers: list[int], store: str, device: str = "cpu"
) -> dict:
    """SpecForge's offline feature files for ``rows`` (existing ones kept), the target's forward on ``device``;
    returns what the conversion did."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    layout = eagle3().providers.offline_for("text").capture_layout
    todo = [i for i in range(len(rows)) if not feature_path(features, i).is_file()]
    record = {"rows": len(rows), "written": len(todo), "kept": len(rows) - len(todo), "skipped_nan": 0}
    if not todo:
        return record | {"seconds": 0.0}
    config = AutoConfig.from_pretrained(target)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype, attn_implementation="sdpa").eval().to(device)
    body = model.model  # the LM head is not run: SpecForge's capture returns states, not logits
    start = time.perf_counter()
    with torch.inference_mode():
        for n, i in enumerate(todo):
            ids = torch.tensor(rows[i]["input_ids"], dtype=torch.long)
            outputs = body(input_ids=ids[None].to(device), output_hidden_states=True, use_cache=False)
            states = outputs.hidden_states
            aux = torch.cat([states[layer + 1][0] for layer in layers], dim=-1).to(getattr(torch, store)).cpu()
            last = outputs.last_hidden_state[0].to(getattr(torch, store)).cpu()
            item = layout.materialize(
                {
                    "input_ids": ids.clone(),
                    "loss_mask": torch.tensor(rows[i]["loss_mask"], dtype=torch.long),
                    "aux_hidden_states": aux.clone().unsqueeze(0),
                    "last_hidden_states": last.clone().unsqueeze(0),
                }
            )
            if any(torch.is_floating_point(t) and bool(torch.isnan(t).any()) for t in item.values()):
                record["skipped_nan"] += 1
                continue
            path = feature_path(features, i)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            torch.save(item, tmp)
            tmp.replace(path)
            if n % 100 == 0:
                log(f"features {n + 1}/{len(todo)} ({time.perf_counter() - start:.0f} s)")
    seconds = round(time.perf_counter() - start, 2)
    return record | {"seconds": seconds, "forward_dtype": str(dtype), "stored": store, "device": device}


def trained_tokens(rows: list[dict], max_length: int) -> dict:
    """Tokens a pass trains on, as SpecForge's offline normaliser cuts a row (``normalize_offline_sample``:
    ``max_length`` first, then the last position's loss mask zeroed)."""
    seq = loss = 0
    for r in rows:
        mask = r["loss_mask"][:max_length]
        seq += len(mask)
        loss += sum(mask[:-1])
    return {"sequence_tokens": seq, "loss_tokens": loss}


def run_logged(cmd: list[str], logfile: Path, env: dict) -> tuple[float, int]:
    """Run ``cmd`` with its output appended to ``logfile``; (seconds, peak RSS of the largest child in KiB)."""
    start = time.perf_counter()
    with open(logfile, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode:
        tail = logfile.read_text().splitlines()[-40:]
        raise SystemExit(f"{' '.join(cmd[-6:])} failed ({proc.returncode}); {logfile}:\n" + "\n".join(tail))
    return seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss


def last_checkpoint(train: Path) -> tuple[Path, int]:
    steps = [(int(m.group(1)), p) for p in train.glob(f"{RUN_ID}-step*") if (m := re.search(r"-step(\d+)$", p.name))]
    if not steps:
        raise SystemExit(f"no checkpoint under {train}")
    step, path = max(steps)
    return path, step


def step_lines(logfile: Path) -> list[dict]:
    """The trainer's logged metrics (``step N: {...}`` lines)."""
    out = []
    for line in logfile.read_text().splitlines():
        m = re.match(r"step (\d+): (\{.*\})$", line.strip())
        if m:
            try:
                out.append(
                    {
                        "step": int(m.group(1)),
                        **eval(m.group(2), {"__builtins__": {}, "nan": float("nan"), "inf": float("inf")}),
                    }
                )
            except SyntaxError:
                continue
    return out


def summarize_trace(train: Path, top: int = 15) -> dict | None:
    """Self CPU time per op of SpecForge's profiler trace (``aten::`` ops nested per thread), largest first."""
    import gzip

    traces = sorted(train.glob("profile_rank0_*.trace.json.gz"))
    if not traces:
        return None
    with gzip.open(traces[-1], "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    self_us: dict[str, float] = {}
    by_thread: dict = {}
    for e in events:
        by_thread.setdefault(e.get("tid"), []).append(e)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        for e in evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            self_us[e["name"]] = self_us.get(e["name"], 0.0) + e["dur"]
            if stack:
                self_us[stack[-1]["name"]] -= e["dur"]
            stack.append(e)
    total = sum(self_us.values())
    ranked = sorted(self_us.items(), key=lambda kv: -kv[1])[:top]
    return {
        "trace": str(traces[-1]),
        "total_self_s": round(total / 1e6, 2),
        "ops": [{"op": k, "self_s": round(v / 1e6, 3), "share": round(v / total, 3)} for k, v in ranked],
    }


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="prepare_specforge.py's output dir")
    p.add_argument("--target", type=Path, required=True, help="the target's HF directory")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokens", type=int, default=None, help="generated-token budget (the corpus's first rows)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--ttt-length", type=int, default=None)
    p.add_argument("--draft-vocab", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--warmup-ratio", type=float, default=None)
    p.add_argument("--lr-scheduler", choices=["cosine", "constant"], default=None)
    p.add_argument("--max-length", type=int, default=None)
    p.add_argument("--max-steps", type=int, default=None, help="stop after N optimizer steps (profiling)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--workers", type=int, default=None, help="data.dataloader_num_workers (SpecForge default 4)")
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--lm-head-key", default="model.embed_tokens.weight")
    p.add_argument("--profile-steps", type=int, default=None, help="profile N steps after the first, then stop")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the trainer (default: torch's)")
    p.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="where the capture and SpecForge's trainer run (auto: cuda where torch sees a GPU, else cpu)",
    )
    return p.parse_args()


def main() -> None:
    a = parse()
    a.device = device_of(a.device)
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    logfile = out / "train.log"
    n_rows, generated = select_rows(a.data, a.tokens)
    rows = read_rows(a.data, n_rows)
    log(f"{n_rows} rows, {generated} generated tokens ({sum(len(r['input_ids']) for r in rows)} tokens in all)")
    target_view(a.target.resolve(), out / "target")
    raw = base_config(a, out)
    draft = write_draft_config(raw, out, a.draft_vocab)
    layers = capture_layers(raw, out)
    log(
        f"capture ids {layers} (HF hidden_states {[i + 1 for i in layers]}); draft vocab {draft.get('draft_vocab_size')}"
    )
    store = resolved_config(raw).model.torch_dtype
    conversion = write_features(rows, out / "target", out / "features", layers, store, a.device)
    log(f"features: {conversion}")

    import yaml

    (out / "run.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = resolved_config(raw)
    env = dict(os.environ, PYTHONUNBUFFERED="1") | ({"SPECFORGE_DEVICE": "cpu"} if a.device == "cpu" else {})
    if a.threads:
        env["OMP_NUM_THREADS"] = str(a.threads)
    specforge = [sys.executable, str(Path(__file__).resolve()), "--specforge"]
    log(f"training: specforge train --config {out / 'run.yaml'} (log: {logfile})")
    fit_seconds, peak_kib = run_logged([*specforge, "train", "--config", str(out / "run.yaml")], logfile, env)
    checkpoint, steps = last_checkpoint(out / "train")
    draft_dir = out / "draft"
    export_seconds, _ = run_logged(
        [
            *specforge,
            "export",
            "--to",
            "sglang",
            "--checkpoint",
            str(checkpoint),
            "--draft-config",
            str(out / "draft_config.json"),
            "--output-dir",
            str(draft_dir),
        ],
        logfile,
        env,
    )
    t = cfg.training
    counted = trained_tokens(rows, cfg.data.max_length)
    metrics = step_lines(logfile)
    passes = steps * t.batch_size * t.accumulation_steps / n_rows
    record = {
        "trainer": "specforge",
        "specforge_version": __import__("importlib.metadata").metadata.version("specforge"),
        "command": " ".join(sys.argv),
        "rows": n_rows,
        "generated_tokens": generated,
        **counted,
        "epochs": t.num_epochs,
        "steps": steps,
        "passes": round(passes, 3),
        "fit_seconds": round(fit_seconds, 2),
        "tokens_per_s": round(counted["loss_tokens"] * passes / fit_seconds, 1),
        "sequence_tokens_per_s": round(counted["sequence_tokens"] * passes / fit_seconds, 1),
        "peak_rss_mib": round(peak_kib / 1024, 1),
        "conversion": conversion,
        "export_seconds": round(export_seconds, 2),
        "hyperparameters": {
            "learning_rate": t.learning_rate,
            "num_epochs": t.num_epochs,
            "batch_size": t.batch_size,
            "accumulation_steps": t.accumulation_steps,
            "warmup_ratio": t.warmup_ratio,
            "lr_scheduler": t.lr_scheduler,
            "max_grad_norm": t.max_grad_norm,
            "ttt_length": t.ttt_length,
            "max_length": cfg.data.max_length,
            "draft_vocab_size": draft.get("draft_vocab_size"),
            "draft_num_hidden_layers": draft.get("num_hidden_layers"),
            "torch_dtype": cfg.model.torch_dtype,
            "attention_backend": t.attention_backend,
            "seed": t.seed,
            "capture_layer_ids": layers,
        },
        "device": a.device,
        "replacements": REPLACEMENTS if a.device == "cpu" else list(ON_GPU),
        "checkpoint": str(checkpoint),
        "draft": str(draft_dir),
        "last_metrics": metrics[-1] if metrics else None,
        "step_seconds": [m["perf/optimizer_step_time_s"] for m in metrics if "perf/optimizer_step_time_s" in m],
        "profile": summarize_trace(out / "train") if a.profile_steps else None,
    }
    (out / "fit.json").write_text(json.dumps(record, indent=1))
    log(f"done: {record['steps']} steps, {record['fit_seconds']} s, {record['tokens_per_s']} tokens/s -> {draft_dir}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--specforge"]:
        sys.exit(specforge_cli(sys.argv[2:]))
    main()
