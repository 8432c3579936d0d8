"""The EAGLE drafters' configs: ``Eagle1Config`` and ``Eagle3Config`` (EAGLE-3.1's norms are options of the latter) over
``EagleConfig``'s shared fields, and ``config_class`` picking one by version. ``network.py`` tells what each field
builds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from transformers import LlamaConfig

from draftsmith.errors import DraftsmithError
from draftsmith.layers.shape import LayerShape, borrowed_shape


@dataclass
class EagleConfig:
    """Shape of an EAGLE drafter, shared by ``Eagle1Config`` and ``Eagle3Config`` (which say how the one
    implementation is wired). Target-derived fields are filled by ``from_target``."""

    version: int = 3
    """1 for EAGLE-1, 3 for EAGLE-3 (recorded with the weights; ``config_class`` maps it to its class)."""
    feature_layers: tuple[int, ...] = (-1,)
    """Target hidden_states indices fed to the drafter (EAGLE-1: final; EAGLE-3: low, mid, high)."""
    shape: LayerShape = LayerShape()
    """The decoder layer's shape, the target's (``borrowed_shape``)."""
    vocab_size: int = 0
    """The target's vocabulary."""
    draft_vocab_size: int = 0
    """EAGLE-3's reduced vocabulary (= vocab_size for no reduction); EAGLE-1 uses the full one."""
    target_hidden_size: int = 0
    extra: dict = field(default_factory=dict)

    @staticmethod
    def from_target(
        target_config,
        version: int,
        feature_layers: tuple[int, ...],
        draft_vocab_size: int = 0,
        fc_norm: bool = False,
        norm_before_fc: bool = False,
        norm_output: bool = False,
        num_layers: int = 1,
        norm_before_residual: bool = False,
    ):
        """The EAGLE-``version`` drafter's config for a target with this HF config (any family: ``borrowed_shape``);
        ``fc_norm``, ``norm_before_fc``, ``norm_output``: EAGLE-3.1's norms, ``norm_before_residual`` speculators'
        residual norm (``Eagle3Config``; EAGLE-1 has none);
        ``num_layers``: decoder layers (EAGLE-3; EAGLE-1 has one)."""
        cls = config_class(version)
        if cls.max_feature_layers and len(feature_layers) > cls.max_feature_layers:
            raise DraftsmithError(
                f"EAGLE-{version} takes {cls.max_feature_layers} feature layer, got feature_layers={list(feature_layers)}"
            )
        norms = {"fc_norm": fc_norm, "norm_before_fc": norm_before_fc, "norm_output": norm_output}
        norms["norm_before_residual"] = norm_before_residual
        if not cls.own_head:
            if any(norms.values()):
                on = [name for name, value in norms.items() if value]
                raise DraftsmithError(f"EAGLE-{version} has no EAGLE-3.1 norms; {', '.join(on)} need version 3")
            norms = {}
        if num_layers != 1:
            if not cls.own_head:
                raise DraftsmithError(f"EAGLE-{version} has one decoder layer; num_layers={num_layers} needs version 3")
            norms["num_layers"] = num_layers
        shape = borrowed_shape(target_config, f"EAGLE-{version}")
        vocab = target_config.vocab_size
        return cls(
            feature_layers=tuple(feature_layers),
            shape=shape,
            vocab_size=vocab,
            draft_vocab_size=(draft_vocab_size or vocab) if cls.own_head else vocab,
            target_hidden_size=shape.hidden_size,
            **norms,
        )

    def llama_config(self) -> LlamaConfig:
        return self.shape.llama_config(self.vocab_size)


@dataclass
class Eagle1Config(EagleConfig):
    """EAGLE-1: fc(concat(embed(x), f)) into one decoder layer; the target's own (frozen) LM head reads its output,
    which is also regressed onto the target's next feature; trained with teacher forcing."""

    version: int = 1
    separate_inputs: ClassVar[bool] = False
    """Whether the layer takes norm(embed) and norm(feature) side by side (2H into q/k/v), the feature fused
    from several target layers by fc, instead of fc(concat(embed, feature))."""
    own_head: ClassVar[bool] = False
    """Whether the drafter has its own normed LM head over a reduced draft vocabulary (d2t / t2d) instead of the
    target's head; without one, its output is regressed onto the target's feature."""
    ttt: ClassVar[bool] = False
    """Trained with training-time test (its own earlier outputs as later steps' inputs)."""
    max_feature_layers: ClassVar[int] = 1
    """Most target layers it reads (0: any number)."""
    fc_norm: ClassVar[bool] = False
    norm_before_fc: ClassVar[bool] = False
    norm_output: ClassVar[bool] = False
    norm_before_residual: ClassVar[bool] = False
    """EAGLE-1 has none of EAGLE-3.1's norms nor speculators' residual norm (``Eagle3Config``)."""
    num_layers: ClassVar[int] = 1
    """EAGLE-1 has one decoder layer."""


@dataclass
class Eagle3Config(EagleConfig):
    """EAGLE-3: low, middle and high target layers fused by fc; the layer attends over norm(embed) and
    norm(feature); its own head over a reduced draft vocabulary; trained with training-time test."""

    version: int = 3
    separate_inputs: ClassVar[bool] = True
    own_head: ClassVar[bool] = True
    ttt: ClassVar[bool] = True
    max_feature_layers: ClassVar[int] = 0
    fc_norm: bool = False
    """EAGLE-3.1: an RMSNorm on each target feature before fc, fc(concat(norm_a(f_a), norm_b(f_b), ...))
    (weights ``fc_norm.{i}.weight``, one per feature layer; speculators' and vLLM's ``fc_norm``)."""
    norm_before_fc: bool = False
    """One RMSNorm on the concatenated features before fc, fc(norm(concat(f_a, f_b, ...))) (weight
    ``input_norm.weight``; speculators' and vLLM's ``norm_before_fc``, the variant speculators' 3.1 defaults use).
    Exclusive with ``fc_norm``."""
    norm_output: bool = False
    """EAGLE-3.1: the layer output after the final ``norm`` (what the LM head reads) is also what the next step
    reads as its feature, in training-time test and in drafting, instead of the un-normed output (no weights of its
    own; speculators' and vLLM's ``norm_output``)."""
    norm_before_residual: bool = False
    """The first layer's residual is the normed feature, hidden_norm(f), instead of f (speculators' and vLLM's
    ``norm_before_residual``; speculators' trainer's default, vLLM's default for a speculators config without the
    key; SGLang's EAGLE-3 has no such flag)."""
    num_layers: int = 1
    """Decoder layers: the first over (embeds ‖ feature), the others plain pre-norm layers over its output (vLLM's
    ``num_hidden_layers``)."""

    def __post_init__(self) -> None:
        if isinstance(self.num_layers, bool) or not isinstance(self.num_layers, int) or self.num_layers < 1:
            raise DraftsmithError(f"EAGLE-3: num_layers must be a whole number >= 1, got {self.num_layers!r}")
        if self.fc_norm and self.norm_before_fc:
            raise DraftsmithError(
                "EAGLE-3: fc_norm (a norm per feature layer) and norm_before_fc (one norm on their concatenation) "
                "are exclusive; set one"
            )


EAGLE_CONFIGS = {1: Eagle1Config, 3: Eagle3Config}


def config_class(version: int) -> type[Eagle1Config] | type[Eagle3Config]:
    if version not in EAGLE_CONFIGS:
        raise DraftsmithError(f"eagle version must be 1 or 3, got {version}")
    return EAGLE_CONFIGS[version]
