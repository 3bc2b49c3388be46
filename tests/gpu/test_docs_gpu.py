"""The docs' examples (docs/index.md, docs/examples.md) on the GPU: every python block in page
order (the reference calls, then the same arguments through the kernels, compared with the
tests' tolerances)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["index.md", "examples.md", "run-a-spec.md"])
def test_doc_examples_run_on_the_gpu(name):
    page = (Path(__file__).resolve().parents[2] / "docs" / name).read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) >= 2
    scope: dict = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/{name}[{i}]", "exec"), scope)
