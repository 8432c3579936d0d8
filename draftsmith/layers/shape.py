"""``LayerShape``: the shape a drafter's own Llama-style layer borrows from its target, whatever the target's family.

EAGLE, Hydra++, Clover, Kangaroo and DFlash build a layer of their target's size; each config holds these fields
(flat, as its checkpoints record them) and is built from ``borrowed_shape``'s record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from transformers import LlamaConfig

from draftsmith.errors import DraftsmithError

ROPE_THETA = 10000.0
"""RoPE base of a drafter layer whose target names none (learned positions, or per-layer-type bases)."""


# Llama-style config fields whose value a drafter's own decoder layer borrows from its target, and the names
# other families give them (GPT-2 / GPT-J, GPT-NeoX, Starcoder2, Falcon, OPT ...)
BORROWED_FIELDS = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "intermediate_size": ("intermediate_size", "ffn_hidden_size", "ffn_dim", "n_inner"),
    "rms_norm_eps": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "norm_eps"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "max_sequence_length"),
}


@dataclass(frozen=True)
class LayerShape:
    """The target-shape fields of a drafter's layer (a config's vocabulary, the ninth, is the target's own)."""

    hidden_size: int
    num_attention_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int

    @classmethod
    def of(cls, cfg) -> LayerShape:
        """The shape a config holds (its heads as ``num_attention_heads``, or ``num_heads`` as EAGLE's and DFlash's)."""
        heads = getattr(cfg, "num_attention_heads", None) or cfg.num_heads
        fields = ("intermediate_size", "rms_norm_eps", "rope_theta", "max_position_embeddings")
        return cls(cfg.hidden_size, heads, cfg.head_dim, **{name: getattr(cfg, name) for name in fields})

    def as_dict(self) -> dict:
        """The fields by name, to build a config from (``Config(..., **shape.as_dict())``)."""
        return asdict(self)

    def llama_config(self, vocab_size: int) -> LlamaConfig:
        """The one-layer Llama config a layer of this shape builds its MLP and rotary embedding from."""
        return LlamaConfig(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_attention_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            max_position_embeddings=self.max_position_embeddings,
            vocab_size=vocab_size,
            num_hidden_layers=1,
        )


def borrowed_shape(target_config, drafter: str) -> LayerShape:
    """The shape a drafter's Llama-style layer takes from its target, whatever its family calls each field.

    Only sizes and the norm epsilon are borrowed: the drafter's layer is its own (RMSNorm, SwiGLU MLP,
    RoPE), so a target with LayerNorm, a GELU MLP or learned positions lends the same numbers. GPT-2's
    ``n_inner: null`` is its default MLP width, 4 * hidden; a target without RoPE lends RoPE's usual base.

    Args:
        target_config: the target's HF config.
        drafter: the drafter family, for the error message.

    Returns:
        ``hidden_size``, ``num_attention_heads``, ``head_dim``, ``intermediate_size``, ``rms_norm_eps``,
        ``rope_theta`` and ``max_position_embeddings``.

    Raises:
        DraftsmithError: the config has none of a field's names (one line naming the architecture and field).
    """
    config = target_config.get_text_config(decoder=True)
    shape = {}
    for name, aliases in BORROWED_FIELDS.items():
        present = [alias for alias in aliases if hasattr(config, alias)]
        if not present:
            raise DraftsmithError(
                f"{drafter}: the target's {type(config).__name__} ({config.model_type}) has no {name} "
                f"(looked for {', '.join(aliases)}); the drafter's layer borrows its size from the target"
            )
        value = getattr(config, present[0])
        if value is None and present[0] == "n_inner":  # GPT-2 / GPT-J: null means 4 * hidden
            value = 4 * shape["hidden_size"]
        shape[name] = value
    shape["head_dim"] = getattr(config, "head_dim", None) or shape["hidden_size"] // shape["num_attention_heads"]
    rope = getattr(config, "rope_parameters", None) or {}
    shape["rope_theta"] = rope.get("rope_theta", getattr(config, "rope_theta", None) or ROPE_THETA)
    return LayerShape(**shape)
