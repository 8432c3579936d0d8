"""``draftsmith generate``: on-policy training data, the target's own continuations of prompts.

Drafters accept more when trained on what the target itself says (Medusa's
self-distillation, DistillSpec, FastDraft). This stage samples continuations
from the target and writes them as a ``datasets`` Arrow directory with
``draftsmith.json`` beside it (see ``shards.py`` for the layout), seeded per
row so the data depends neither on the batch size nor on interruptions.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.core.manifest import git_sha, versions, write_manifest
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data import shards
from draftsmith.data.datastore import build_datastore
from draftsmith.data.decode import Decoded, row_seed
from draftsmith.data.engines import HFEngine, Request, VLLMEngine, check_engine, vllm_python
from draftsmith.data.prompts import continuable, encode, load_prompts
from draftsmith.data.shards import check_dataset_target, load_generated
from draftsmith.errors import DraftsmithError
from draftsmith.targets import ResolvedTarget, load_target

__all__ = ["GenerateRun", "GenerateSettings", "check_dataset_target", "generate", "generate_data", "load_generated"]

FORMAT = "draftsmith.generate/1"
"""Version tag of the out dir's layout and ``draftsmith.json``."""


@dataclass(frozen=True)
class GenerateSettings:
    """Everything that decides a generated dataset's content; ``--resume`` must match it exactly."""

    prompts: str
    """Prompt source: ``builtin:train``, a JSONL file or a local dataset."""
    prompt_field: str
    """The prompt's field name in JSONL records and datasets."""
    num_prompts: int | None
    """Only the first N prompts (None: all)."""
    chat_template: bool
    """Render chat ``messages`` with the tokenizer's chat template (when it has one)."""
    temperature: float
    """Sampling temperature; 0 is greedy."""
    top_p: float
    """Nucleus mass kept after temperature."""
    max_new_tokens: int
    """Generation budget per sample."""
    samples_per_prompt: int
    """Independent samples drawn per prompt."""
    seed: int
    """Base seed; each row's stream is seeded from (seed, prompt index, sample index)."""
    shard_size: int
    """Prompts per shard."""
    store_topk: int
    """Target top-k log-probabilities stored per generated token (0: none)."""
    dtype: str
    """The dtype the target computes in (resolved: never ``auto``)."""
    greedy_share: float = 0.0
    """Share of the prompts decoded greedily instead of sampled (spread evenly over the prompt order: prompt ``i`` is
    greedy when ``floor((i + 1) * share) > floor(i * share)``), so the data holds the target's greedy text, the text
    greedy verification walks, beside its samples."""
    engine: str = "hf"
    """What decodes: ``hf`` (transformers, in this process) or ``vllm`` (vLLM in its own venv). Greedy data agrees
    between them up to floating-point ties; sampled data follows each engine's own random streams."""


def _validate(s: GenerateSettings, batch_size: int) -> Sampling:
    positive = {
        "max_new_tokens": s.max_new_tokens,
        "samples_per_prompt": s.samples_per_prompt,
        "batch_size": batch_size,
        "shard_size": s.shard_size,
    }
    for name, value in positive.items():
        if value <= 0:
            raise DraftsmithError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if s.num_prompts is not None and s.num_prompts <= 0:
        raise DraftsmithError(f"--num-prompts must be a positive integer (or omitted for all), got {s.num_prompts}")
    if s.store_topk < 0:
        raise DraftsmithError(f"--store-topk must be >= 0, got {s.store_topk}")
    if not 0.0 <= s.greedy_share <= 1.0:
        raise DraftsmithError(f"--greedy-share must be in [0, 1], got {s.greedy_share}")
    check_engine(s.engine)
    try:
        return Sampling(s.temperature, s.top_p)
    except ValueError as e:
        raise DraftsmithError(f"sampling: {e}") from None


@dataclass(frozen=True)
class GenerateRun:
    """How a generation runs; none of it changes the data."""

    batch_size: int = 16
    """Sequences decoded together."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu``, ``cuda``, ``cuda:1``, ..."""
    resume: bool = False
    """Continue an interrupted run in ``out`` from its completed shards."""
    overwrite: bool = False
    """Delete an earlier run in ``out`` first."""
    rank: int = 0
    """This process's index among ``world_size``."""
    world_size: int = 1
    """With N > 1, this process generates only shards ``s`` with ``s % N == rank``, into ``out/ranks/rank-<R>``."""
    vllm_python: str | None = None
    """``--engine vllm``: the python of a venv with vLLM (default ``$DRAFTSMITH_VLLM_PYTHON``, then
    ``.venv-vllm/bin/python``)."""
    tensor_parallel_size: int = 1
    """``--engine vllm``: GPUs each model is split over."""
    vllm_eager: bool = False
    """``--engine vllm``: no graph compilation (vLLM's ``enforce_eager``): a faster start, slower decoding."""
    datastore: bool = False
    """Also index the finished corpus for retrieval drafting (RASD): ``OUT.datastore`` beside it
    (``data.datastore``)."""


def is_greedy(prompt_index: int, share: float) -> bool:
    """Whether prompt ``prompt_index`` is decoded greedily under ``--greedy-share share`` (evenly spread)."""
    return int((prompt_index + 1) * share) > int(prompt_index * share)


def _shard_columns(rows: list[tuple[int, int]], encoded: list[list[int]], results: dict, topk: int) -> dict:
    """Columns of one shard, rows in (prompt index, sample index) order."""
    cols: dict[str, list] = {k: [] for k in ("input_ids", "loss_mask", "prompt_len", "prompt_index", "sample_index")}
    if topk:
        cols.update(topk_ids=[], topk_logprobs=[])
    for i, j in rows:
        prompt, gen = encoded[i], results[i, j]
        cols["input_ids"].append(prompt + gen.tokens)
        cols["loss_mask"].append([0] * len(prompt) + [1] * len(gen.tokens))
        cols["prompt_len"].append(len(prompt))
        cols["prompt_index"].append(i)
        cols["sample_index"].append(j)
        if topk:
            cols["topk_ids"].append(gen.topk_ids)
            cols["topk_logprobs"].append(gen.topk_logprobs)
    return cols


def generate(
    target: ResolvedTarget,
    prompts: str = "builtin:train",
    out: Path = Path("runs/data"),
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 128,
    samples_per_prompt: int = 1,
    seed: int = 0,
    chat_template: bool = True,
    batch_size: int = 16,
    shard_size: int = 256,
    store_topk: int = 0,
    num_prompts: int | None = None,
    prompt_field: str = "prompt",
    greedy_share: float = 0.0,
    resume: bool = False,
    overwrite: bool = False,
    device: str = "auto",
    rank: int = 0,
    world_size: int = 1,
    engine: str = "hf",
    vllm_python: str | None = None,
    tensor_parallel_size: int = 1,
    vllm_eager: bool = False,
    datastore: bool = False,
) -> Path:
    """Sample the target's continuations of prompts into a dataset for training drafters.

    Writes a ``datasets`` Arrow directory at ``out`` (``datasets.load_from_disk(out)``
    or ``load_generated(out)`` read it) with columns ``input_ids`` (prompt +
    generated), ``loss_mask`` (1 on generated tokens, EOS included), ``prompt_len``,
    ``prompt_index``, ``sample_index`` and, with ``store_topk`` K > 0, ``topk_ids``
    / ``topk_logprobs``: per generated token, the K most likely tokens under the
    target's untempered distribution (log-softmax of its logits, before
    temperature and top-p) at that position. ``out/draftsmith.json`` records the
    target fingerprint, settings, counts and timing.

    Args:
        target: ``default``, ``smollm2`` or a local Hugging Face model directory, optionally ``:DTYPE`` (from Python
            a ``targets.ResolvedTarget``: ``draftsmith.cli`` resolves it once, with ``--dtype``).
        prompts: ``builtin:train`` / ``builtin:heldout`` (the default target's prompts), a JSONL file
            (``{"prompt": ...}`` or chat ``{"messages": [...]}`` per line) or a local dataset dir / data file.
        out: output directory (must be empty unless --resume or --overwrite).
        temperature: sampling temperature; 0 for greedy decoding.
        top_p: nucleus mass kept after temperature (1 keeps all).
        max_new_tokens: tokens generated per sample at most (fewer at EOS or the target's context limit).
        samples_per_prompt: independent samples per prompt.
        seed: base seed; each sample's randomness is seeded from (seed, prompt index, sample index).
        chat_template: render chat ``messages`` with the tokenizer's chat template when it has one.
        batch_size: sequences decoded together (does not change the output).
        shard_size: prompts per shard, the unit of saving and of ``--resume``.
        store_topk: also store the target's top-K log-probabilities per generated token (0: off).
        num_prompts: use only the first N prompts (default: all).
        prompt_field: the prompt's field name in JSONL / dataset sources.
        greedy_share: share of the prompts decoded greedily (temperature 0) instead of sampled, spread evenly.
        resume: continue an interrupted run in ``out`` from its completed shards.
        overwrite: delete an earlier ``generate`` run in ``out`` first.
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda``, ``cuda:1``, ...
        rank: this process's index among ``world_size`` (``$SLURM_PROCID`` in ``pipeline/slurm/templates/generate.sbatch``).
        world_size: with N > 1, this process generates only shards ``s`` with ``s % N == rank``, into
            ``out/ranks/rank-<R>``; the same command without rank/world size and with ``--resume`` then
            merges them (the data is the same as one process would write: rows are seeded per prompt).
        engine: ``hf`` (transformers ``generate``-style batched decoding in this process) or ``vllm`` (vLLM in its
            own venv, continuous batching; ``--batch-size`` is its ``max_num_seqs``). Same dataset format; the
            engine and its version are recorded in ``draftsmith.json``.
        vllm_python: ``--engine vllm``: the python of a venv with vLLM (default ``$DRAFTSMITH_VLLM_PYTHON``, then
            ``.venv-vllm/bin/python``, which ``bash draftsmith/export/vllm_venv.sh`` builds).
        tensor_parallel_size: ``--engine vllm``: GPUs each model is split over (data parallelism is ``--rank`` /
            ``--world-size``, as for ``hf``).
        vllm_eager: ``--engine vllm``: skip vLLM's graph compilation (``enforce_eager``): a faster start, slower
            decoding; for short runs (the tests use it).
        datastore: also build the corpus's retrieval datastore (``draftsmith datastore``) once it is complete:
            ``OUT.datastore`` beside it, with the target's fingerprint; its size and build time are printed.

    Returns:
        ``out`` (the rank's directory when ``world_size`` > 1).
    """
    load_prompts(
        str(prompts), prompt_field, num_prompts
    )  # the cheap input first: a built-in target may build for minutes
    settings = GenerateSettings(
        prompts=str(prompts),
        prompt_field=prompt_field,
        num_prompts=num_prompts,
        chat_template=chat_template,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        samples_per_prompt=samples_per_prompt,
        seed=seed,
        shard_size=shard_size,
        store_topk=store_topk,
        greedy_share=greedy_share,
        dtype=target.dtype,
        engine=engine,
    )
    run = GenerateRun(
        batch_size, device, resume, overwrite, rank, world_size, vllm_python, tensor_parallel_size, vllm_eager,
        datastore,
    )  # fmt: skip
    return generate_data(target, Path(out), settings, run)


def generate_data(
    target: ResolvedTarget, out: Path, settings: GenerateSettings, run: GenerateRun = GenerateRun()
) -> Path:
    """``generate`` with typed settings: the target's continuations of ``settings.prompts`` into ``out``
    (``settings.dtype``: the target's)."""
    if settings.dtype != target.dtype:
        raise DraftsmithError(f"generate: settings.dtype {settings.dtype} is not the target's {target.dtype}")
    sampling = _validate(settings, run.batch_size)
    if run.tensor_parallel_size < 1:
        raise DraftsmithError(f"--tensor-parallel-size must be a positive integer, got {run.tensor_parallel_size}")
    if not 0 <= run.rank < run.world_size:
        raise DraftsmithError(
            f"--rank must be in [0, --world-size), got rank {run.rank} of world size {run.world_size}"
        )
    if run.world_size > 1:
        out = out / shards.RANKS / f"rank-{run.rank:05d}"
    elif run.resume:
        shards.merge_ranks(out)
    previous = shards.prepare_out(out, run.resume, run.overwrite)
    loaded = load_prompts(settings.prompts, settings.prompt_field, settings.num_prompts)
    python = None
    if settings.engine == "vllm":  # vLLM loads the weights in its own process
        python = vllm_python(run.vllm_python)  # missing: say so before any work
        t = Target.from_config(target.path, dtype=target.dtype)
    else:
        device = run.device if run.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
        # the fastest kernels: data needs no batch invariance (only decoding compared with plain decoding does)
        t = load_target(target, device=device, batch_invariant=False)
    if settings.store_topk > t.vocab_size:
        raise DraftsmithError(f"--store-topk {settings.store_topk} exceeds the target's vocabulary size {t.vocab_size}")
    encoded = [encode(p, t.tokenizer, settings.chat_template) for p in loaded]
    context = getattr(t.config, "max_position_embeddings", None)
    usable = continuable(encoded, context, settings.prompts)  # score's check too
    keep, too_long, empty = usable.keep, usable.too_long, usable.empty
    metadata = {
        "format": FORMAT,
        "status": "running",
        "target": t.fingerprint,
        "settings": asdict(settings),
        "prompts_sha": hashlib.sha256(json.dumps(encoded).encode()).hexdigest()[:16],
        "context": context,
        "seeds": "row i, sample j: data.decode.row_seed(settings.seed, i, j), one random stream per row",
        "command": shlex.join(sys.argv),
        "versions": versions() | {"git": git_sha()},
    }
    if previous is not None:
        shards.check_resumable(previous, metadata, out)
        if previous.get("status") == "complete":
            shards.remove_shards(out)
            print(f"{out} is already complete ({previous['rows']} rows); nothing to do")
            return _with_datastore(out, run)
    shards.write_metadata(out, metadata)
    num_shards = -(-len(encoded) // settings.shard_size)
    per_shard = [
        [i for i in keep if s * settings.shard_size <= i < (s + 1) * settings.shard_size] for s in range(num_shards)
    ]
    metadata["engine"] = (previous or {}).get("engine") or {"name": settings.engine, "version": None}
    mine = [s for s in range(num_shards) if s % run.world_size == run.rank]
    if set(mine) - shards.completed_shards(out):  # start an engine only for work left (not for a merge)
        engine = _engine(settings, run, target, t, context, out, python)
        try:
            metadata["engine"] = {"name": engine.name, "version": engine.version}
            shards.write_metadata(out, metadata)
            _generate_shards(t, engine, out, encoded, per_shard, settings, sampling, run, context)
        except KeyboardInterrupt:
            engine.close(wait=0)  # the shards are saved: do not wait for the engine's current request
            raise
        finally:
            engine.close()
    if run.world_size > 1:
        print(
            f"rank {run.rank} of {run.world_size}: shards saved in {out}; merge them with the same command and --resume"
        )
        return out
    shards.finalize(out, num_shards)
    metadata.update(
        status="complete",
        prompts_loaded=len(encoded),
        prompts_used=len(keep),
        skipped_too_long=len(too_long),
        skipped_empty=len(empty),
        **shards.totals(out, num_shards),
        shards=num_shards,
        columns=list(shards.features(settings.store_topk)),
    )
    shards.write_metadata(out, metadata)
    shards.remove_shards(out)
    write_manifest(out, target=t.fingerprint, seed=settings.seed)
    print(_summary(metadata, out))
    return _with_datastore(out, run)


def _with_datastore(out: Path, run: GenerateRun) -> Path:
    """``out``, its datastore built beside it first when ``run`` asks (``--datastore``)."""
    if run.datastore:
        build_datastore(out)
    return out


def _engine(
    settings: GenerateSettings,
    run: GenerateRun,
    target: ResolvedTarget,
    t: Target,
    context,
    out: Path,
    python: Path | None,
):
    if python is not None:  # --engine vllm
        return VLLMEngine(
            target.path, python, settings.dtype, context or 4096, run.batch_size,
            run.tensor_parallel_size, settings.store_topk, out / "vllm.log", run.vllm_eager,
        )  # fmt: skip
    return HFEngine(t, run.batch_size)


def _generate_shards(
    t, engine: HFEngine | VLLMEngine, out: Path, encoded, per_shard, settings: GenerateSettings, sampling, run, context
) -> None:
    """Generate and save this rank's missing shards, with a progress bar; an interruption keeps the saved ones."""
    done = shards.completed_shards(out)
    mine = [s for s in range(len(per_shard)) if s % run.world_size == run.rank]
    n = settings.samples_per_prompt
    bar = tqdm(
        total=sum(len(per_shard[s]) for s in mine) * n,
        initial=sum(len(per_shard[s]) for s in done) * n,
        desc="generate",
        unit="seq",
        dynamic_ncols=True,
    )
    session_tokens, session_start = 0, time.perf_counter()

    def progress(decoded: list[Decoded]) -> None:
        nonlocal session_tokens
        session_tokens += sum(len(d.tokens) for d in decoded)
        bar.update(len(decoded))
        bar.set_postfix_str(f"{session_tokens / (time.perf_counter() - session_start):.0f} tok/s")

    try:
        for s in mine:
            if s in done:
                continue
            start = time.perf_counter()
            rows = [(i, j) for i in per_shard[s] for j in range(n)]
            # longest prompts first: less padding per batch, and memory peaks show up at once
            order = sorted(rows, key=lambda r: (-len(encoded[r[0]]), r))

            results = {}
            greedy = [r for r in order if is_greedy(r[0], settings.greedy_share)]
            sampled = [r for r in order if not is_greedy(r[0], settings.greedy_share)]
            for part, how in ((greedy, Sampling(0.0)), (sampled, sampling)):
                if not part:
                    continue
                request = Request(
                    [encoded[i] for i, _ in part],
                    [row_seed(settings.seed, i, j) for i, j in part],
                    how,
                    settings.max_new_tokens,
                    t.eos_token_ids,
                    context,
                    settings.store_topk,
                )
                results.update(zip(part, engine.decode(request, progress), strict=True))
            stats = {
                "rows": len(rows),
                "prompt_tokens": sum(len(encoded[i]) for i, _ in rows),
                "generated_tokens": sum(len(r.tokens) for r in results.values()),
                "stopped_at_eos": sum(bool(r.tokens) and r.tokens[-1] in t.eos_token_ids for r in results.values()),
                "seconds": time.perf_counter() - start,
            }
            columns = _shard_columns(rows, encoded, results, settings.store_topk)
            shards.write_shard(out, s, columns, stats, settings.store_topk)
    except KeyboardInterrupt:
        bar.close()
        saved = len(shards.completed_shards(out))
        print(
            f"\ninterrupted: {saved} of {len(per_shard)} shards are saved in {out}; continue with the same "
            "command and --resume",
            file=sys.stderr,
        )
        raise
    bar.close()


def _summary(m: dict, out: Path) -> str:
    skipped = (
        f"skipped {m['skipped_too_long']} prompts that reach the target's {m['context']}-token context"
        f" and {m['skipped_empty']} empty ones"
    )
    return (
        f"generated {m['rows']} sequences ({m['prompts_used']} prompts x {m['settings']['samples_per_prompt']} "
        f"samples) with {m['generated_tokens']} new tokens ({m['stopped_at_eos']} ended at EOS) in "
        f"{m['seconds']:.1f} s of generation ({m['tokens_per_s']:.0f} tokens/s); {skipped}. "
        f"Wrote {out} (datasets.load_from_disk) and {out / shards.META}."
    )
