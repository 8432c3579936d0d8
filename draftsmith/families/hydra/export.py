"""Hydra's (and Hydra++'s) export: no serving engine loads Hydra heads, so the family has no export hook and the
formats refuse it saying so (draftsmith's native format holds it)."""

from draftsmith.families.registry import unserved

unserved("hydra", "hydrapp", why="no serving engine loads Hydra heads")
