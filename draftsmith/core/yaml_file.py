"""YAML read as a recipe or a config is read: a key given twice in one mapping is refused in one line naming the file,
the key and both lines (PyYAML and jsonargparse keep the last silently, so a recipe pasted into another trains as the
second one while its name says the first)."""

from __future__ import annotations

from pathlib import Path

import yaml

from draftsmith.errors import DraftsmithError


class _UniqueKeys(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping holding one key twice."""


def _mapping(loader: _UniqueKeys, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise DraftsmithError(f"{loader.name}: key {key!r} given twice (lines {seen[key]} and {line}); keep one")
        seen[key] = line
    return loader.construct_mapping(node, deep)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def read_yaml(path: Path | str):
    """``path``'s YAML, every mapping with distinct keys; not valid YAML is one line too."""
    loader = _UniqueKeys(Path(path).read_text())
    loader.name = str(path)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as e:
        raise DraftsmithError(f"{path}: not valid YAML ({e})") from None
    finally:
        loader.dispose()
