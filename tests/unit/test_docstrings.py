"""Every public name has a docstring, and every parameter of every public callable is in its
numpydoc ``Parameters`` section (classes: the class docstring documents ``__init__``).
Parameter sections shared between spellings of an op come from fusegemm/base/docstrings.py."""
from __future__ import annotations

import importlib
import inspect

import pytest

from fusegemm.base.docstrings import parameter_docs, shares_parameters

MODULES = ["fusegemm", "fusegemm.formats", "fusegemm.reference", "fusegemm.moe", "fusegemm.torch_library",
           "fusegemm.jax_ffi", "fusegemm.expert_parallel", "fusegemm.formats.torch_mx", "fusegemm.tune",
           "fusegemm.tuning_records", "fusegemm.heuristic"]
METHODS = ("execute", "__call__", "reference", "compile", "check_support", "forward", "batched")


def _public(module: str) -> list[tuple[str, object]]:
    if module in ("fusegemm.moe", "fusegemm.torch_library", "fusegemm.expert_parallel", "fusegemm.formats.torch_mx"):
        pytest.importorskip("torch")
    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None) or [
        n for n in dir(mod) if not n.startswith("_") and getattr(getattr(mod, n), "__module__", None) == module
        and (inspect.isfunction(getattr(mod, n)) or inspect.isclass(getattr(mod, n)))]
    return [(f"{module}.{n}", getattr(mod, n)) for n in names if n != "__version__"]


def _undocumented(fn, doc: str, skip=("self", "ctx", "cls")) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    have = {**parameter_docs(doc), **parameter_docs(doc, "Attributes")}   # dataclasses: their fields
    return [p.name for p in sig.parameters.values()
            if p.name not in skip and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in have]


def _cases():
    out = []
    for module in MODULES:
        for name, obj in _public(module):
            if inspect.isclass(obj):
                out.append((name, obj, obj.__init__ if "__init__" in obj.__dict__ else None))
                for m in METHODS:
                    if m in obj.__dict__ and callable(obj.__dict__[m]):
                        out.append((f"{name}.{m}", obj.__dict__[m], obj.__dict__[m]))
            elif callable(obj):
                out.append((name, obj, obj))
    return out


@pytest.mark.parametrize("name,obj,fn", _cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_public_names_are_documented(name, obj, fn):
    doc = inspect.getdoc(obj)
    assert doc, f"{name} has no docstring"
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return
    if fn is not None:
        missing = _undocumented(fn, doc if fn is not obj or not inspect.isclass(obj) else doc)
        assert not missing, f"{name}: parameters without an entry in its Parameters section: {missing}"


def test_shared_parameters_follow_the_source_and_the_overrides():
    def source(a, b, c):
        """Source.

        Parameters
        ----------
        a, b : (M, K)
            Operands.
        c : int
        """

    @shares_parameters(source, rename={"x": "a"}, extra={"c": "bool\nOverridden."})
    def target(x, b, c, d=None):
        """Target.

        More text.
        """
    docs = parameter_docs(target.__doc__)
    assert docs == {"x": "(M, K)\nOperands.", "b": "(M, K)\nOperands.", "c": "bool\nOverridden."}
    assert target.__doc__.startswith("Target.\n\nMore text.\n\nParameters\n----------\nx : (M, K)")
