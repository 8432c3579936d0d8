"""``LayerShape``: the shape a drafter's own Llama-style layer borrows from its target, whatever the target's family.

EAGLE, Hydra++, Clover, Kangaroo and DFlash build a layer of their target's size; each config embeds one as its
``shape`` field (recorded nested, ``"shape": {...}``), filled by ``borrowed_shape``. ``read_record`` also reads the
flat form drafters saved before hold (its seven fields at the top of the record).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

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
    """The target-shape fields of a drafter's layer (a config's vocabulary, the ninth, is the target's own). The
    defaults, all sizes 0, are a config's before ``from_target`` fills it."""

    hidden_size: int = 0
    num_attention_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = ROPE_THETA
    max_position_embeddings: int = 2048

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


def read_record(record: dict, config: type) -> dict:
    """The JSON record of a ``config`` dataclass, its ``shape`` a ``LayerShape`` if ``config`` embeds one.

    Drafters saved before the configs embedded a ``LayerShape`` hold its seven fields at the top of the record, the
    heads as ``num_attention_heads`` (Hydra, Clover, Kangaroo: their ``num_heads`` counts draft heads) or
    ``num_heads`` (EAGLE, DFlash). A record with neither form is returned as it is.
    """
    if not any(f.name == "shape" and f.type in (LayerShape, "LayerShape") for f in fields(config)):
        return record
    if isinstance(record.get("shape"), dict):
        return {**record, "shape": LayerShape(**record["shape"])}
    if "shape" in record or "hidden_size" not in record:
        return record
    rest = dict(record)
    heads = rest.pop("num_attention_heads") if "num_attention_heads" in rest else rest.pop("num_heads")
    names = [f.name for f in fields(LayerShape) if f.name != "num_attention_heads"]
    flat = {name: rest.pop(name) for name in names if name in rest}
    return {**rest, "shape": LayerShape(num_attention_heads=heads, **flat)}


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
