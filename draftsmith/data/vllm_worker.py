"""Generate continuations with vLLM for ``draftsmith generate --engine vllm``.

Runs in the vLLM venv (``export/vllm_venv.sh``, or any venv with vLLM for the machine's GPUs) and imports nothing of
draftsmith: ``python vllm_worker.py``. It reads JSON lines on stdin and answers each on stdout with one line that
starts with ``REPLY`` (vLLM may print its own lines there too):
- first the engine: {"target": DIR, "dtype": ..., "max_model_len": N, "max_num_seqs": N, "tensor_parallel_size": N,
  "store_topk": K} and optionally "enforce_eager", "speculative_config" (vLLM's, e.g. {"method": "eagle3", "model":
  DIR, "num_speculative_tokens": 4}) and "log_stats" (vLLM's statistics on: the timings and counters below);
  reply {"vllm": version};
- then requests: {"prompts": [[ids]], "seeds": [int], "max_tokens": [int], "temperature": T, "top_p": P,
  "stop_token_ids": [ids]}; reply {"outputs": [{"tokens": [...], "topk_ids": [[...]], "topk_logprobs": [[...]]}],
  "seconds": wall-clock of the generate} in request order; with "log_stats", each output also has "token_seconds"
  (vLLM's time from its first generated token to its last) and the reply "counters" (vLLM's spec-decode counters
  since the engine started: drafts, draft tokens, accepted tokens). Each row is seeded by its own seed, so outputs
  do not depend on how rows are batched.
Token ids in, token ids out: prompts are tokenized (chat template included) by draftsmith, so both engines see the
same ids. ``topk_*`` are vLLM's raw log-probabilities (before temperature and top-p), as the HF engine stores them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# this file sits in draftsmith's package: keep its folder off the path so ``import vllm`` is vLLM
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")  # GiB, CPU builds only
# vLLM's CPU build keeps one core for its scheduler process, which halves the compute of a 2-core machine (measured
# on SmolLM2: 105 -> 195 tokens/s with none kept); on small machines keep none
if (os.cpu_count() or 1) <= 4:
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")

REPLY = "REPLY "
COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def reply(obj: dict) -> None:
    sys.stdout.write(REPLY + json.dumps(obj) + "\n")
    sys.stdout.flush()


def topk(logprobs: dict | None, k: int) -> tuple[list[int], list[float]]:
    """The ``k`` most likely tokens of one position, by rank (vLLM adds the sampled token when it is not among them)."""
    if not logprobs or not k:
        return [], []
    best = sorted(((lp.rank, tok, lp.logprob) for tok, lp in logprobs.items() if lp.rank <= k))[:k]
    return [tok for _, tok, _ in best], [lp for _, _, lp in best]


def counters(llm) -> dict[str, float]:
    """vLLM's spec-decode counters (all 0 without speculation), summed over their labels."""
    values = dict.fromkeys(COUNTERS, 0.0)
    for metric in llm.get_metrics():
        if metric.name in values:
            values[metric.name] += float(getattr(metric, "value", 0.0))
    return {name.removeprefix("vllm:spec_decode_"): value for name, value in values.items()}


def token_seconds(output) -> float | None:
    """Seconds from a row's first generated token to its last, by vLLM's own clock (None without its statistics)."""
    stats = getattr(output, "metrics", None)
    if stats is None or not getattr(stats, "last_token_ts", 0.0):
        return None
    return stats.last_token_ts - stats.first_token_ts


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm import __version__ as version
    from vllm.platforms import current_platform

    engine = json.loads(sys.stdin.readline())
    log_stats = engine.get("log_stats", False)
    # vLLM's CPU build fails on seeded requests whose prefill is split into chunks (its CPU random generators
    # cannot rewind a discarded sample): on CPU, prefill every prompt whole
    whole_prefill = (
        {"enable_chunked_prefill": False, "max_num_batched_tokens": max(engine["max_model_len"], 2048)}
        if current_platform.is_cpu()
        else {}
    )
    llm = LLM(
        model=engine["target"],
        dtype=engine["dtype"],
        max_model_len=engine["max_model_len"],
        max_num_seqs=engine["max_num_seqs"],
        tensor_parallel_size=engine["tensor_parallel_size"],
        skip_tokenizer_init=True,
        seed=0,
        max_logprobs=max(engine["store_topk"], 1),
        enforce_eager=engine.get("enforce_eager", False),
        speculative_config=engine.get("speculative_config"),
        disable_log_stats=not log_stats,
        **whole_prefill,
    )
    k = engine["store_topk"]
    reply({"vllm": version})
    for line in sys.stdin:
        request = json.loads(line)
        params = [
            SamplingParams(
                temperature=request["temperature"],
                top_p=request["top_p"] if request["temperature"] > 0 else 1.0,
                max_tokens=max_tokens,
                seed=seed,
                stop_token_ids=request["stop_token_ids"],
                logprobs=k or None,
                detokenize=False,
            )
            for seed, max_tokens in zip(request["seeds"], request["max_tokens"], strict=True)
        ]
        prompts = [{"prompt_token_ids": ids} for ids in request["prompts"]]
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        rows = []
        for out in outputs:
            completion = out.outputs[0]
            pairs = [topk(lp, k) for lp in (completion.logprobs or [])]
            rows.append(
                {
                    "tokens": list(completion.token_ids),
                    "topk_ids": [ids for ids, _ in pairs],
                    "topk_logprobs": [lps for _, lps in pairs],
                }
                | ({"token_seconds": token_seconds(out)} if log_stats else {})
            )
        reply({"outputs": rows, "seconds": seconds} | ({"counters": counters(llm)} if log_stats else {}))


if __name__ == "__main__":
    main()
