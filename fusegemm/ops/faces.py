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
from operator import itemgetter
from typing import Any, Callable

from .. import tuning_records
from ..base.errors import UnsupportedError
from ..runtime.tensors import view
from ..tupledict import TupleDict
from . import arg_checks as checks
from . import scaled_seeds as _seeds
from .hows import resolve
from .prepared import flat_signature, is_dry
from .prepared import pattern as engine_pattern
from .scaled_layouts import check_layouts, discrete_weights, kernel_choices


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


def call(row: Any, bound: dict[str, Any], key: tuple | None = None, hit: tuple | None = None) -> TupleDict:
    """Run ``row``'s op on its wrapper's bound arguments (its block-scaled backend's, ``row.scaled``,
    when ``sfa_tensor`` is given); the outputs in the row's return order.

    Host fast path: what the arguments' dtypes, shapes, strides, devices and option values decide
    (the row, the variant's axes, the op, the gated outputs) is resolved once per such pattern
    (``key``, :func:`pattern` of the call as written); a later call of the pattern goes straight
    to the op, whose own memo then checks what the addresses decide (fusegemm/ops/engine.py)."""
    if hit is None and key is not None:
        hit = _RESOLVED.get(key)
    if hit is None:
        hit = _resolve(row, bound)
        if key is not None:
            if len(_RESOLVED) >= 512:
                _RESOLVED.clear()
            _RESOLVED[key] = hit
    row, op, shown, flat2d, fast = hit
    stream = bound.get("current_stream", bound.get("stream"))
    out = None
    if fast[0] is not None:   # the engine's memo entry of this pattern: allocate, check addresses, launch
        e, picks = fast[0]
        out = op._call_memo(e, tuple([bound[p] for p in picks]), stream, bound.get("validate_offsets"), row.tail,
                            shaped=False)
    if out is None:
        kw = {k: bound[p] for k, p in row.operands}
        inputs = {i: bound[p] for i, p in row.inputs if bound[p] is not None}
        out = op(**kw, inputs=inputs, input_names=row.input_names, current_stream=stream, **row.launch_options(bound))
        if key is not None and fast[0] is None and not is_dry():
            e = op._memo.get(engine_pattern((), kw, inputs, None)[0])
            if e is not None:    # the arguments in the engine's order: operands, then the inputs given
                fast[0] = (e, tuple(p for _, p in row.operands) + tuple(p for i, p in row.inputs if i in inputs))
    shaped = _seeds.shape_out(out, op, bound["a_tensor"], bound.get("sfa_tensor"), flat2d)
    for spec_out, param in row.into:
        given = bound.get(param)
        if given is not None and spec_out in shaped:
            given.copy_(shaped[spec_out].view_as(given))   # the caller zero-initialised it, as cuDNN asks
            shaped[spec_out] = given
    for spec_out in row.unsqueezed:
        if shaped.get(spec_out) is not None:
            shaped[spec_out] = shaped[spec_out].unsqueeze(-1)
    return TupleDict.of(**{name: shaped.get(spec_out) if spec_out and shown.get(spec_out, True) else None
                           for name, spec_out in row.returns})


def _resolve(row: Any, bound: dict[str, Any]) -> tuple[Any, Any, dict[str, bool], bool, list]:
    """(the row that runs, its op, the gated outputs shown, whether A is 2-D, a cell for the
    engine's memo entry of the call pattern and the pattern's launcher): every argument checked."""
    if row.scaled is not None and bound.get("sfa_tensor") is not None:
        row = row.scaled
    axes = resolve(row, bound)
    a = view(bound["a_tensor"], "a_tensor")
    if row.tune and not is_dry() and a.is_cuda \
            and not {"tile_m", "cluster_m"} & set(axes) and axes.get("scheduler") == "static":
        # No configuration named: the tuned one (a fake trace sizes outputs: any tile does).
        from .tuned import tuned_axes
        axes.update(tuned_axes(row.spec, bound, axes))
    shown = {spec_out: checks.bool_arg(bound[param], param) for spec_out, param in row.gates}
    op = _make_op(row, bound["a_tensor"], bound.get("e5m2_rcp_max", "page"), axes, bound)
    if row.kind != "grouped":
        _seeds.check_layouts_once(op)
    return row, op, shown, a.ndim == 2, [None, None]


def _make_op(row: Any, a_tensor: Any, e5m2_rcp_max: str, axes: dict[str, Any], given: dict[str, Any],
             arch: str | None = None) -> Any:
    """The op of ``axes`` (``_seeds._op``), its inputs routed (:func:`_routed`). A ``strict`` row
    checks the arch's limits before the spec's surface (they say what is implemented and why)
    and leads a refusal with the argument that chose a tile or cluster (``given``: the call's)."""
    if not row.strict:
        op = _seeds._op(row.spec, a_tensor, e5m2_rcp_max, axes)
        _routed(row, op)
        return op
    from ..generator import registry
    from ..generator.spec import find_spec
    from ..generator.variants import default_choice
    spec, full = find_spec(row.spec), axes
    arch = arch or _seeds.device_arch_of(a_tensor)
    try:
        full = {**default_choice(spec, arch), **axes}
        registry.resolve(spec.kernel, arch, kernel_choices(registry.kernel_class(spec.kernel), full))
        op = _seeds._op(row.spec, a_tensor, e5m2_rcp_max, axes, arch=arch)
        _routed(row, op)
    except UnsupportedError as exc:
        raise UnsupportedError(_named(row, given, full, exc), axis=exc.axis) from None
    return op


def _named(row: Any, given: dict[str, Any], axes: dict[str, Any], exc: Exception) -> str:
    """``exc``'s message, led by the argument that chose its axis where that is a pair (a tile or
    cluster: ``mma_tiler_mn=(256, 256): tile_m=256 is not implemented ...``)."""
    for axis, _, param in row.axes:
        if axis and "," in axis and getattr(exc, "axis", None) in axis.split(","):
            value = given.get(param) or tuple(axes.get(a) for a in axis.split(","))
            return f"{param}={tuple(value)}: {exc}"
    return str(exc)


def _routed(row: Any, op: Any) -> None:
    """Every input the row passes is one the op's spec declares: a spec edited to rename or drop
    one is refused before any launch (the engine routes each input through the slot its spec
    gives it, so a declared one always lands in the right field)."""
    declared = {i.name for i in op.spec.epilogue.inputs}
    for name, param in row.inputs:
        if name not in declared:
            raise UnsupportedError(f"spec {row.spec}: the seed's {param} has no epilogue input {name!r} (inputs: "
                                   f"{', '.join(sorted(declared))})")


# (row, op factory, validation arch, each argument's pattern) -> what _resolve found for it.
_RESOLVED: dict[tuple, tuple] = {}
# A tuning record written later (a tuning run in this process) changes what a call of a ``tune``
# row resolves to: the memoised calls re-resolve.
tuning_records.on_change("faces", lambda: _RESOLVED.clear())
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
    tensor, param = torch.Tensor, torch.nn.Parameter   # (a Parameter adds no behaviour: keyed as a tensor)
    # Comprehensions, not a loop of appends: this runs on every call (positions are implied by
    # the count of positional arguments, keywords are named).
    try:
        return (id(row), _seeds._op, _seeds.VALIDATION_ARCH, len(args),
                *[(x.dtype, x.shape, x.stride(), x.get_device()) if type(x) is tensor or type(x) is param
                  else _value(x) for x in args],
                *[(k, x.dtype, x.shape, x.stride(), x.get_device()) if type(x) is tensor or type(x) is param
                  else (k, _value(x)) for k, x in kwargs.items() if k not in _STREAMS])
    except _NotPlain:
        return None


_PLAIN: set[type] = set()   # the argument types keyed by value (filled on first use: torch.dtype)


class _NotPlain(Exception):
    """An argument :func:`pattern` does not key by value (an array, a subclass, a stream)."""


def _value(x: Any) -> tuple:
    t = type(x)
    if t in _PLAIN or (t is tuple and all(type(v) is int for v in x)):
        return (t, x)
    raise _NotPlain


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

    def checked(*args: Any, **kwargs: Any) -> TupleDict:
        return call(row, bind(args, kwargs), pattern(row, args, kwargs))
    checked.__signature__ = sig   # type: ignore[attr-defined]
    slow = dlpack_io(checked)

    def run(*args: Any, **kwargs: Any) -> TupleDict:
        key = pattern(row, args, kwargs)
        if key is None:          # a foreign or host array, a fake tensor: the DLPack-aware path
            return slow(*args, **kwargs)
        hit = _RESOLVED.get(key)
        if hit is None or hit[4][0] is None:
            return call(row, bind(args, kwargs), key, hit)
        # Resolved and launched before (the key fixes which arguments come by position and which
        # by keyword): the launch's values are picked without binding.
        go = hit[4][1]
        if go is None:
            go = hit[4][1] = _launcher(sig, hit, len(args), tuple(kwargs))
        out = go(args, kwargs)
        return out if out is not None else call(row, bind(args, kwargs), key, hit)
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
    # The checked path is the wrapper's own function, named as the wrapper (docs tools follow
    # ``__wrapped__`` to a public name).
    checked.__doc__, run.__wrapped__ = run.__doc__, checked   # type: ignore[attr-defined]
    checked.__name__ = checked.__qualname__ = row.name
    checked.__module__ = module
    return run


def _launcher(sig: inspect.Signature, hit: tuple, nargs: int, kwnames: tuple[str, ...]) -> Callable[..., Any]:
    """``go(args, kwargs)``: a resolved wrapper call of one pattern (``hit``) run from its
    arguments as passed: the engine's memoised launch, then the outputs in the row's return
    order; None where an address fails its check (the caller takes the checked path). Outputs
    the seed reshapes or writes into a caller's tensor go through :func:`call` instead."""
    row, op, shown, flat2d, fast = hit
    e, picks = fast[0]
    if row.into or row.unsqueezed or not (flat2d and _seeds._AS_IS.get(op)):
        pick = _picker(sig, row, nargs, kwnames)
        return lambda args, kwargs: call(row, pick(args, kwargs), None, hit)
    stream = next((p for p in ("current_stream", "stream") if p in sig.parameters), None)
    take, n, tail = _taker(sig, nargs, kwnames, (*picks, stream, "validate_offsets")), len(picks), row.tail
    rets = tuple((name, o if o and shown.get(o, True) else None) for name, o in row.returns)
    names_out, outs = tuple(name for name, _ in rets), tuple(o for _, o in rets)

    def go(args: tuple, kwargs: dict) -> TupleDict | None:
        v = take(args, kwargs)
        out = op._call_memo(e, v[:n], v[n], v[n + 1], tail, shaped=False)
        if out is None:
            return None
        r = TupleDict.__new__(TupleDict)      # (TupleDict.of without the keyword call)
        dict.update(r, zip(names_out, map(out.get, outs)))
        return r
    return go


def _picker(sig: inspect.Signature, row: Any, nargs: int, kwnames: tuple[str, ...]) -> Callable[[tuple, dict], dict]:
    """``pick(args, kwargs)``: the arguments a resolved call of ``row`` reads (operands, inputs,
    outputs written into, A and its scales, the stream), by name, for calls passing ``nargs``
    positional arguments and the keywords ``kwnames`` (a call that binds, since it resolved)."""
    wanted = {p for _, p in (*row.operands, *row.inputs, *row.into)}
    wanted = tuple(wanted | {"a_tensor", "sfa_tensor", "current_stream", "stream", "validate_offsets"}
                   & set(sig.parameters))
    take = _taker(sig, nargs, kwnames, wanted)
    return lambda args, kwargs: dict(zip(wanted, take(args, kwargs)))


def _taker(sig: inspect.Signature, nargs: int, kwnames: tuple[str, ...],
           params: tuple[str, ...]) -> Callable[[tuple, dict], tuple]:
    """``take(args, kwargs)``: the values of ``params``, in order, in calls of ``sig`` that pass
    ``nargs`` arguments by position and the keywords ``kwnames`` in that order (a parameter the
    call leaves out: its default; a name ``sig`` lacks: None). One itemgetter over the call's
    values: no binding runs."""
    names = tuple(sig.parameters)
    idx, consts = [], []
    for p in params:
        if p in names and names.index(p) < nargs:
            idx.append(names.index(p))
        elif p in kwnames:
            idx.append(nargs + kwnames.index(p))
        else:
            idx.append(nargs + len(kwnames) + len(consts))
            consts.append(sig.parameters[p].default if p in names else None)
    get, fixed = itemgetter(*idx), tuple(consts)
    if len(idx) == 1:
        return lambda args, kwargs: (get((*args, *kwargs.values(), *fixed)),)
    return lambda args, kwargs: get((*args, *kwargs.values(), *fixed))


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

    _unsupported: Exception | None = None   # strict: why the configuration cannot be built
    _n: int | None = None                   # strict: N of the samples

    def _build(self, b: dict[str, Any]) -> None:
        row = self.ROW
        self._fast: dict[Any, tuple] = {}   # execute's call pattern -> the engine's memo entry, argument picks
        self._discrete = (discrete_weights(b["sample_a"], b["sample_b"], b.get("sample_sfb"),
                                           b["sample_padded_offsets"], b["num_experts"], b["b_shape"])
                          if "num_experts" in b else None)
        bound = {k: p.default for k, p in row.signature().parameters.items()}   # the wrapper's defaults
        names: dict[str, str] = {}
        wrapper_params = set(bound)
        for key, value in b.items():
            if not key.startswith("sample_"):
                if key in wrapper_params and value is not None:
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
                if b[sample] is not None:
                    bound[param], names[param] = view(b[sample], sample).dtype, f"{sample}.dtype"
        axes = resolve(row, bound, names)
        if not row.strict:
            self.op = _make_op(row, b["sample_a"], bound.get("e5m2_rcp_max", "page"), axes, bound)
            return
        self._given = bound
        try:
            self.op = _make_op(row, b["sample_a"], "page", axes, bound, arch=b["arch"])
        except UnsupportedError as exc:   # reported by check_support, as for a kernel's limits
            self._unsupported, self.op = exc, None
            return
        self._check_samples(b)

    def _check_samples(self, b: dict[str, Any]) -> None:
        """The samples of a grouped BF16 class as ``execute`` will check its arguments: operands,
        inputs, output samples (shapes and layouts), then devices."""
        from .grouped_operands import parse_call
        row, op, disc = self.ROW, self.op, self._discrete
        call = parse_call(b["sample_a"], b["sample_padded_offsets"], None, b["sample_b"], None, None, None,
                          ab_dtypes=("bfloat16",), bias_dtypes=(), n=disc.n if disc else None,
                          b_major=op.variant.b_major, b_majors=(op.variant.b_major,), alpha_required=False,
                          discrete_experts=disc.experts if disc else None, devices=False)
        self._n = call.n                  # an execute call's N (pointers carry none)
        deferred: list = []
        given = {i: b.get("sample_" + i) for i, _ in row.inputs if b.get("sample_" + i) is not None}
        op._inputs(given, call, deferred, row.input_names, dict(row.align))
        names = {o: f"sample_{o}" for o in row.output_names}
        out = op.check_outputs(call, {o: b.get("sample_" + o) for o in row.output_names}, names, required=False)
        op._check_devices(call, deferred + op._aligns(out, names))

    def tile_of(self, axes: str) -> tuple[int, int]:
        """The (tile or cluster) pair of ``axes`` ("tile_m,tile_n") this op builds."""
        c = self.op.variant.choices
        return tuple(c[a] for a in axes.split(","))  # type: ignore[return-value]

    @property
    def tile(self) -> tuple[int, int]:
        """The MMA tile (M, N) of the kernel this op builds."""
        return self.tile_of("tile_m,tile_n")

    @property
    def cluster(self) -> tuple[int, int]:
        """The cluster (M, N) of the kernel this op builds."""
        return self.tile_of("cluster_m,cluster_n")

    def support_problem(self) -> str | None:
        """Why this configuration cannot run, or None (:meth:`check_support` without raising)."""
        try:
            self.check_support()
        except UnsupportedError as exc:
            return str(exc)
        return None

    def check_support(self) -> bool:
        """True when this device's kernel implements the configuration; UnsupportedError says
        why not (an MN-major operand no K-major copy serves included: discrete N-major weights)."""
        if self._unsupported is not None:
            raise self._unsupported
        check_layouts(self.op)
        if not self.ROW.strict:
            return self.op.check_support()
        try:
            return self.op.check_support()
        except UnsupportedError as exc:
            raise UnsupportedError(_named(self.ROW, self._given, self.op.variant.choices, exc), axis=exc.axis) from None

    def compile(self) -> "_SeedClass":
        """Compile (or fetch from the cache) and load the kernel; returns self."""
        self.check_support()
        self.op.compile(tail=self.ROW.tail)
        return self

    def _variant(self) -> Any:
        return self.op.variant

    @property
    def _launcher(self) -> Any:
        """The loaded kernel (its contract, grid and cluster), or None before compile()."""
        return self.op._launcher


def seed_class(row: Any, module: str) -> type:
    """The class API of ``row`` (its ``cls``, ``init``, ``execute`` and ``samples``), an attribute of
    ``module``."""
    from .. import reference
    from .param_docs import OUTPUTS, class_api
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    init_sig, exec_sig = parse_params(row.init), parse_params(row.execute)
    bind_init = binder(init_sig, row.cls)

    def __init__(self: _SeedClass, *args: Any, **kwargs: Any) -> None:
        self._build(bind_init(args, kwargs))

    execute = _executor(row, exec_sig)
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


def _executor(row: Any, sig: inspect.Signature) -> Callable[..., None]:
    """The class's ``execute``: its arguments by name, then the engine's ``execute`` with the row's
    operands (by position, the discrete weights' pointers by keyword), inputs and outputs. The
    lookups are done here once: the call is the class's host fast path. The seed's output views
    (amax (L, 1, 1), SF views, (M, N, 1) rows) are the engine's too.

    The function has the row's signature as written (Python binds its arguments: no binding
    code runs per call); a call pattern run before goes from its arguments straight to the
    engine's memoised launch (``_fast``: the pattern's signature -> the engine entry)."""
    from .engine import positional_operands
    # The ones execute takes (a discrete op's n: from its b_shape).
    operands = [(k, p) for k, p in row.operands if p in sig.parameters or p == "n"]
    launch = {"align": dict(row.align)} if row.align else {}
    in_keys, in_get = tuple(i for i, _ in row.inputs), _getter(tuple(p for _, p in row.inputs))
    out_keys, out_get = tuple(row.output_names), _getter(tuple(row.output_names.values()))
    input_names, output_names = row.input_names, row.output_names
    names = tuple(sig.parameters)
    split: list = []     # (positional getter, keyword operands, the engine-order parameters): on first use
    state: list = []     # [``flat`` from the arguments in signature order]: after the first launch

    def full(self: _SeedClass, vals: tuple) -> None:
        b = dict(zip(names, vals))
        if self._discrete is not None:                      # N from b_shape
            b["n"] = self._discrete.n_for(b.get("n"), b["padded_offsets"])
        elif b.get("n") is None and self._n is not None and b.get("b_ptrs") is not None:
            b["n"] = self._n                                # N of the samples (b_ptrs given to a dense op)
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
                positional.append(given.pop(k))     # the rest: operand keyword -> execute's parameter
            order = (*positional, *given.values(), *(p for _, p in row.inputs), *row.output_names.values())
            split.extend((_getter(tuple(positional)), given, order))
        pos, kwv, ins, outs = split[0](b), tuple([b.get(p) for p in split[1].values()]), in_get(b), out_get(b)
        flat = (*pos, *kwv, *ins, *outs)
        key = flat_signature(flat)
        hit = self._fast.get(key) if key is not None else None
        if hit is not None and self.op._execute_memo(hit[0], hit[1](flat), b["current_stream"],
                                                     b.get("validate_offsets")):
            return                                          # a pattern run before: its addresses checked
        kw, outputs = dict(zip(split[1], kwv)), dict(zip(out_keys, outs))
        inputs = {i: x for i, x in zip(in_keys, ins) if x is not None}
        self.op.execute(*pos, **kw, inputs=inputs, outputs=outputs, current_stream=b["current_stream"],
                        input_names=input_names, output_names=output_names, **launch,
                        **({"validate_offsets": b["validate_offsets"]} if "validate_offsets" in b else {}))
        e = self.op._memo.get(engine_pattern(pos, kw, inputs, outputs)[0]) if key is not None else None
        if e is not None:      # where the engine's arguments lie in ``flat`` (the inputs given only)
            lead, n_in = len(pos) + len(kwv), len(ins)
            picks = (*range(lead), *(lead + j for j, x in enumerate(ins) if x is not None),
                     *range(lead + n_in, lead + n_in + len(outs)))
            if len(self._fast) >= 64:
                self._fast.clear()
            self._fast[key] = (e, itemgetter(*picks))
            if not state and (b.get("n") is None or "n" in names):   # (a parameter absent: None)
                state.append(itemgetter(*(names.index(p) if p in names else len(names) for p in split[2])))

    # The signature as Python source: the names are identifiers parsed from the row (ast), the
    # defaults are passed as values (never written into the source).
    ns: dict[str, Any] = {"_state": state, "_sig": flat_signature, "_full": full}
    params, star = [], False
    if any(n.startswith("_") or n == "self" for n in names):   # the generated body's own names
        raise ValueError(f"{row.cls}.execute: parameter names may not start with '_' or be 'self': {names}")
    for i, p in enumerate(sig.parameters.values()):
        if p.kind is p.KEYWORD_ONLY and not star:
            params.append("*")
            star = True
        if p.default is p.empty:
            params.append(p.name)
        else:
            ns[f"_d{i}"] = p.default
            params.append(f"{p.name}=_d{i}")
    stream = "current_stream" if "current_stream" in names else "None"
    validate = "validate_offsets" if "validate_offsets" in names else "None"
    src = (f"def execute(self, {', '.join(params)}):\n"
           f"    _v = ({', '.join(names)}, None)\n"
           f"    if _state and self._discrete is None:\n"
           f"        _f = _state[0](_v)\n"
           f"        _h = self._fast.get(_sig(_f))\n"
           f"        if _h is not None and self.op._execute_memo(_h[0], _h[1](_f), {stream}, {validate}):\n"
           f"            return\n"
           f"    return _full(self, _v)\n")
    exec(compile(src, f"<{row.cls}.execute>", "exec"), ns)
    execute = ns["execute"]
    execute.__doc__ = ("Run once into the given outputs (those the configuration writes are required; an op built "
                       "for discrete weights takes ``b_ptrs`` and ``sfb_ptrs``).")
    return execute
