"""Layers only look down: base (leaves) <- generator (specs, registry, rendering) and runtime
(NVRTC, cache, loading, launching), which never import each other <- the pipeline, the ops and
the CLI above both. Checked on the source (every import statement, lazy ones too) and by
importing each layer alone."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# layer -> (folder, its package, the fusegemm packages it may import)
LAYERS = {
    "base": (ROOT / "fusegemm" / "base", "fusegemm.base", ("fusegemm.base",)),
    "generator": (ROOT / "generator", "fusegemm.generator", ("fusegemm.base", "fusegemm.generator")),
    "runtime": (ROOT / "runtime", "fusegemm.runtime", ("fusegemm.base", "fusegemm.runtime")),
}


def _imports(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every fusegemm import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [f"{mod}.{a.name}" for a in node.names] if node.level and not node.module else [mod]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out += [(node.lineno, n) for n in names if n == "fusegemm" or n.startswith("fusegemm.")]
    return out


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layer_imports_only_below(layer):
    folder, package, allowed = LAYERS[layer]
    bad = []
    for path in sorted(folder.glob("*.py")):
        for line, mod in _imports(path, package):
            if not any(mod == a or mod.startswith(a + ".") for a in allowed):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert bad == []


def test_the_checker_sees_a_violation(tmp_path):
    """A planted upward import is reported (relative and absolute, lazy too)."""
    p = tmp_path / "x.py"
    p.write_text("def f():\n    from ..generator.render import render\n    import fusegemm.ops\n")
    assert _imports(p, "fusegemm.runtime") == [(2, "fusegemm.generator.render"), (3, "fusegemm.ops")]


@pytest.mark.parametrize("modules,forbidden", [
    ("fusegemm.generator.render, fusegemm.generator.registry, fusegemm.generator.spec",
     ("fusegemm.runtime", "fusegemm.ops", "fusegemm.pipeline")),
    ("fusegemm.runtime.cache, fusegemm.runtime.launch, fusegemm.runtime.load, fusegemm.runtime.tensors",
     ("fusegemm.generator", "fusegemm.ops", "fusegemm.pipeline")),
    ("fusegemm.base.errors, fusegemm.base.dtypes, fusegemm.base.archs, fusegemm.base.contract",
     ("fusegemm.generator", "fusegemm.runtime", "fusegemm.ops", "numpy")),
])
def test_each_layer_imports_alone(modules, forbidden):
    code = (f"import sys, {modules}\n"
            f"bad = sorted(m for m in sys.modules if m.startswith({forbidden!r}))\n"
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
