"""mkdocs hooks of the fusegemm site (mkdocs.yml ``hooks:``; not a page: ``exclude_docs``).

The docstrings cross-reference with Sphinx roles (``:func:`~fusegemm.reference.grouped_gemm```),
which read well in ``help()`` and in editors; mkdocstrings renders a role as literal text before
the code span. Here a role becomes the code span alone, its target shortened as ``~`` asks.
"""
from __future__ import annotations

import re

ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|obj|exc):<code>(~?)([\w.]+)</code>")


def strip_roles(html: str) -> str:
    """``:func:<code>~a.b.c</code>`` -> ``<code>c</code>`` (without ``~``: the full name)."""
    return ROLE.sub(lambda m: f"<code>{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}</code>", html)


def on_page_content(html: str, **kwargs) -> str:
    return strip_roles(html)
