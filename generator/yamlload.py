"""Safe YAML loading that remembers the line of every mapping key and sequence item.

Spec errors must point at ``file:line``; PyYAML's plain ``safe_load`` forgets positions, so the
safe constructor is extended to return :class:`Node` wrappers (value + line). Only safe tags are
constructed: a spec can never instantiate Python objects.
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
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


def read_text(p: Path) -> str:
    """The text of the spec file ``p`` (UTF-8, universal newlines): a regular file of at most
    MAX_SPEC_BYTES, else a SpecError naming the path and what is wrong."""
    data = _read_bounded(p)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise SpecError(f"not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}; "
                        "allowed: a UTF-8 YAML file", path=str(p), line=line) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


# The largest spec file read: the packaged specs are a few KB; anything near this is no spec, and
# reading it whole (a device, a huge file) would only exhaust memory.
MAX_SPEC_BYTES = 1 << 20

_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _read_bounded(p: Path) -> bytes:
    """The bytes of the spec file ``p``: a regular file of at most MAX_SPEC_BYTES, else a
    SpecError naming the path. A FIFO used to hang the read (waiting for a writer), /dev/zero to
    end in a MemoryError, and a symlink loop to read as a missing file."""
    try:
        # O_NONBLOCK: opening a FIFO returns at once (no writer needed), so fstat can refuse it;
        # regular files ignore the flag. Opening and then checking the open file leaves no window
        # in which the path could become something else.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SpecError("a symbolic link loop (too many levels of symbolic links); allowed: a YAML file",
                            path=str(p)) from None
        raise SpecError(f"cannot read spec: {exc.strerror}", path=str(p)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _FILE_KINDS if test(mode)), "a special file")
            raise SpecError(f"not a regular file ({kind}); allowed: a YAML file", path=str(p))
        chunks, size = [], 0
        while size <= MAX_SPEC_BYTES:   # bounded even if the file grows meanwhile
            chunk = os.read(fd, MAX_SPEC_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise SpecError(f"cannot read spec: {exc.strerror}", path=str(p)) from None
    finally:
        os.close(fd)
    if len(data) > MAX_SPEC_BYTES:
        size = max(len(data), os.stat(p).st_size)
        raise SpecError(f"{size} bytes; allowed: a YAML file of at most {MAX_SPEC_BYTES} bytes "
                        f"({MAX_SPEC_BYTES >> 20} MiB)", path=str(p))
    return data
