"""Kangaroo's export: no serving engine drafts with the target's own layers and an adapter, so the family has no
export hook and the formats refuse it saying so (draftsmith's native format holds it)."""

from draftsmith.families.registry import unserved

unserved("kangaroo", why="no serving engine drafts with the target's own layers and an adapter")
