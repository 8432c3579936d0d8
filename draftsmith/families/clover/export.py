"""Clover's export: no serving engine loads Clover heads, so the family has no export hook and the formats refuse it
saying so (draftsmith's native format holds it)."""

from draftsmith.families.registry import unserved

unserved("clover", why="no serving engine loads Clover heads")
