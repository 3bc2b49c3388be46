"""Safe YAML loading that remembers the line of every mapping key and sequence item.

Spec errors must point at ``file:line``; PyYAML's plain ``safe_load`` forgets positions, so the
safe constructor is extended to return :class:`Node` wrappers (value + line). Only safe tags are
constructed: a spec can never instantiate Python objects.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from ..base.errors import SpecError


@dataclass(frozen=True)
class Node:
    """A YAML value with the (1-based) line it starts on."""

    value: Any
    line: int


# Deeper than any spec needs; bounds the composer's recursion (a 700-level nesting used to end in
# a RecursionError traceback).
MAX_DEPTH = 64


class _Loader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        # Aliases are refused: with them a few hundred bytes expand to gigabytes (the classic
        # "billion laughs"), and a spec never needs one -- write the value out.
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise SpecError("YAML aliases (*name) are not allowed in a spec; write the value out",
                            line=mark.line + 1)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise SpecError(f"nested more than {MAX_DEPTH} levels deep; allowed: at most {MAX_DEPTH}",
                                line=mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> Node:
    out: dict[str, Node] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, str):
            raise SpecError(f"mapping keys must be strings, got {key!r}", line=line)
        if key in out:
            raise SpecError(f"duplicate key {key!r} (first at line {out[key].line})", line=line)
        value = loader.construct_object(value_node, deep=True)
        out[key] = value if isinstance(value, Node) else Node(value, value_node.start_mark.line + 1)
        out[key] = Node(out[key].value, line)  # errors about a key point at the key's line
    return Node(out, node.start_mark.line + 1)


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> Node:
    items = []
    for item in node.value:
        value = loader.construct_object(item, deep=True)
        items.append(value if isinstance(value, Node) else Node(value, item.start_mark.line + 1))
    return Node(items, node.start_mark.line + 1)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_yaml(text: str, path: str) -> Node:
    """Parse ``text``; YAML syntax errors become :class:`SpecError` with the line."""
    try:
        root = yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader derives from SafeLoader
    except SpecError as exc:   # raised by the constructors above, without a path
        raise SpecError(str(exc) if exc.path is None else str(exc).split(": ", 1)[-1], path=path,
                        line=exc.line) from None
    except RecursionError:   # belt and braces: MAX_DEPTH should stop it first
        raise SpecError(f"nested too deeply; allowed: at most {MAX_DEPTH} levels", path=path) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"invalid YAML: {problem}", path=path, line=line) from None
    if root is None:
        raise SpecError("the file is empty; a spec is a mapping", path=path, line=1)
    if not isinstance(root, Node):
        root = Node(root, 1)
    return root


def plain(node: Any) -> Any:
    """Strip :class:`Node` wrappers recursively (for values past validation)."""
    if isinstance(node, Node):
        return plain(node.value)
    if isinstance(node, dict):
        return {k: plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain(v) for v in node]
    return node
