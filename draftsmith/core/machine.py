"""What this machine computes natively: its CPU model and flags, and whether bfloat16 is native here. Every score
report and benchmark records it, since a bf16 target is only fast where the hardware multiplies bf16."""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path

import torch

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
