"""Parameter documentation written once and shared.

The seed ops exist in several spellings -- the numpy reference (``fusegemm.reference``), the GPU
wrapper, the class API's ``execute`` and the torch custom op -- with the same parameters. Their
descriptions (shape, dtype, layout, default, constraint) live in the reference's numpydoc
``Parameters`` section; :func:`shares_parameters` gives another spelling a ``Parameters``
section built from it (renamed where the spelling differs, overridden where the GPU op differs),
so a change to one description reaches every spelling. ``tests/unit/test_docstrings.py`` fails
when a public name has no docstring or leaves a parameter undocumented.
"""
from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Mapping

_UNDERLINE = re.compile(r"^-{3,}\s*$")


def parameter_docs(doc: str | None, section: str = "Parameters") -> dict[str, str]:
    """``{name: text}`` from the numpydoc ``section`` (default ``Parameters``) of ``doc``.

    An entry is an unindented ``name : text`` (or ``a, b : text``, several names sharing it)
    followed by indented continuation lines; the text keeps the type (its first line, empty for
    an entry without one) and the description.
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    out: dict[str, str] = {}
    start = _section(lines, section)
    if start is None:
        return out
    names: list[str] = []
    typeless = False
    for i in range(start + 2, len(lines)):
        line = lines[i]
        if i + 1 < len(lines) and _UNDERLINE.match(lines[i + 1]):
            break                              # the next section's title
        if not line.strip():
            continue
        if line[0].isspace():
            for n in names:
                # An entry without a type keeps its empty first line: the description must not
                # become the type where the entry is written again (shares_parameters).
                out[n] += ("\n" if out[n] or typeless else "") + line.strip()
            continue
        head, _, rest = line.partition(" : ")
        names = [n.strip().lstrip("*") for n in head.split(",") if n.strip()]
        typeless = not rest.strip()
        for n in names:
            out[n] = rest.strip()
    return out


def _section(lines: list[str], title: str) -> int | None:
    """Index of the numpydoc section ``title`` (a line underlined with dashes), or None."""
    return next((i for i in range(len(lines) - 1) if lines[i].strip() == title and _UNDERLINE.match(lines[i + 1])),
                None)


def _entry(name: str, text: str) -> str:
    first, _, more = text.partition("\n")
    body = f"{name} : {first}" if first else name
    return body + "".join(f"\n    {line}" for line in more.splitlines())


def shares_parameters(source: Callable[..., Any] | None = None, *, rename: Mapping[str, str] | None = None,
                      extra: Mapping[str, str] | None = None, skip: tuple[str, ...] = ("self", "ctx")):
    """Decorator: give the function a ``Parameters`` section for every parameter of its signature.

    Each entry comes from ``extra[name]``, else from the function's own docstring, else from
    ``source``'s docstring under ``rename.get(name, name)``. A parameter found in none of them is
    left out (and the docstring test names it).
    """
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        own_doc = inspect.cleandoc(fn.__doc__ or "")
        own = parameter_docs(own_doc)
        shared = parameter_docs(inspect.getdoc(source)) if source is not None else {}
        entries = []
        for p in inspect.signature(fn).parameters.values():
            if p.name in skip or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            text = (extra or {}).get(p.name) or own.get(p.name) or shared.get((rename or {}).get(p.name, p.name))
            if text is not None:
                entries.append(_entry(p.name, text))
        section = "Parameters\n----------\n" + "\n".join(entries)
        lines = own_doc.splitlines()
        idx = _section(lines, "Parameters")
        if idx is not None:                    # replace the own section (its entries were kept above)
            end = next((j for j in range(idx + 2, len(lines) - 1) if _UNDERLINE.match(lines[j + 1])), len(lines))
            lines[idx:end] = section.splitlines() + ([""] if end < len(lines) else [])
            fn.__doc__ = "\n".join(lines)
        else:                                  # after the description, before any other section
            cut = next((i for i in range(len(lines) - 1) if _UNDERLINE.match(lines[i + 1])), len(lines))
            head = lines[:cut]
            while head and not head[-1].strip():
                head.pop()
            tail = lines[cut:]
            fn.__doc__ = "\n".join(head + ["", section] + ([""] + tail if tail else []))
        return fn
    return deco
