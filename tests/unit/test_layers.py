"""Layers only look down (STYLE item 14), and nothing in the package imports in a circle.

Every module of fusegemm/, generator/ and runtime/ is declared in one layer of ``LAYERS``,
bottom to top. A module may import a module of any layer below its own and of its own layer;
layers on the same tier (generator and runtime) never import each other. Checked on the source:
every import statement, function-level ones too (STYLE item 19: a hidden import is still an
import), and by importing each low layer alone. Any import cycle (a strongly connected
component of more than one module) anywhere in the package fails, inside one layer too.

The table follows the architecture note's (shared/notes/architecture.md), adjusted to what the
code is; each adjustment says why beside it.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Where each package's source sits in a checkout (generator/ and runtime/ install inside fusegemm).
SOURCES = {ROOT / "fusegemm": "fusegemm", ROOT / "generator": "fusegemm.generator",
           ROOT / "runtime": "fusegemm.runtime"}

# Tiers, bottom to top; a tier holds one layer or several that never import each other.
# A layer is the modules named and everything under them ("fusegemm" alone is only the root).
LAYERS: list[dict[str, tuple[str, ...]]] = [
    # Facts stated once; fusegemm.base.hooks is the call slots the ops call upward through
    # (the first-run gate, first-call tuning), filled in by the package root.
    {"base": ("fusegemm.base",)},
    # formats (number formats in numpy: casts, block scaling, SF layouts) stand beside the
    # generator and the runtime: they read the dtype table and nothing else, and neither of the
    # others reads them.
    {"generator": ("fusegemm.generator",),
     "runtime": ("fusegemm.runtime",),
     "formats": ("fusegemm.formats",)},
    # The note's "pipeline, verification gate, tuning records" tier. The gate itself is a hook
    # in base (what verifies runs the selftest cases, which call the ops: a tool, below).
    # heuristic (the roofline model's configuration) is read by the ops beside the records.
    # Beside it, what the host knows without launching anything: the seed argument contract,
    # the return type, the numpy references and test problems, the epilogue interpreter, the
    # spec as data (describe) and the comparison of outputs with the references. They import
    # none of the pipeline, and it none of them.
    {"pipeline": ("fusegemm.pipeline", "fusegemm.tuning_records", "fusegemm.heuristic"),
     "host": ("fusegemm.arguments", "fusegemm.tupledict", "fusegemm.reference", "fusegemm.problems",
              "fusegemm.interpret", "fusegemm.describe", "fusegemm.output_compare")},
    # The one engine (engine.py), the operands of each kernel class, the generated faces of the
    # preset rows (faces, hows, tuned; scaled_seeds keeps the seeds' output shaping); acyclic
    # inside.
    {"ops": ("fusegemm.ops",)},
    # The faces and what is built on them: the MoE layer and its routing (torch operations and
    # the permutation and quantization kernels beside them).
    {"faces": ("fusegemm.presets", "fusegemm.compat", "fusegemm.torch_library", "fusegemm.jax_ffi", "fusegemm.moe",
               "fusegemm.routing", "fusegemm.permute", "fusegemm.quantize", "fusegemm.expert_parallel")},
    # The note's tools, plus verify (it runs selftest's cases: the first-run verification is a
    # tool the ops reach through base.hooks) and harness (the epilogue harness on a GPU, which
    # tests and benchmarks drive; it uses the ops' device facts). The cubin reader the note
    # lists as "inspect" is runtime's.
    {"tools": ("fusegemm.cli", "fusegemm.build", "fusegemm.tune", "fusegemm.selftest", "fusegemm.docsgen",
               "fusegemm.verify", "fusegemm.harness_run")},
    # The package root: lazy public names, and it installs the hooks (so it imports the tools
    # that fill them, inside functions). Nothing in the package imports it.
    {"root": ("fusegemm",)},
]


def _layer_table() -> dict[str, tuple[int, tuple[str, ...]]]:
    return {name: (tier, prefixes) for tier, layers in enumerate(LAYERS) for name, prefixes in layers.items()}


def layer_of(module: str) -> str | None:
    """The layer whose longest-matching name holds ``module`` (the root matches only itself)."""
    best, length = None, -1
    for name, (_, prefixes) in _layer_table().items():
        for p in prefixes:
            hit = module == p or (p != "fusegemm" and module.startswith(p + "."))
            if hit and len(p) > length:
                best, length = name, len(p)
    return best


def modules(sources: dict[Path, str] = SOURCES) -> dict[str, Path]:
    """Module name -> source file, for every module under ``sources``."""
    out = {}
    for folder, package in sources.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _known(name: str, known: dict[str, Path]) -> str | None:
    """``name`` or the longest prefix of it that is a module."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path, module: str, known: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, module) of every import of a module in ``known`` made anywhere in ``path``
    (function bodies too). ``from X import Y`` names X.Y when that is a module, else X."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in dict.fromkeys(names):
            target = _known(name, known)
            if target is not None and target != module:
                out.append((node.lineno, target))
    return out


def import_graph(sources: dict[Path, str] = SOURCES) -> dict[str, dict[str, int]]:
    """Module -> {imported module: first line}."""
    known = modules(sources)
    graph: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        edges: dict[str, int] = {}
        for line, target in _imports(path, name, known):
            edges.setdefault(target, line)
        graph[name] = edges
    return graph


def upward(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every import of a module in a higher layer, or in another layer of the same tier."""
    table = _layer_table()
    bad = []
    for src, edges in sorted(graph.items()):
        mine = layer_of(src)
        for dst, line in sorted(edges.items()):
            theirs = layer_of(dst)
            if mine is None or theirs is None or theirs == mine:
                continue
            if table[theirs][0] >= table[mine][0]:
                bad.append(f"{src} ({mine}):{line} imports {dst} ({theirs})")
    return bad


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _describe(comp: list[str], graph: dict[str, dict[str, int]]) -> str:
    inside = set(comp)
    return "; ".join(f"{m}:{line} -> {d}" for m in comp for d, line in sorted(graph[m].items()) if d in inside)


GRAPH = import_graph()


def test_every_module_has_a_layer():
    """A new module is placed in the table, and the table names no module that is gone."""
    assert [m for m in GRAPH if layer_of(m) is None] == []
    declared = [p for layers in LAYERS for prefixes in layers.values() for p in prefixes]
    assert [p for p in declared if not any(m == p or m.startswith(p + ".") for m in GRAPH)] == []


@pytest.mark.parametrize("layer", sorted(_layer_table()))
def test_layer_imports_only_below(layer):
    assert [b for b in upward(GRAPH) if f" ({layer}):" in b] == []


def test_no_import_cycles():
    assert [_describe(c, GRAPH) for c in cycles(GRAPH)] == []


def test_the_checker_sees_a_violation(tmp_path):
    """A planted upward import is reported (relative and absolute, lazy too), and so is an
    import between the generator and the runtime."""
    (tmp_path / "runtime").mkdir()
    (tmp_path / "generator").mkdir()
    (tmp_path / "runtime" / "x.py").write_text(
        "def f():\n    from ..generator.render import render\n    import fusegemm.ops.loaded_kernel\n")
    (tmp_path / "generator" / "render.py").write_text("")
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "loaded_kernel.py").write_text("from ..runtime import x\n")
    graph = import_graph({tmp_path / "runtime": "fusegemm.runtime", tmp_path / "generator": "fusegemm.generator",
                          tmp_path / "ops": "fusegemm.ops"})
    assert graph["fusegemm.runtime.x"] == {"fusegemm.generator.render": 2, "fusegemm.ops.loaded_kernel": 3}
    assert upward(graph) == [
        "fusegemm.runtime.x (runtime):2 imports fusegemm.generator.render (generator)",
        "fusegemm.runtime.x (runtime):3 imports fusegemm.ops.loaded_kernel (ops)"]
    assert cycles(graph) == [["fusegemm.ops.loaded_kernel", "fusegemm.runtime.x"]]


def test_the_checker_sees_a_cycle_inside_a_layer(tmp_path):
    """A planted cycle of three modules of one layer, closed by a function-level import: no
    import goes up, and the cycle is still reported (once, with its edges)."""
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("import fusegemm.ops.c\n")
    (tmp_path / "c.py").write_text("def f():\n    from .a import thing\n")
    (tmp_path / "d.py").write_text("from .a import thing\n")          # imports the cycle: not in it
    graph = import_graph({tmp_path: "fusegemm.ops"})
    assert upward(graph) == []
    assert cycles(graph) == [["fusegemm.ops.a", "fusegemm.ops.b", "fusegemm.ops.c"]]
    assert _describe(cycles(graph)[0], graph) == ("fusegemm.ops.a:1 -> fusegemm.ops.b; fusegemm.ops.b:1 -> "
                                                  "fusegemm.ops.c; fusegemm.ops.c:2 -> fusegemm.ops.a")


def test_nothing_imports_the_package_root(tmp_path):
    """``import fusegemm`` (or ``from fusegemm import x`` for a lazy name) inside the package
    is an import of the root, the top layer: reported. ``from fusegemm import tune`` is an
    import of the module."""
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "m.py").write_text("def f():\n    import fusegemm\n    from fusegemm import tune, grouped_gemm\n")
    (tmp_path / "tune.py").write_text("")
    graph = import_graph({tmp_path: "fusegemm"})
    assert graph["fusegemm.m"] == {"fusegemm": 2, "fusegemm.tune": 3}


@pytest.mark.parametrize("modules,forbidden", [
    ("fusegemm.generator.render, fusegemm.generator.registry, fusegemm.generator.spec",
     ("fusegemm.runtime", "fusegemm.ops", "fusegemm.pipeline")),
    ("fusegemm.runtime.cache, fusegemm.runtime.launch, fusegemm.runtime.load, fusegemm.runtime.tensors",
     ("fusegemm.generator", "fusegemm.ops", "fusegemm.pipeline")),
    ("fusegemm.base.errors, fusegemm.base.dtypes, fusegemm.base.archs, fusegemm.base.contract, fusegemm.base.hooks",
     ("fusegemm.generator", "fusegemm.runtime", "fusegemm.ops", "fusegemm.verify", "fusegemm.tune", "numpy")),
    ("fusegemm.ops.loaded_kernel, fusegemm.presets",
     ("fusegemm.verify", "fusegemm.selftest", "fusegemm.tune", "fusegemm.cli")),
])
def test_each_layer_imports_alone(modules, forbidden):
    code = (f"import sys, {modules}\n"
            f"bad = sorted(m for m in sys.modules if m.startswith({forbidden!r}))\n"
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
