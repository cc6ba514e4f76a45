"""YAML as the config loader reads it: libyaml's parser when there is one, and a key given twice refused."""

from __future__ import annotations

from typing import Any

import yaml

from policy_agent.errors import AgentError

__all__ = ["ConfigError", "SAFE_LOADER", "strict_load"]


class ConfigError(AgentError):
    """The configuration is invalid; `errors` lists "field.path: reason" lines."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


# libyaml's parser when PyYAML was built with it: a config parses in ~1 ms, not ~10-30 ms (most of what a verb
# that only talks to the agent took to start). A text it refuses is read again by the pure loader, so what
# is wrong is said as before (libyaml also refuses lone surrogates and surrogate escapes the pure one reads).
SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def strict_load(text: str) -> Any:
    """yaml.safe_load, but a key given twice in one mapping is a ConfigError naming it: YAML would keep
    the last silently, so a setting written twice (a merge, a paste) would be half ignored."""
    if SAFE_LOADER is not yaml.SafeLoader:
        try:
            return _load(SAFE_LOADER, text)
        except (yaml.YAMLError, UnicodeError):
            pass
    return _load(yaml.SafeLoader, text)


def _load(loader_class: type[yaml.SafeLoader], text: str) -> Any:
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        duplicates: list[str] = []
        _find_duplicate_keys(node, "", duplicates, set())
        if duplicates:
            raise ConfigError(duplicates)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _find_duplicate_keys(node: yaml.Node, path: str, out: list[str], seen_nodes: set[int]) -> None:
    if id(node) in seen_nodes:  # an alias: checked where its anchor stands (and it may be recursive)
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _find_duplicate_keys(item, f"{path}[{i}]", out, seen_nodes)
    elif isinstance(node, yaml.MappingNode):
        first_line: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            name = f"{path}.{key.value}" if path else str(key.value)
            line = key.start_mark.line + 1
            if (key.tag, key.value) in first_line:
                out.append(f"{name}: duplicate key (line {first_line[key.tag, key.value]}, again at line {line}); "
                           "YAML would keep only the last: give it once")
            else:
                first_line[key.tag, key.value] = line
            _find_duplicate_keys(value, name, out, seen_nodes)
