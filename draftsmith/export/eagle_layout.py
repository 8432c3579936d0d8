"""EAGLE-1 / EAGLE-3 layouts as the importers read them: the table is the EAGLE family's (``families/eagle/layout.py``,
which its export hooks write by), DFlash's aux ids DFlash's (``families/dflash/export.py``); here for
``draftsmith import``."""

from __future__ import annotations

from draftsmith.families.dflash.export import SPECULATORS_DFLASH_IDS, ZLAB_DFLASH_IDS
from draftsmith.families.eagle.layout import (
    EAGLE1_PREFIX,
    EAGLE3_NORM_FLAGS,
    LAYOUTS,
    SGLANG_IDS,
    VLLM_IDS,
    EagleLayout,
    aux_layer_ids,
    check_eagle1_feature,
    feature_layers,
    fold_fc_bias,
    layer_tensors,
    loader_default_layers,
    read_layer_tensors,
    stack_indices,
    vocab_maps,
)
from draftsmith.layers.export import AuxIds, llama_config

__all__ = [
    "EAGLE1_PREFIX",
    "EAGLE3_NORM_FLAGS",
    "LAYOUTS",
    "SGLANG_IDS",
    "SPECULATORS_DFLASH_IDS",
    "VLLM_IDS",
    "ZLAB_DFLASH_IDS",
    "AuxIds",
    "EagleLayout",
    "aux_layer_ids",
    "check_eagle1_feature",
    "feature_layers",
    "fold_fc_bias",
    "layer_tensors",
    "llama_config",
    "loader_default_layers",
    "read_layer_tensors",
    "stack_indices",
    "vocab_maps",
]
