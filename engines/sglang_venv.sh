#!/usr/bin/env bash
# Build the venv SGLang's own EAGLE-3 config reading runs in (engines/sglang_config_read.py,
# tests/test_doctor_engines_sglang.py). Usage: engines/sglang_venv.sh [VENV]   (default .venv-sglang; gitignored).
# Idempotent: a finished venv is kept. ~1.5 GB (torch 0.8 of it), about a minute with pip's cache warm.
# sglang 0.5.23 (Apache-2.0) pins torch 2.14.1, transformers 5.19.0 and a CUDA serving stack (flashinfer, sglang-kernel,
# triton, cutlass, ...): installed --no-deps, with transformers 5.19.0 and only the packages that the modules its
# config parsing and its EAGLE-3 / Llama model classes import at load need (pinned as resolved on 2026-12). torch stays
# at draftsmith's 2.13.0 CPU build; triton, sgl_kernel and torchvision are not installed (the reader stubs them).
set -euo pipefail
VENV="${1:-.venv-sglang}"
PY="${PY:-python3}"
if [ -f "$VENV/.draftsmith-ready" ]; then
    echo "$VENV ready"
    exit 0
fi
$PY -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q torch==2.13.0  # the CPU build (pip's find-links / the project's torch pin)
echo "torch==2.13.0" > "$VENV/constraints.txt"
"$VENV/bin/pip" install -q --no-deps sglang==0.5.23
"$VENV/bin/pip" install -q -c "$VENV/constraints.txt" transformers==5.19.0 compressed-tensors==0.18.0 \
    apache-tvm-ffi==0.1.11 sentencepiece==0.2.1 openai==2.8.0 orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 \
    requests==2.34.2 pillow==13.0.0 starlette==1.10.0 msgspec==0.23.0 pyzmq==27.3.0 ipython==9.19.1 \
    aiohttp==3.14.5 dill==0.4.1 gguf==0.19.0 partial_json_parser einops
"$VENV/bin/python" -c "import importlib.metadata as m; print('sglang', m.version('sglang'))"
touch "$VENV/.draftsmith-ready"
