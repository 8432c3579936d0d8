"""What this machine computes natively: its CPU model and flags, and whether bfloat16 is native here. Every score
report and benchmark records it, since a bf16 target is only fast where the hardware multiplies bf16. And where a fit
and the stages around it run: ``choose_device`` (a CUDA GPU when there is one, every local GPU for a fit, bf16-mixed
where the GPU has bf16; the CPU in float32), the one decision every entry point takes (``resolve_trainer``)."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""x86 CPU flags of native bfloat16 matrix arithmetic (AVX-512 BF16 dot products, AMX tiles)."""
SIMD_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "avx_vnni", "fma")
"""The flags a report records (the full list is long and says little more about matmul speed)."""


@cache
def cpu_info() -> dict:
    """The CPU model and its SIMD flags (``/proc/cpuinfo``; elsewhere ``platform.processor()`` and no flags)."""
    model, flags = platform.processor() or platform.machine(), set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags = set(value.split())
    return {"model": model, "flags": [f for f in SIMD_FLAGS if f in flags]}


def native_bf16(device: str = "cpu") -> tuple[bool, str]:
    """(whether ``device`` multiplies bfloat16 natively, the reason in words)."""
    if device.startswith("cuda"):
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, "the GPU supports bf16" if ok else "the GPU does not support bf16"
    info = cpu_info()
    found = [f for f in BF16_FLAGS if f in info["flags"]]
    if found:
        return True, f"the CPU ({info['model']}) has {', '.join(found)}"
    return False, f"the CPU ({info['model']}) has no native bf16 ({' or '.join(BF16_FLAGS)})"


def machine_record() -> dict:
    """What a report records of the machine: platform, torch, threads, CPU model and flags, native bf16."""
    bf16, why = native_bf16()
    return {
        "platform": platform.platform(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu_info()["model"],
        "cpu_flags": cpu_info()["flags"],
        "native_bf16": bf16,
        "native_bf16_reason": why,
    }


def training_attention(device: torch.device | str) -> None:
    """Before training on a CUDA device, turn PyTorch's cuDNN attention kernel off: since torch 2.11 its backward
    returns NaN gradients for some masked shapes on H100 / H200 (pytorch/pytorch#196678: an ``attn_mask`` and a
    sequence of 64 past a multiple of 128, among others), and every drafter here passes an attention mask. Flash and
    memory-efficient attention take over (at the same speed in a report of that bug; not measured here). Elsewhere,
    nothing."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


CPU_PRECISION = "32-true"
"""A CPU fit's precision: float32 weights and arithmetic, what every shipped recipe said before the device chose it
(bf16 autocast is slower than float32 on a CPU without AMX, and the CPU results in ``benchmarks/results`` are
float32 fits)."""
AUTO = ("auto", None)
"""A trainer value the device decides: ``auto`` (accelerator, devices) or left unset (``precision: null``)."""


@dataclass(frozen=True)
class Device:
    """Where a fit and the stages around it compute, and the fit's precision (``choose_device``)."""

    accelerator: str
    """Lightning's accelerator: ``cpu`` or ``gpu`` (CUDA)."""
    devices: int
    """Devices a fit uses: 1 on a CPU, every local GPU on a GPU machine (DDP when more than one)."""
    precision: str
    """Lightning's precision of a fit: ``32-true`` on a CPU, ``bf16-mixed`` (bf16 autocast over float32 master
    weights) on a GPU with bf16, else ``16-mixed`` (float16 autocast, a loss scaler, float32 master weights)."""
    why: str
    """The reason in words."""
    name: str = "CPU"
    """The device's name (the GPU's model)."""

    @property
    def torch(self) -> str:
        """The torch device of the stages that run on one device: targets, generation, features, the verifier."""
        return "cuda" if self.accelerator == "gpu" else "cpu"

    def trainer(self) -> dict:
        """The ``trainer`` values of a fit on this device."""
        return {"accelerator": self.accelerator, "devices": self.devices, "precision": self.precision}

    def describe(self) -> str:
        """One line: ``cuda × 2 (NVIDIA H100 80GB HBM3), fits in bf16-mixed: the GPU supports bf16``."""
        where = f"cuda × {self.devices} ({self.name})" if self.accelerator == "gpu" else f"cpu ({self.name})"
        return f"{where}, fits in {self.precision}: {self.why}"


def choose_device(gpus: int, bf16: bool, name: str = "GPU", cpu: str = "CPU") -> Device:
    """The device of a fit given the machine's facts: ``gpus`` local CUDA GPUs (0: none, or the CPU forced) and
    whether they compute in bf16. A pure function: the facts are its arguments (``local_device`` reads them)."""
    if gpus < 1:
        return Device("cpu", 1, CPU_PRECISION, "no CUDA GPU: float32, the CPU's choice", cpu)
    if bf16:
        return Device("gpu", gpus, "bf16-mixed", "the GPU supports bf16 (autocast, float32 master weights)", name)
    return Device("gpu", gpus, "16-mixed", "the GPU has no bf16 (float16 autocast with a loss scaler)", name)


def gpu_facts() -> tuple[int, bool, str]:
    """This machine's (CUDA GPUs, whether they support bf16, the first one's name)."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        return 0, False, ""
    return torch.cuda.device_count(), torch.cuda.is_bf16_supported(), torch.cuda.get_device_name(0)


DEVICES = ("auto", "cpu", "cuda")
"""``--device`` values: ``auto`` (a CUDA GPU when there is one), ``cpu`` (forced), ``cuda`` (refused without one)."""


def local_device(device: str = "auto") -> Device:
    """``choose_device`` on this machine's facts; ``device`` ``cpu`` forces the CPU, ``cuda`` refuses a machine
    without a CUDA GPU in one line."""
    if device not in DEVICES:
        raise DraftsmithError(f"--device {device!r}: expected one of {', '.join(DEVICES)}")
    gpus, bf16, name = gpu_facts() if device != "cpu" else (0, False, "")
    if device == "cuda" and gpus < 1:
        raise DraftsmithError("--device cuda: this machine has no CUDA GPU torch can use (--device cpu or auto)")
    return choose_device(gpus, bf16, name, cpu_info()["model"])


def resolve_trainer(trainer: dict) -> dict:
    """``trainer`` with the values the device decides filled in: ``accelerator: auto`` (a CUDA GPU when there is
    one, else the CPU), ``devices: auto`` (1 on a CPU, every local GPU), ``precision`` unset (``choose_device``'s).
    A value given is kept (``accelerator: cpu`` makes the rest the CPU's); on a CPU the result is what every
    recipe said before: ``cpu``, 1, ``32-true``."""
    accelerator = trainer.get("accelerator")
    if accelerator in AUTO:
        device = local_device()
    elif accelerator in ("gpu", "cuda"):
        gpus, bf16, name = gpu_facts()
        device = choose_device(max(gpus, 1), bf16, name)  # no GPU: Lightning refuses the accelerator itself
    else:
        device = choose_device(0, False)
    out = dict(trainer)
    if accelerator in AUTO:
        out["accelerator"] = device.accelerator
    if trainer.get("devices") in AUTO:
        out["devices"] = device.devices
    if trainer.get("precision") in AUTO:
        out["precision"] = device.precision
    return out
