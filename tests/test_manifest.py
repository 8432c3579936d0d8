"""The run manifest (provenance of every artifact) and the one reuse rule of multi-stage runs."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import torch

import draftsmith
from draftsmith.core.manifest import is_current, write_manifest


def test_manifest_records_command_versions_target_and_seed(tmp_path):
    path = write_manifest(tmp_path / "run", target={"name": "t", "vocab_size": 7}, seed=3, recipe="eagle3")
    record = json.loads(path.read_text())
    assert record["command"] == shlex.join(sys.argv)
    assert (
        record["versions"]["draftsmith"] == draftsmith.__version__ and record["versions"]["torch"] == torch.__version__
    )
    assert record["target"] == {"name": "t", "vocab_size": 7} and record["seed"] == 3 and record["recipe"] == "eagle3"
    assert "git" in record and record["time"]


def test_a_stage_is_current_only_for_the_inputs_it_was_made_from(tmp_path):
    stage = {"fit": {"steps": 10, "data": Path("runs/data"), "layers": (1, 2)}}
    assert not is_current(tmp_path, stage)  # nothing there yet
    write_manifest(tmp_path, stage=stage)
    assert is_current(tmp_path, {"fit": {"steps": 10, "data": "runs/data", "layers": [1, 2]}})  # as JSON reads it
    assert not is_current(tmp_path, {"fit": {"steps": 11, "data": "runs/data", "layers": [1, 2]}})
    write_manifest(tmp_path)  # a manifest without a stage (a plain command's) makes nothing current
    assert not is_current(tmp_path, stage)
    (tmp_path / "manifest.json").write_text("{")  # cut short
    assert not is_current(tmp_path, stage)
