"""The five configs whose layer borrows its target's shape embed one ``LayerShape``: recorded nested, and a drafter
saved before (its seven fields flat in the record, ``tests/data/flat_shape_records.json``, written by ed56679's
code for the configs built below) still rebuilds the same network."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from transformers import LlamaConfig

from draftsmith.errors import DraftsmithError
from draftsmith.families.clover.network import CloverConfig
from draftsmith.families.dflash.dspark.network import DSparkConfig
from draftsmith.families.dflash.network import DFlashConfig
from draftsmith.families.eagle.config import EagleConfig
from draftsmith.families.eagle.falcon.network import FalconConfig
from draftsmith.families.eagle.peagle.network import PEagleConfig
from draftsmith.families.hydra.network import HydraConfig
from draftsmith.families.kangaroo.network import KangarooConfig
from draftsmith.families.registry import build_network, extended
from draftsmith.layers.shape import LayerShape

FLAT = json.loads((Path(__file__).parent / "data" / "flat_shape_records.json").read_text())
TARGET = LlamaConfig(
    hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=112, vocab_size=96,
    rms_norm_eps=1e-5, rope_theta=50000.0, max_position_embeddings=256, num_hidden_layers=4,
)  # fmt: skip
SHAPE = LayerShape(64, 4, 16, 112, 1e-5, 50000.0, 256)


def configs() -> dict:
    """The configs the flat records were written from, built by today's code."""
    e3 = EagleConfig.from_target(TARGET, 3, (0, 1, 2), 48, fc_norm=True, norm_output=True)
    return {
        "eagle1": EagleConfig.from_target(TARGET, 1, (-1,)),
        "eagle3": e3,
        "peagle": extended(e3, PEagleConfig, depth=3, mask_token_id=5),
        "falcon": FalconConfig.for_target(TARGET, 2),
        "dflash": DFlashConfig.from_target(TARGET, (1, 2), 3, 1),
        "dspark": DSparkConfig.from_target(TARGET, (1, 2), 3, 1, markov_rank=8),
        "hydrapp": HydraConfig.from_target(TARGET, 96, 3, 1, True),
        "clover": CloverConfig.from_target(TARGET, 96, 3, 1),
        "kangaroo": KangarooConfig.from_target(TARGET, 96, 2, 0.5),
    }


def shapes(network) -> dict:
    return {k: tuple(v.shape) for k, v in network.state_dict().items()}


@pytest.mark.parametrize("method", list(FLAT))
def test_a_drafter_saved_with_its_shape_flat_rebuilds_the_same_network(method):
    cfg = configs()[method]
    assert cfg.shape == SHAPE  # borrowed from the target, whatever the family
    record = json.loads(json.dumps(asdict(cfg)))  # what save_native writes
    assert record["shape"] == asdict(SHAPE) and not set(record) & set(asdict(SHAPE))
    assert ("num_heads" in record) == (method in ("hydrapp", "clover"))  # draft heads; EAGLE's and DFlash's are shape's
    flat, nested = build_network(method, FLAT[method]), build_network(method, record)
    assert flat.cfg == nested.cfg == cfg
    assert shapes(flat) == shapes(nested)


def test_hydra_and_clovers_draft_heads_stay_theirs_in_the_flat_form():
    """Their ``num_heads`` counts draft heads; the flat form's attention heads are ``num_attention_heads``."""
    for method in ("hydrapp", "clover"):
        cfg = build_network(method, FLAT[method]).cfg
        assert (cfg.num_heads, cfg.shape.num_attention_heads) == (3, 4)


def test_a_record_with_a_field_of_neither_form_is_refused_in_one_line():
    bad = {**FLAT["eagle3"], "hidden_sizes": 64}
    with pytest.raises(DraftsmithError, match=r"config has fields \['hidden_sizes'\] that Eagle3Config does not know"):
        build_network("eagle3", bad)
