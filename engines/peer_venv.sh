#!/usr/bin/env bash
# Build the venv a peer's own code runs in, to load draftsmith's exports with it (tests/test_peers.py).
# Usage: engines/peer_venv.sh PEER [VENV]   PEER: speculators | specforge (default VENV .venv-PEER; gitignored).
# Idempotent: a finished venv is kept. Own venvs because the peers pin other transformers than draftsmith's:
# - speculators 0.9.0 (Apache-2.0): transformers<=5.19, datasets<=5.1. Installed --no-deps because it declares
#   torchvision and torchaudio, whose resolution replaces the CPU torch with a CUDA torch 2.11 (GBs of nvidia-*
#   wheels); its other declared dependencies are installed, with torch held at the CPU build.
# - specforge 0.2.0 (Apache-2.0): pins torch 2.11, transformers 5.8.1 and sglang 0.5.14 (a CUDA serving stack).
#   Installed --no-deps with transformers 5.8.1 and the few packages its draft model classes import; sglang,
#   yunchang, flash-attn and its other training/serving dependencies are not installed (its model classes run
#   without them on CPU with the sdpa backend). torch stays at draftsmith's 2.13.0 CPU build instead of its 2.11.
set -euo pipefail
PEER="${1:?usage: peer_venv.sh speculators|specforge [VENV]}"
VENV="${2:-.venv-$PEER}"
PY="${PY:-python3}"
if [ -f "$VENV/.draftsmith-ready" ]; then
    echo "$VENV ready"
    exit 0
fi
$PY -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q torch==2.13.0  # the CPU build (pip's find-links / the project's torch pin)
echo "torch==2.13.0" > "$VENV/constraints.txt"
case "$PEER" in
speculators)
    "$VENV/bin/pip" install -q --no-deps speculators==0.9.0 hs-connectors==0.9.0
    "$VENV/bin/pip" install -q -c "$VENV/constraints.txt" "transformers>=5,<=5.19" "datasets>=4,<=5.1.0" \
        "loguru>=0.7.2,<=0.7.3" "numpy>=2,<=2.5.4" pydantic pydantic-settings rich safetensors "tqdm<=4.70.1" \
        typer click psutil protobuf httpx aiohttp huggingface-hub "openai>=2"
    "$VENV/bin/python" -c "import importlib.metadata as m, speculators.models.eagle3; print('speculators', m.version('speculators'))"
    ;;
specforge)
    "$VENV/bin/pip" install -q --no-deps specforge==0.2.0
    "$VENV/bin/pip" install -q -c "$VENV/constraints.txt" transformers==5.8.1 datasets accelerate safetensors \
        pydantic pyyaml psutil tqdm huggingface-hub numpy
    "$VENV/bin/python" -c "import specforge.modeling.draft.llama3_eagle; print('specforge ok')"
    ;;
*)
    echo "peer_venv.sh: unknown peer '$PEER' (speculators or specforge)" >&2
    exit 2
    ;;
esac
touch "$VENV/.draftsmith-ready"
