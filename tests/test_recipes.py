"""Every shipped recipe (``configs/**/*.yaml`` but strategies) loads through the real ``fit`` parser."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from draftsmith.cli import main

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if p.parent.name != "strategy")


def test_every_family_has_a_smollm2_recipe():
    families = {p.stem for p in RECIPES if p.parent.name == "configs"}
    smollm2 = {p.stem for p in RECIPES if p.parent.name == "smollm2"}
    assert {"eagle3", "eagle1", "medusa1", "hydrapp", "draft_lm", "acceptance_head"} <= smollm2 <= families


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_recipe_parses_and_starts_with_its_command(recipe, capsys):
    first = recipe.read_text().splitlines()[0]
    assert first.startswith("# draftsmith fit --config ") and str(recipe.relative_to(ROOT)) in first
    with pytest.raises(SystemExit) as exc:
        main(["fit", f"--config={recipe}", "--print_config"])
    assert exc.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    written = yaml.safe_load(recipe.read_text())
    assert printed["model"]["class_path"] == written["model"]["class_path"]
    for key, value in written["model"]["init_args"].items():
        if not isinstance(value, dict):
            assert printed["model"]["init_args"][key] == value, key
