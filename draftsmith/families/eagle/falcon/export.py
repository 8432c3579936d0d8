"""Falcon's export: no serving engine loads its semi-autoregressive drafter, so the family has no export hook and the
formats refuse it saying so (draftsmith's native format holds it)."""

from draftsmith.families.registry import unserved

unserved("falcon", why="no serving engine loads Falcon's semi-autoregressive drafter")
