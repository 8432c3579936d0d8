#!/bin/bash
# The peers' trainers for the device machine (benchmarks/peers_gpu.py): speculators 0.9.0, SpecForge 0.2.0 and what
# they need that the device's image lacks (its python3 3.12 has torch, transformers 5.17, pyarrow, xxhash, fsspec,
# huggingface-hub and the rest; not pydantic, datasets, openai, loguru), and jsonargparse for `draftsmith import`, as
# cp312 manylinux wheels, no dependencies resolved (each named at the version the venvs here run). About 7.5 MB.
#
#   bash engines/peers/gpu_wheels.sh [DIR]     # here (default DIR .whl-peers, written to .git/info/exclude)
#   python3 -m pip install -q --no-index --no-deps --target /root/keep/peers DIR/*.whl   # there (peers_gpu.py)
set -euo pipefail
DIR=${1:-.whl-peers}
WHEELS=(
    speculators==0.9.0 hs-connectors==0.9.0 specforge==0.2.0
    pydantic==2.14.4 pydantic_core==2.50.5 pydantic-settings==2.16.3 annotated-types==0.8.0
    typing-inspection==0.4.5 typing_extensions==4.16.0 python-dotenv==1.2.4 loguru==0.7.3
    openai==3.63.0 jiter==0.19.0 sniffio==1.3.1 httpx2==2.17.0 httpcore2==2.17.0 truststore==0.10.5
    datasets==5.1.0 dill==0.4.1 multiprocess==0.70.19
    jsonargparse==4.53.0 docstring_parser==0.18.0 typeshed_client==2.15.0
)
mkdir -p "$DIR"
if [ -d .git/info ] && [[ "$DIR" != /* ]]; then
    grep -qxF "/$DIR/" .git/info/exclude 2>/dev/null || echo "/$DIR/" >> .git/info/exclude
fi
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$DIR" "${WHEELS[@]}"
echo "gpu_wheels: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR"
