"""The device check of a GPU fit (``gpu_check.py --check``): does the recipe's drafter learn on this GPU, how fast does
the fit loop train it, and, if a value turns non-finite, where does it come from. One run, about 7 minutes on one
H100 / H200, printing one table:

1. env: torch / CUDA / cuDNN / transformers, the SDPA kernel PyTorch picks for a drafter-shaped masked call, the
   target's weights hash, and whether its logits are its head on its final hidden state;
2. kernels: real padded batches of the fit (those whose length is 64 past a multiple of 128 first, the shapes of
   pytorch#196678): the target's logits and features finite (bf16 autocast, the fast kernels), and the fresh drafter's
   loss and gradients finite under each SDPA kernel forced in turn (default, cuDNN, memory-efficient, math);
3. rate: the recipe's fit (its ``DrafterModule`` under a Lightning ``Trainer``, ``FiniteGuard`` on, bf16-mixed, the
   recipe's batch shape) for ``--rate-seconds`` each, online (the target in every step) and cached (the feature
   cache's hidden states in pinned host memory, copied in by the loop: the disk read left out), with cuDNN attention
   on and off: tokens/s after the first step, peak GPU memory, and the guard's line if a step was non-finite;
4. fit: the recipe's drafter trained online for ``--fit-minutes`` from a fresh start (cuDNN as ``DrafterModule`` sets
   it), validated after each ``--val-seconds`` (``val/tau_est`` on the val corpus; the interval in steps from the
   rate stage's speed), the training loss every 10 steps, and the guard's line if it stopped the fit.

SmolLM2's weights travel as ``benchmarks/gpu_weights.sh`` says (``split`` here; call A carries
``[".gpu/part-a", ".whl"]``, call B ``[".gpu/part-b", ".gpu/smollm2"]``); call B then runs the check (timeout_s 600):

    bash benchmarks/gpu_weights.sh b /root/smol && \
        PYTHONPATH=. python3 benchmarks/gpu_check.py --check --target /root/smol --out $OUT --sha SHA
    .venv/bin/python benchmarks/gpu_check.py --check --smoke --device cpu --target DIR --corpus C --val-corpus V \
        --recipe R --out D        # the mechanics on a CPU, tiny (tests/test_gpu_check.py runs it on a tiny target)

and ``OUT/gpu_fit_<device>.{json,md}`` are copied to ``benchmarks/results/``.

Folds in ``../shared/tools/gpu_fit_diag.py`` (stages 1, 2 and its two short fits, which are stage 3's cuDNN on / off
online fits with the guard's per-step checks). Writes ``OUT/gpu_fit_<device>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import re
import time
from pathlib import Path

import lightning as L
import torch
from gpu_fit import PackedData, TokenCounter, recipe_module, sync
from torch.utils.data import DataLoader

import draftsmith.layers.module as drafter_module
from draftsmith.errors import DraftsmithError

TRAINING_ATTENTION = drafter_module.training_attention
"""What ``DrafterModule.on_fit_start`` calls (cuDNN attention off on CUDA); the cuDNN-on fits replace it."""


def finite(t) -> bool:
    return all(bool(torch.isfinite(x).all()) for x in (t if isinstance(t, (list, tuple)) else [t]))


def kernels_of(device: str) -> dict:
    """The SDPA kernels forced in turn (None: PyTorch's choice)."""
    from torch.nn.attention import SDPBackend

    if not device.startswith("cuda"):
        return {"default": None, "math": [SDPBackend.MATH]}
    return {"default": None, "cudnn": [SDPBackend.CUDNN_ATTENTION], "efficient": [SDPBackend.EFFICIENT_ATTENTION],
            "math": [SDPBackend.MATH]}  # fmt: skip


def env(module, device: str) -> dict:
    """Versions, the GPU, the kernel SDPA picks for a masked drafter-shaped call, the target's weights hash."""
    import transformers

    t = module.target
    out = {"torch": torch.__version__, "transformers": transformers.__version__, "device": device}
    if device.startswith("cuda"):
        out |= {"gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version(), "cudnn_sdp_enabled": torch.backends.cuda.cudnn_sdp_enabled()}  # fmt: skip
        q = torch.randn(8, 9, 320, 64, device=device, dtype=torch.bfloat16)
        mask = torch.ones(320, 640, dtype=torch.bool, device=device).tril()[None, None]
        try:  # 0 math, 1 flash, 2 efficient, 3 cudnn (torch.nn.attention.SDPBackend)
            out["sdpa_choice_masked"] = int(
                torch._fused_sdp_choice(q, q.repeat(1, 1, 2, 1), q.repeat(1, 1, 2, 1), mask)
            )
        except Exception as e:  # noqa: BLE001
            out["sdpa_choice_masked"] = repr(e)[:120]
    h = hashlib.sha256()
    for name, p in sorted(t.model.state_dict().items()):
        h.update(name.encode() + p.detach().float().cpu().numpy().tobytes())
    try:
        t.check_final_logits("check")
        final_ok = True
    except DraftsmithError as e:
        final_ok = str(e)[:200]
    return out | {"weights_sha256": h.hexdigest()[:16], "num_layers": t.num_layers, "final_state_logits": final_ok}


def kernels(module, batches: list[dict], device: str) -> list[dict]:
    """Per batch: the target's outputs finite, and the drafter's loss and gradients finite under each SDPA kernel."""
    from torch.nn.attention import sdpa_kernel

    rows = []
    module.train()
    kind = device.split(":")[0]
    for batch in batches:
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.no_grad(), torch.autocast(kind, dtype=torch.bfloat16):
            out = module.target_forward(batch, module.loss_vocab())
        row = {"T": batch["input_ids"].shape[1], "target_finite": finite(out.logits) and finite(list(out.features))}
        for name, chosen in kernels_of(device).items():
            module.zero_grad(set_to_none=True)
            try:
                with sdpa_kernel(chosen) if chosen else contextlib.nullcontext(), torch.autocast(kind, torch.bfloat16):
                    loss = module.losses(batch, out)["loss"]
                loss.backward()
                bad = [n for n, p in module.drafter.named_parameters() if p.grad is not None and not finite(p.grad)]
                row[name] = {"loss": round(float(loss), 4), "grads_finite": not bad, "bad": bad[:4]}
            except RuntimeError as e:  # a kernel that refuses the shape
                row[name] = {"error": str(e).splitlines()[0][:120]}
        module.zero_grad(set_to_none=True)
        rows.append(row)
        print("kernels", json.dumps(row), flush=True)
    return rows


class HostFeatures(L.LightningDataModule):
    """Collated batches with the target's hidden states as the feature cache stores them (the feature layers and the
    final normed state, bf16), in host memory (pinned on CUDA), cycled: a fit from cached features, the disk left out.
    ``cache`` is set, so the module checks, as for a real cache, that the target's logits are its head's."""

    cache = "host memory"

    def __init__(self, batches: list[dict], source) -> None:
        super().__init__()
        self.batches, self.source = batches, source

    def check_target(self, target) -> None:
        pass

    def token_counts(self, vocab_size: int) -> torch.Tensor:
        return self.source.token_counts(vocab_size)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.batches, batch_size=None, shuffle=False)


def host_hidden(t, ids: torch.Tensor, mask: torch.Tensor) -> dict[int, torch.Tensor]:
    """The target's hidden states over ``ids`` (on the target's device) as the feature cache stores them: the feature
    layers and the final state, layer -> bf16 (B, T, H) in host memory, pinned when the target runs on CUDA."""
    layers = (*t.feature_layers, t.num_layers)
    with torch.no_grad():
        feats = t(ids, attention_mask=mask, feature_layers=layers, last_logits_only=True).features
    hidden = {layer: f.to("cpu", torch.bfloat16) for layer, f in zip(layers, feats, strict=True)}
    return {layer: h.pin_memory() if ids.is_cuda else h for layer, h in hidden.items()}


def host_features(module, loader: DataLoader, device: str, n: int) -> list[dict]:
    """The first ``n`` batches of ``loader`` with the target's hidden states (computed here, on ``device``)."""
    out = []
    for _, batch in zip(range(n), loader, strict=False):
        ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        out.append(batch | {"hidden": host_hidden(module.target, ids, mask)})
    return out


class Record(L.Callback):
    """The training loss every ``every`` steps (kept on the device, read at the end) and ``val/tau_est`` at each
    validation with the fit's seconds so far (validations' own time left out)."""

    def __init__(self, every: int = 10) -> None:
        self.every, self.losses, self.taus = every, [], []
        self.started, self.in_val = None, 0.0

    def on_train_start(self, trainer, module) -> None:
        self.started = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every == 0:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            self.losses.append((trainer.global_step, loss.detach().float()))

    def on_validation_start(self, trainer, module) -> None:
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer, module) -> None:
        self.in_val += time.perf_counter() - self._val_start
        tau = trainer.callback_metrics.get("val/tau_est")
        if not trainer.sanity_checking and tau is not None and self.started is not None:
            seconds = time.perf_counter() - self.started - self.in_val
            self.taus.append(
                {"step": trainer.global_step, "train_seconds": round(seconds, 1), "tau": round(float(tau), 4)}
            )

    def loss_rows(self) -> list[list]:
        return [[step, float(v)] for step, v in self.losses]


def run_fit(module, data, device: str, args, *, seconds: float, cudnn: bool | None, steps: int = 10**6, val_every: int | None = None,
            counter=None, record: Record | None = None) -> dict:  # fmt: skip
    """One fit of ``module`` on ``data`` for ``seconds`` (bf16-mixed, the recipe's clipping, ``FiniteGuard`` on);
    ``cudnn``: force cuDNN attention on or off (None: as ``DrafterModule`` sets it); ``steps``: the schedule's length
    (the learning rate's cosine decay; the time limit may stop it first). Returns what it measured."""
    drafter_module.training_attention = (lambda device: None) if cudnn else TRAINING_ATTENTION
    cuda = device.startswith("cuda")
    if cuda:
        torch.backends.cuda.enable_cudnn_sdp(bool(cudnn))
        torch.cuda.reset_peak_memory_stats(device)
    callbacks = [c for c in (counter, record) if c is not None]
    validate = {"val_check_interval": val_every, "check_val_every_n_epoch": None, "num_sanity_val_steps": 0} if (
        val_every) else {"limit_val_batches": 0, "num_sanity_val_steps": 0}  # fmt: skip
    trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1, precision=args.precision, logger=False,
                        enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                        max_steps=steps, max_epochs=-1, max_time={"seconds": seconds}, gradient_clip_val=1.0,
                        log_every_n_steps=10, callbacks=callbacks, **validate)  # fmt: skip
    stopped = None
    start = time.perf_counter()
    try:
        trainer.fit(module, datamodule=data)
    except DraftsmithError as e:  # FiniteGuard's one line: the step, the loss terms, the first bad gradient
        stopped = str(e)
    sync(device)
    out = {"steps": trainer.global_step, "seconds": round(time.perf_counter() - start, 1), "nonfinite": stopped}
    if counter is not None:
        steady = counter.steady()
        out |= {"tokens": counter.tokens, "tokens_per_s": round(steady, 1) if steady else None}
        if counter.first is not None and counter.last > counter.first:
            out["steps_per_s"] = round((trainer.global_step - 1) / (counter.last - counter.first), 2)
    if cuda:
        out["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    drafter_module.training_attention = TRAINING_ATTENTION
    return out


def device_tag(name: str) -> str:
    """A device's name in a word for the results' name: ``h100``, ``h200``, ``a100``, ``cpu``."""
    found = re.search(r"\b([A-Z]+\d{2,4})\b", name)
    return found.group(1).lower() if found else re.sub(r"\W+", "-", name.lower()).strip("-")


def run_check(target: str, device_name: str, record: dict, args: argparse.Namespace) -> Path:
    """``--check``: the stages, saved after each to ``OUT/gpu_fit_<device>.json`` (a run stopped at the device's time
    limit keeps what it measured), then the table, printed and written beside it as ``.md``."""
    name = f"gpu_fit_{device_tag(device_name)}" + ("_smoke" if args.smoke else "")
    path = args.out / f"{name}.json"
    head = {"machine": record, "device": device_name, "target": str(args.target), "smoke": args.smoke}

    def save(result: dict) -> None:
        path.write_text(json.dumps(head | result, indent=2))

    result = head | check(target, args.device, args, save)
    save(result)
    (args.out / f"{name}.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {path} and .md")
    return path


def check(target: str, device: str, args: argparse.Namespace, save) -> dict:
    """The four stages; ``save(result)`` after each."""
    from draftsmith.data.packed import read_columns
    from draftsmith.train.data import generated_prefix
    from draftsmith.train.fit import configure

    started, result = time.perf_counter(), {}
    shape = configure(args.recipe)["data"]
    shape = shape.get("init_args", shape)  # a plain data section, or a datamodule's {class_path, init_args}
    batch, max_length = args.fit_batch or shape["batch_size"], args.max_length or shape["max_length"]
    _, columns = read_columns(args.corpus)
    rows, _ = generated_prefix(columns["loss_mask"], args.tokens)
    _, val = read_columns(args.val_corpus)
    data = PackedData({k: columns[k][:rows] for k in ("input_ids", "loss_mask")},
                      {k: val[k][: args.val_rows] for k in ("input_ids", "loss_mask")}, batch, max_length)  # fmt: skip
    result["val_seconds"] = None if args.val_steps else args.val_seconds  # None: every --val-steps
    result["shape"] = {"recipe": args.recipe, "batch": batch, "max_length": max_length, "rows": rows,
                       "precision": args.precision}  # fmt: skip

    def stage(name: str, value) -> None:
        result[name] = value
        result["seconds"] = round(time.perf_counter() - started, 1)
        save(result)

    module = recipe_module(args.recipe, target, batch)
    module.prepare_from_data(data)
    module.to(device)
    module.target.model.to(device)
    stage("env", env(module, device))
    print("env", json.dumps(result["env"]), flush=True)
    loader = list(zip(range(4 * args.kernel_batches), data.train_dataloader(), strict=False))
    chosen = sorted((b for _, b in loader), key=lambda b: b["input_ids"].shape[1] % 128 != 64)[: args.kernel_batches]
    stage("kernels", kernels(module, chosen, device))
    fresh = {k: v.detach().clone() for k, v in module.drafter.state_dict().items()}
    cached = HostFeatures(host_features(module, data.train_dataloader(), device, args.cached_batches), data)

    rate = {}
    for mode, source in (("online", data), ("cached", cached)):
        for cudnn in (True, False) if device.startswith("cuda") else (False,):
            module.drafter.load_state_dict(fresh)  # each from the same start: a NaN one does not carry over
            key = f"{mode}, cuDNN {'on' if cudnn else 'off'}"
            rate[key] = run_fit(module, source, device, args, seconds=args.rate_seconds, cudnn=cudnn,
                                steps=args.rate_steps or 10**6, counter=TokenCounter())  # fmt: skip
            print("rate", key, json.dumps(rate[key]), flush=True)
            stage("rate", rate)
    del cached

    module.drafter.load_state_dict(fresh)
    speed = max((r.get("steps_per_s") or 0 for k, r in rate.items() if k.startswith("online")), default=0)
    val_every = args.val_steps or (max(1, round(speed * args.val_seconds)) if speed else 200)
    record = Record()
    steps = args.fit_steps or (max(1, round(speed * 60 * args.fit_minutes)) if speed else 10**6)  # what time allows
    fit = run_fit(module, data, device, args, seconds=60 * args.fit_minutes, cudnn=None, steps=steps, val_every=val_every,
                  counter=TokenCounter(), record=record)  # fmt: skip
    fit |= {"val_every_steps": val_every, "train_loss": record.loss_rows(), "val": record.taus}
    fit["loss_finite"] = all(math.isfinite(v) for _, v in fit["train_loss"])
    stage("fit", fit)
    print("fit", json.dumps(fit), flush=True)
    return result


def table(result: dict) -> str:
    """The one table of the check."""
    e, s = result.get("env", {}), result["shape"]
    rows = [("device", f"{result['device']}; torch {e.get('torch')}, CUDA {e.get('cuda', '–')}, cuDNN "
             f"{e.get('cudnn', '–')}, transformers {e.get('transformers')}; SDPA's pick for a masked call: "
             f"{e.get('sdpa_choice_masked', '–')} (1 flash, 2 efficient, 3 cuDNN); target weights "
             f"{e.get('weights_sha256')}")]  # fmt: skip
    batches = result.get("kernels", [])
    if batches:
        names = [k for k in batches[0] if k not in ("T", "target_finite")]
        per = []
        for name in names:
            ok = sum(
                bool(b[name].get("grads_finite")) and math.isfinite(b[name].get("loss", math.nan)) for b in batches
            )
            bad = next((b for b in batches if not b[name].get("grads_finite")), None)
            first = f" (first: T = {bad['T']}, {bad[name].get('bad') or bad[name].get('error')})" if bad else ""
            per.append(f"{name} {ok}/{len(batches)}{first}")
        target_ok = sum(b["target_finite"] for b in batches)
        rows.append((f"kernels: {len(batches)} padded batches (T % 128 = 64 first), loss and gradients finite",
                     "; ".join(per) + f"; the target's outputs {target_ok}/{len(batches)}"))  # fmt: skip
    for key, r in result.get("rate", {}).items():
        speed = f"{r['tokens_per_s']:,.0f} tokens/s" if r.get("tokens_per_s") else "–"
        peak = f", peak {r['peak_gib']} GiB" if "peak_gib" in r else ""
        rows.append((f"fit tokens/s, {key} ({s['batch']} × ≤ {s['max_length']}, {r['steps']} steps)",
                     f"{speed}{peak}; " + (f"**non-finite**: {r['nonfinite']}" if r["nonfinite"] else "all finite")))  # fmt: skip
    fit = result.get("fit")
    if fit:
        losses = ", ".join(f"{step}: {v:.3g}" for step, v in fit["train_loss"])
        taus = ", ".join(f"{t['train_seconds'] / 60:.1f} min (step {t['step']}): {t['tau']:.3f}" for t in fit["val"])
        peak = f", peak {fit['peak_gib']} GiB" if "peak_gib" in fit else ""
        speed = f"{fit['tokens_per_s']:,.0f} tokens/s" if fit.get("tokens_per_s") else "–"
        rows += [
            (
                f"fit `{s['recipe']}`, online: steps, speed",
                f"{fit['steps']} steps in {fit['seconds']} s, {speed}{peak}",
            ),
            ("train loss every 10 steps (step: loss)", losses or "–"),
            (
                "any non-finite value",
                f"**yes**: {fit['nonfinite']}"
                if fit["nonfinite"]
                else ("no" if fit["loss_finite"] else "**yes**: a recorded loss"),
            ),  # fmt: skip
            (
                f"val τ_est every {fit['val_every_steps']} steps"
                + (f" (~ {result['val_seconds']:g} s of training)" if result.get("val_seconds") else ""),
                taus or "–",
            ),
        ]
    lines = ["| check | result |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]
    return "\n".join(lines)


def markdown(result: dict) -> str:
    m, s = result["machine"], result["shape"]
    return "\n".join([
        f"# A GPU fit checked: {result['device']}",
        "",
        f"`{m['command']}` at `{m['git']}` on {m['date']}; target {result['target']}; recipe `{s['recipe']}` at "
        f"{s['batch']} rows × ≤ {s['max_length']} tokens, {s['precision']}, on the packed corpus's first "
        f"{s['rows']:,} rows" + (" (**smoke settings: mechanics only**)" if result.get("smoke") else "") + ".",
        "",
        table(result),
        "",
        f"Seconds: {result.get('seconds')}.",
        "",
    ])  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("check", "--check: the device check of a GPU fit (this module's docstring)")
    g.add_argument("--check", action="store_true", help="run the device check (kernels, fit rates, a timed fit)")
    g.add_argument("--smoke", action="store_true", help="tiny settings: the check's mechanics in a minute on a CPU")
    g.add_argument("--kernel-batches", type=int, default=16, help="padded batches checked under each SDPA kernel")
    g.add_argument("--cached-batches", type=int, default=64, help="batches whose hidden states the cached fits cycle")
    g.add_argument("--rate-seconds", type=float, default=25.0, help="each rate fit's seconds")
    g.add_argument("--val-seconds", type=float, default=60.0, help="training seconds between the fit's validations")
    g.add_argument("--val-steps", type=int, default=None, help="steps between validations (default: --val-seconds')")
    g.add_argument("--rate-steps", type=int, default=None, help="stop each rate fit after this many steps too")
    g.add_argument("--fit-steps", type=int, default=None, help="the fit's steps (default: what --fit-minutes allow)")
    g.add_argument("--val-rows", type=int, default=64, help="val corpus rows each validation reads")


def smoke(args: argparse.Namespace) -> None:
    """``--smoke``: every stage, tiny."""
    args.kernel_batches, args.cached_batches, args.rate_seconds, args.rate_steps = 2, 4, 60.0, 4
    args.fit_minutes, args.fit_steps, args.val_steps, args.val_rows = 2.0, 20, 10, 8
