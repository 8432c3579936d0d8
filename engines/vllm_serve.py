"""Serve a target in vLLM plainly and with speculative configs; report outputs and acceptance counters.

Runs in the vLLM venv (``export/vllm_venv.sh``) and imports nothing of draftsmith:
``python vllm_serve.py IN.json OUT.json``.
IN: {"target": DIR, "prompts": [[ids]], "max_tokens": N, "runs": [{"name": ..., "speculative_config": {...} | null}]}.
OUT: per run, greedy output ids per prompt and the change of vLLM's spec-decode counters over that generate.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

# this file sits beside draftsmith's ``export/vllm.py``: keep its folder off the path so ``import vllm`` is vLLM
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # metrics and the engine in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB

COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def counters(llm) -> dict[str, float]:
    values = dict.fromkeys(COUNTERS, 0.0)
    for metric in llm.get_metrics():
        if metric.name in values:
            values[metric.name] += float(getattr(metric, "value", 0.0))
    return values


def run(spec: dict, case: dict) -> dict:
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(
        model=spec["target"],
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="float32",
        max_model_len=spec.get("max_model_len", 512),
        speculative_config=case["speculative_config"],
        disable_log_stats=False,
        seed=0,
    )
    loaded = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True, detokenize=False)
    prompts = [{"prompt_token_ids": ids} for ids in spec["prompts"]]
    before = counters(llm)
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    after = counters(llm)
    result = {
        "name": case["name"],
        "outputs": [list(o.outputs[0].token_ids) for o in outputs],
        "counters": {k.removeprefix("vllm:spec_decode_"): after[k] - before[k] for k in COUNTERS},
        "load_seconds": loaded,
        "generate_seconds": seconds,
    }
    del llm
    gc.collect()
    return result


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    import vllm

    results = {"vllm": vllm.__version__, "runs": [run(spec, case) for case in spec["runs"]]}
    Path(sys.argv[2]).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
