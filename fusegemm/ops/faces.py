"""The faces of a preset row (fusegemm/presets.py), generated: the wrapper (its signature, docs
and the engine call), the class API (samples and options -> ``check_support() -> compile() ->
execute()``) and the argument binding they share. Every call resolves the row's axes
(fusegemm/ops/hows.py) and runs the op of ``scaled_seeds._op``; outputs come back in the seed's
layout (``scaled_seeds.shape_out``).
"""
from __future__ import annotations

import ast
import inspect
import sys
from typing import Any, Callable

from ..runtime.tensors import view
from ..tupledict import TupleDict
from . import arg_checks as checks
from . import scaled_seeds as _seeds
from .hows import resolve
from .prepared import is_dry
from .scaled_layouts import check_layouts, discrete_weights


def parse_params(text: str) -> inspect.Signature:
    """A signature from Python parameter syntax (names and literal defaults only: a row is data,
    nothing in it runs)."""
    a = ast.parse(f"def f({text}): pass").body[0].args
    empty = inspect.Parameter.empty

    def make(arg: ast.arg, d: ast.expr | None, kind: Any) -> inspect.Parameter:
        return inspect.Parameter(arg.arg, kind, default=empty if d is None else ast.literal_eval(d))
    pos = [None] * (len(a.args) - len(a.defaults)) + list(a.defaults)
    return inspect.Signature([make(x, d, inspect.Parameter.POSITIONAL_OR_KEYWORD) for x, d in zip(a.args, pos)] + [
        make(x, d, inspect.Parameter.KEYWORD_ONLY) for x, d in zip(a.kwonlyargs, a.kw_defaults)])


def call(row: Any, bound: dict[str, Any], key: tuple | None = None) -> TupleDict:
    """Run ``row``'s op on its wrapper's bound arguments (its block-scaled backend's, ``row.scaled``,
    when ``sfa_tensor`` is given); the outputs in the row's return order.

    Host fast path: what the arguments' dtypes, shapes, strides, devices and option values decide
    (the row, the variant's axes, the op, the gated outputs) is resolved once per such pattern
    (``key``, :func:`pattern` of the call as written); a later call of the pattern goes straight
    to the op, whose own memo then checks what the addresses decide (fusegemm/ops/engine.py)."""
    hit = _RESOLVED.get(key) if key is not None else None
    if hit is None:
        hit = _resolve(row, bound)
        if key is not None:
            if len(_RESOLVED) >= 512:
                _RESOLVED.clear()
            _RESOLVED[key] = hit
    row, op, shown = hit
    out = op(**{k: bound[p] for k, p in row.operands},
             inputs={i: bound[p] for i, p in row.inputs if bound[p] is not None},
             input_names=row.input_names, current_stream=bound.get("current_stream", bound.get("stream")))
    shaped = _seeds.shape_out(out, op, view(bound["a_tensor"], "a_tensor"), bound.get("sfa_tensor"))
    for spec_out, param in row.into:
        given = bound.get(param)
        if given is not None and spec_out in shaped:
            given.copy_(shaped[spec_out].view_as(given))   # the caller zero-initialised it, as cuDNN asks
            shaped[spec_out] = given
    for spec_out in row.unsqueezed:
        if shaped.get(spec_out) is not None:
            shaped[spec_out] = shaped[spec_out].unsqueeze(-1)
    return TupleDict(**{name: shaped.get(spec_out) if spec_out and shown.get(spec_out, True) else None
                        for name, spec_out in row.returns})


def _resolve(row: Any, bound: dict[str, Any]) -> tuple[Any, Any, dict[str, bool]]:
    """(the row that runs, its op, the gated outputs shown): every argument checked."""
    if row.scaled is not None and bound.get("sfa_tensor") is not None:
        row = row.scaled
    axes = resolve(row, bound)
    shown = {spec_out: checks.bool_arg(bound[param], param) for spec_out, param in row.gates}
    op = _seeds._op(row.spec, bound["a_tensor"], bound.get("e5m2_rcp_max", "page"), axes)
    if row.kind != "grouped":
        _seeds.check_layouts_once(op)
    return row, op, shown


# (row, op factory, validation arch, each argument's pattern) -> what _resolve found for it.
_RESOLVED: dict[tuple, tuple] = {}
_STREAMS = ("current_stream", "stream")    # where to launch decides nothing about the op


def pattern(row: Any, args: tuple, kwargs: dict[str, Any]) -> tuple | None:
    """The key of a wrapper call's resolution, from the call as written (a parameter left out is
    its default, the same every call): how many arguments by position and which by keyword, and
    each one's (dtype, shape, strides, device) for a plain torch tensor, (type, value) for None, a
    number, a string, a torch dtype or a tuple of ints; None (no memo) for anything else (numpy
    arrays, tensor subclasses, fake tensors while tracing). ``_seeds._op`` and
    ``VALIDATION_ARCH`` are part of it: they decide the op (tests stand in for them)."""
    if is_dry():
        return None
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if not _PLAIN:
        _PLAIN.update((int, float, str, bool, type(None), torch.dtype))
    tensor, plain = torch.Tensor, _PLAIN
    key: list[Any] = [id(row), _seeds._op, _seeds.VALIDATION_ARCH, len(args)]
    for name, x in (*enumerate(args), *kwargs.items()):
        if name in _STREAMS:
            continue
        t = type(x)
        if t is tensor:
            key.append((name, x.dtype, x.shape, x.stride(), x.get_device()))
        elif t in plain or (t is tuple and all(type(v) is int for v in x)):
            key.append((name, t, x))
        else:
            return None
    return tuple(key)


_PLAIN: set[type] = set()   # the argument types keyed by value (filled on first use: torch.dtype)


def binder(sig: inspect.Signature, name: str) -> Callable[[tuple, dict], dict[str, Any]]:
    """``bind(args, kwargs)``: every parameter of a call of ``sig`` by name, defaults filled in, at
    the cost of a dict merge (a call that does not fit ``sig`` raises its TypeError, named
    ``name()``)."""
    names = tuple(sig.parameters)
    npos = sum(p.kind is p.POSITIONAL_OR_KEYWORD for p in sig.parameters.values())
    defaults = {k: p.default for k, p in sig.parameters.items() if p.default is not p.empty}
    required = tuple(n for n in names if n not in defaults)

    # Plain loops and dict merges: torch.compile traces a custom op's Python face through this.
    def bind(args: tuple, kwargs: dict) -> dict[str, Any]:
        if args:
            b = {**defaults, **dict(zip(names, args)), **kwargs}
            if len(args) > npos:
                _refuse(args, kwargs)
            for n in names[:len(args)]:
                if n in kwargs:
                    _refuse(args, kwargs)
        else:
            b = {**defaults, **kwargs}
        if len(b) != len(names):              # a stray keyword, or a required one missing (below)
            _refuse(args, kwargs)
        for n in required:
            if n not in b:
                _refuse(args, kwargs)
        return b

    def _refuse(args: tuple, kwargs: dict) -> None:
        try:
            sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{name}(): {exc}") from None
    return bind


def _doc(row: Any) -> str:
    outs = ", ".join(name for name, _ in row.returns)
    return (f"{row.summary}\n\nGenerated from the preset row of spec ``{row.spec}`` (cuDNN: ``{row.cudnn}``). Returns "
            f"``TupleDict({outs})``; outputs this op does not produce are None.")


def wrapper(row: Any, module: str) -> Callable[..., TupleDict]:
    """The seed-style function of ``row`` (an attribute of ``module``): its signature, docs and the
    engine call."""
    from ..base.docstrings import shares_parameters
    from .param_docs import GPU
    from ..runtime.interop import dlpack_io
    sig = row.signature()
    bind = binder(sig, row.name)

    def run(*args: Any, **kwargs: Any) -> TupleDict:
        return call(row, bind(args, kwargs), pattern(row, args, kwargs))
    run.__name__ = run.__qualname__ = row.name
    run.__module__ = module
    run.__signature__ = sig   # type: ignore[attr-defined]
    if row.reference:         # the numpy reference documents every parameter
        from .. import reference
        run.__doc__ = _doc(row) + f" Arguments as :func:`fusegemm.reference.{row.reference}`."
        shares_parameters(getattr(reference, row.reference), extra=GPU)(run)
    else:
        run.__doc__ = (_doc(row) + "\n\nParameters\n----------\n"
                       + "\n".join(f"{p}\n    {_param_doc(row, p)}" for p in sig.parameters))
    return dlpack_io(run)


def _param_doc(row: Any, param: str) -> str:
    """What a parameter does in this op, from the row."""
    generic = {"mma_tiler_mn": "(int, int), optional: the MMA tile; default the arch kernel's.",
               "cluster_shape_mn": "(int, int), optional: the cluster; default the arch kernel's.",
               "current_stream": "Where to launch; default torch's current stream.",
               "b_dtype": "dtype of discrete weights (bfloat16)."}
    if param in generic:
        return generic[param]
    for i, p in row.inputs:
        if p == param:
            return f"The epilogue's input ``{i}`` (``fusegemm show {row.spec}``)."
    for o, p in row.operands:
        if p == param:
            return f"The ``{o}`` operand (:class:`fusegemm.Op`)."
    for axis, how, p in row.axes:
        if p == param and axis is not None:
            return f"Chooses the ``{axis}`` axis ({how})."
    for p, allowed, why in row.fixed:
        if p == param:
            return f"Only {allowed!r} here: {why}."
    if row.scaled is not None and param == "sfa_tensor":
        return (f"A's scale factors: with them the block-scaled backend runs (spec ``{row.scaled.spec}``; its "
                "operands, scales and D quantization as the block-scaled seeds take them).")
    for spec_out, p in row.into:
        if p == param:
            return f"Optional zero-initialised output: ``{spec_out}`` is written into it."
    return "As in the cuDNN frontend wrapper."


class _SeedClass:
    """What every generated class API does: ``check_support() -> compile() -> execute()`` on the
    op its constructor's samples and options chose (``op``), writing into the caller's outputs."""

    ROW: Any
    op: Any
    _laid_out = False            # check_layouts(op) passed (execute runs it until it does)

    def _build(self, b: dict[str, Any]) -> None:
        row = self.ROW
        self._discrete = (discrete_weights(b["sample_a"], b["sample_b"], b["sample_sfb"], b["sample_padded_offsets"],
                                           b["num_experts"], b["b_shape"]) if "num_experts" in b else None)
        bound = {k: p.default for k, p in row.signature().parameters.items()}   # the wrapper's defaults
        names: dict[str, str] = {}
        wrapper_params = set(bound)
        for key, value in b.items():
            if not key.startswith("sample_"):
                if key in wrapper_params:
                    bound[key] = value                      # an option: the wrapper's parameter of its name
                continue
            base = key.removeprefix("sample_")
            target = next((t for t in (base + "_tensor", base) if t in wrapper_params), None)
            if target is not None:                          # a sample of an input or operand
                bound[target], names[target] = value, key
        for param, sample, what in row.samples:             # samples of outputs: their dtype, C's order
            if what == "major":
                bound[param] = bound[param] if b[sample] is None else _seeds.c_major_of(b[sample])
            else:
                bound[param] = bound[param] if b[sample] is None else view(b[sample], sample).dtype
                names[param] = f"{sample}.dtype"
        self.op = _seeds._op(row.spec, b["sample_a"], bound.get("e5m2_rcp_max", "page"), resolve(row, bound, names))

    def check_support(self) -> bool:
        """True when this device's kernel implements the configuration; UnsupportedError says
        why not (an MN-major operand this arch or fusegemm's host path lacks included)."""
        check_layouts(self.op)
        return self.op.check_support()

    def compile(self) -> "_SeedClass":
        """Compile (or fetch from the cache) and load the kernel; returns self."""
        self.op.compile()
        return self


def seed_class(row: Any, module: str) -> type:
    """The class API of ``row`` (its ``cls``, ``init``, ``execute`` and ``samples``), an attribute of
    ``module``."""
    from .. import reference
    from .param_docs import OUTPUTS, class_api
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    init_sig, exec_sig = parse_params(row.init), parse_params(row.execute)
    bind_init, bind_exec = binder(init_sig, row.cls), binder(exec_sig, f"{row.cls}.execute")

    def __init__(self: _SeedClass, *args: Any, **kwargs: Any) -> None:
        self._build(bind_init(args, kwargs))

    execute = _executor(row, exec_sig, bind_exec)
    for fn, sig in ((__init__, init_sig), (execute, exec_sig)):
        fn.__signature__ = sig.replace(parameters=[this, *sig.parameters.values()])  # type: ignore[attr-defined]
        fn.__qualname__, fn.__module__ = f"{row.cls}.{fn.__name__}", module
    title = row.summary.partition("\n")[0]
    doc = (f"The class API of :func:`fusegemm.{row.name}` (cuDNN: ``{row.cls}Sm100``), generated from its preset "
           "row. The ``sample_*`` tensors (their dtypes and layouts) and the options choose the variant; "
           "``execute`` takes every input and the caller's outputs, shaped as the wrapper returns them, and "
           f"writes into them (reductions reset first).\n\n{title}")
    cls = type(row.cls, (_SeedClass,), {"ROW": row, "__init__": __init__, "execute": execute, "__doc__": doc,
                                       "__module__": module, "__qualname__": row.cls})
    return class_api(getattr(reference, row.reference), OUTPUTS[row.name])(cls)


def _getter(keys: tuple[str, ...]) -> Callable[[dict], tuple]:
    """``get(b)``: the values of ``keys`` in ``b``, as a tuple."""
    from operator import itemgetter
    return itemgetter(*keys) if len(keys) > 1 else lambda b: tuple(b[k] for k in keys)


def _executor(row: Any, sig: inspect.Signature, bind: Callable[[tuple, dict], dict]) -> Callable[..., None]:
    """The class's ``execute``: its arguments by name, then the engine's ``execute`` with the row's
    operands (by position, the discrete weights' pointers by keyword), inputs and outputs. The
    lookups are done here once: the call is the class's host fast path. The seed's output views
    (amax (L, 1, 1), SF views, (M, N, 1) rows) are the engine's too."""
    from .engine import positional_operands
    operands = [(k, p) for k, p in row.operands if p in sig.parameters]     # the ones execute takes
    in_keys, in_get = tuple(i for i, _ in row.inputs), _getter(tuple(p for _, p in row.inputs))
    out_keys, out_get = tuple(row.output_names), _getter(tuple(row.output_names.values()))
    input_names, output_names = row.input_names, row.output_names
    split: list = []                  # (positional getter, keyword names): the kernel class's, on first use

    def execute(self: _SeedClass, *args: Any, **kwargs: Any) -> None:
        """Run once into the given outputs (those the configuration writes are required; an op
        built for discrete weights takes ``b_ptrs`` and ``sfb_ptrs``)."""
        b = bind(args, kwargs)
        if self._discrete is not None:                      # N from b_shape
            b["n"] = self._discrete.n_for(b["n"], b["padded_offsets"])
        if not self._laid_out:                              # the op's layouts: refused or not, for good
            check_layouts(self.op)
            self._laid_out = True
        if row.kind == "batched":
            return _seeds.execute_batched(self.op, b["a_tensor"], b["b_tensor"], b["sfa_tensor"], b["sfb_tensor"],
                                          b["c_tensor"], b["amax_tensor"], b["current_stream"])
        if not split:                                       # the kernel class's leading operands by position
            given, positional = dict(operands), []
            for k in positional_operands(row.kind):
                if k not in given:
                    break
                positional.append(given.pop(k))
            split.extend((_getter(tuple(positional)), tuple(given.items())))
        self.op.execute(*split[0](b), **{k: b[p] for k, p in split[1]},
                        inputs={i: x for i, x in zip(in_keys, in_get(b)) if x is not None},
                        outputs=dict(zip(out_keys, out_get(b))), current_stream=b["current_stream"],
                        input_names=input_names, output_names=output_names)
    return execute
