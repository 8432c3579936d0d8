"""Read EAGLE-3 drafter dirs' configs as vLLM does, and report the fields its EAGLE-3 drafter is built from.

Runs in the vLLM venv (``export/vllm_venv.sh``) and imports nothing of draftsmith:
``python vllm_config_read.py IN.json OUT.json``. IN: {"dirs": {NAME: DIR}}. OUT: {NAME: {FIELD: VALUE}} with the
fields of ``draftsmith.eval.doctor.engine_reads`` (the layer shape, ``draft_vocab_size``, ``target_hidden_size``, the
norm flags, the aux layer ids, null where the config names none, and how many aux states ``fc`` takes), or
{NAME: {"error": ...}}.

The config is parsed by vLLM's own ``get_config`` (speculators configs through ``SpeculatorsConfig``) and wrapped
in ``EAGLEConfig`` as ``config/speculative.py`` does; the fields are then read off it as
``models/llama_eagle3.py``, ``models/llama.py`` and ``v1/worker/gpu_model_runner.py`` read them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# keep this folder off the path so that ``import vllm`` is vLLM
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

NORMS = ("fc_norm", "norm_before_fc", "norm_output", "norm_before_residual")


def aux_ids(config) -> list[int] | None:
    """``GPUModelRunner._get_eagle3_aux_layers_from_config``'s reading (vLLM 0.32)."""
    layer_ids = getattr(config, "eagle_aux_hidden_state_layer_ids", None)
    if not layer_ids:
        eagle_config = getattr(config, "eagle_config", None)
        if eagle_config and isinstance(eagle_config, dict):
            layer_ids = eagle_config.get("eagle_aux_hidden_state_layer_ids")
    return list(layer_ids) if layer_ids and isinstance(layer_ids, (list, tuple)) else None


def aux_states(config) -> int:
    """The aux states ``models/llama_eagle3.py``'s ``fc`` concatenates (vLLM 0.32's ``LlamaModel.__init__``)."""
    count = getattr(config, "num_aux_hidden_states", None)
    if count is None:
        layer_ids = (getattr(config, "eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids")
        count = len(layer_ids) if layer_ids else 3
    return count


def read(path: str) -> dict:
    from vllm.transformers_utils.config import get_config
    from vllm.transformers_utils.configs.eagle import EAGLEConfig
    from vllm.transformers_utils.configs.speculators import SpeculatorsConfig

    config = get_config(path, trust_remote_code=False)
    if not isinstance(config, (EAGLEConfig, SpeculatorsConfig)):
        config = EAGLEConfig(config, method="eagle3", model_type="eagle")
    hidden, heads = config.hidden_size, config.num_attention_heads
    eagle_config = getattr(config, "eagle_config", None) or {}
    out = {
        "kind": type(config).__name__,
        "hidden_size": hidden,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": heads,
        "head_dim": getattr(config, "head_dim", None) or hidden // heads,
        "num_hidden_layers": config.num_hidden_layers,
        "vocab_size": config.vocab_size,
        "draft_vocab_size": getattr(config, "draft_vocab_size", None) or config.vocab_size,
        "target_hidden_size": getattr(config, "target_hidden_size", hidden),
        **{flag: bool(getattr(config, flag, False)) for flag in NORMS},
        "aux_ids": aux_ids(config),
        "num_aux_hidden_states": aux_states(config),
    }
    out["norm_before_fc"] = bool(eagle_config.get("norm_before_fc", getattr(config, "norm_before_fc", False)))
    return out


def main(src: str, dst: str) -> None:
    spec = json.loads(Path(src).read_text())
    out = {}
    for name, path in spec["dirs"].items():
        try:
            out[name] = read(path)
        except Exception as e:  # noqa: BLE001 - a config vLLM refuses is reported under its name
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    Path(dst).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
