"""What the families' export hooks share (``families/<family>/export.py``, which the formats in ``draftsmith/export/``
ask for their blocks): the drafter being exported and its target, dtypes, writing a safetensors + ``config.json``
dir, a drafter's decoder layer as a Llama config, how an engine's config numbers the target layers a drafter reads,
and the ``speculators_config`` block every speculators-format drafter carries. It sits below the families so that
their hooks never import ``draftsmith.export``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from draftsmith.core.dtypes import DTYPES, canonical_dtype
from draftsmith.errors import DraftsmithError

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
SPECULATORS_VERSION = "0.3.0"
"""The speculators release whose config classes the speculators layout follows (and that validates it in tests)."""


@dataclass
class Source:
    """A trained drafter to export, and the target it drafts for.

    Attributes:
        network: the drafter network (``families/<family>/network.py``).
        info: its ``native.describe()`` record: method, config, target fingerprint, version.
        path: the checkpoint or native dir it came from.
        target_dir: the target's model directory, when known.
    """

    network: torch.nn.Module
    info: dict
    path: Path
    target_dir: Path | None

    @property
    def method(self) -> str:
        return self.info["method"]

    def target_config(self, fmt: str) -> dict:
        """The target's ``config.json``; engine formats need it (layer count, architecture, name)."""
        if self.target_dir is None:
            raise DraftsmithError(
                f"--to {fmt} needs the target's model directory: {self.info['target'].get('name')!r} "
                "(recorded in the drafter) does not exist here; pass --target DIR"
            )
        config = json.loads((self.target_dir / "config.json").read_text())
        if "num_hidden_layers" not in config:  # e.g. GPT-2's n_layer / n_embd: the canonical names, as HF maps them
            from transformers import AutoConfig

            loaded = AutoConfig.from_pretrained(self.target_dir)
            for name in ("num_hidden_layers", "hidden_size", "vocab_size"):
                config.setdefault(name, getattr(loaded, name))
        return config


def cast(tensors: dict[str, torch.Tensor], dtype: str | None) -> dict[str, torch.Tensor]:
    """Floating-point tensors to ``dtype`` (None keeps them); integer/bool maps (d2t, t2d) stay exact."""
    dtype = canonical_dtype(dtype) if dtype is not None else None
    out = {}
    for name, t in tensors.items():
        t = t.detach().cpu()
        if dtype is not None and t.is_floating_point():
            t = t.to(DTYPES[dtype])
        out[name] = t.contiguous()
    return out


def dtype_name(tensors: dict[str, torch.Tensor]) -> str:
    """The HF ``torch_dtype`` string of the floating tensors."""
    kinds = {t.dtype for t in tensors.values() if t.is_floating_point()}
    return DTYPE_NAMES[kinds.pop()] if len(kinds) == 1 else "float32"


def write(out: Path, tensors: dict[str, torch.Tensor], config: dict, fmt: str) -> Path:
    """``model.safetensors`` + ``config.json`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt", "draftsmith_export": fmt})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


@dataclass(frozen=True)
class AuxIds:
    """Where a config keeps the target layers a drafter reads, and how it numbers them: id k is HF
    ``hidden_states[k + offset]``."""

    keys: tuple[str, ...]
    """The path of config keys to the list of ids."""
    offset: int
    """id k is HF ``hidden_states[k + offset]``."""

    def read(self, config: dict) -> tuple[int, ...] | None:
        """The HF ``hidden_states`` indices ``config`` names here, or None where it names none."""
        node = config
        for key in self.keys:
            node = node.get(key) if isinstance(node, dict) else None
        return None if node is None else tuple(k + self.offset for k in node)

    def ids(self, layers) -> list[int]:
        """HF ``hidden_states`` indices ``layers`` as this numbering writes them."""
        return [k - self.offset for k in layers]


def llama_config(cfg, target_config: dict, vocab_size: int) -> dict:
    """The drafter's one decoder layer as a Llama config (what every loader builds the layer from)."""
    return {
        "model_type": "llama",
        "hidden_size": cfg.shape.hidden_size,
        "intermediate_size": cfg.shape.intermediate_size,
        "num_attention_heads": cfg.shape.num_attention_heads,
        "num_key_value_heads": cfg.shape.num_attention_heads,
        "head_dim": cfg.shape.head_dim,
        "num_hidden_layers": getattr(cfg, "num_layers", 1),  # EAGLE-3's stack (vLLM builds layers 1.. plain)
        "hidden_act": "silu",
        "rms_norm_eps": cfg.shape.rms_norm_eps,
        "rope_theta": cfg.shape.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.shape.rope_theta},
        "max_position_embeddings": cfg.shape.max_position_embeddings,
        "vocab_size": vocab_size,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": target_config.get("bos_token_id"),
        "eos_token_id": target_config.get("eos_token_id"),
    }


def speculators_config(src: Source, target: dict, speculative_tokens: int) -> dict:
    """The ``speculators_config`` block: a greedy proposal of ``speculative_tokens`` tokens and the verifier."""
    return {
        "algorithm": src.method,
        "proposal_methods": [
            {
                "proposal_type": "greedy",
                "speculative_tokens": speculative_tokens,
                "verifier_accept_k": 1,
                "accept_tolerance": 0.0,
            }
        ],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": str(src.target_dir), "architectures": target.get("architectures", [])},
    }
