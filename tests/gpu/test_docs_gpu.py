"""The getting-started page's examples (docs/index.md) on the GPU: the reference call, then the
same arguments through the kernel, compared with the tests' tolerances."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


def test_getting_started_examples_run_on_the_gpu():
    page = (Path(__file__).resolve().parents[2] / "docs" / "index.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) == 2
    scope: dict = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/index.md[{i}]", "exec"), scope)
