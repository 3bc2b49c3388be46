"""fusegemm as torch custom ops (``torch.ops.fusegemm.*``): traceable by ``torch.compile``
(fullgraph, no graph breaks) and capturable in CUDA graphs.

Importing this module registers the ops (``torch.library.custom_op``, namespace ``fusegemm``)
with a fake implementation each, which computes output shapes, dtypes and strides exactly as the
real op allocates them. The public wrappers (``fusegemm.grouped_gemm`` ...) stay plain Python
for eager use (their host fast path is cheaper than the dispatcher); inside a compiled region
call the functions here, which return tuples (a custom op's schema has no TupleDict):

    import fusegemm.torch_library as fg
    d, c = fg.grouped_gemm(a, padded_offsets, alpha, b)        # c is an empty tensor unless generate_c

Outputs are new tensors (no argument is mutated or aliased), so the ops are functional for
torch.compile. Rows at or past ``padded_offsets[-1]`` are left unwritten, exactly as in eager.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor

from . import presets as _presets
from . import reference as _reference
from .base.docstrings import shares_parameters
from .ops.param_docs import GPU


# ---------------------------------------------------------------- spec-driven ops (EpilogueGemm)
# One custom op for every spec of the grouped GEMM family, a user's YAML file included: the spec
# (name or path) and its variant choices travel as strings, the epilogue's inputs as their names
# (comma-joined: spec identifiers hold no commas) beside a list of tensors, and the outputs come
# back as a list in the epilogue's order.

_EPILOGUE_OPS: dict[tuple, object] = {}


def _epilogue_op(spec: str, axes: str, device: int):
    import json

    from .ops.epilogue_gemm import EpilogueGemm
    key = (spec, axes, device)
    op = _EPILOGUE_OPS.get(key)
    if op is None:
        choices = json.loads(axes)
        e5m2 = choices.pop("e5m2_rcp_max", "page")
        op = _EPILOGUE_OPS[key] = EpilogueGemm(spec, device=device, e5m2_rcp_max=e5m2, **choices)
    return op


def _epilogue_call(spec, axes, a, padded_offsets, b, b_ptrs, n, input_names, inputs, fake, row_ends=None, tail=True):
    import contextlib

    from .ops.prepared import dry_run
    names = input_names.split(",") if input_names else []
    if len(names) != len(inputs):
        raise ValueError(f"input_names: got {len(names)} names for {len(inputs)} tensors; allowed: one each")
    op = _epilogue_op(spec, axes, a.device.index or 0)
    with dry_run() if fake else contextlib.nullcontext():
        out = op(a, padded_offsets, b, b_ptrs=b_ptrs, n=n, row_ends=row_ends, inputs=dict(zip(names, inputs)),
                 tail=tail)
    return list(out.values())


@torch.library.custom_op("fusegemm::epilogue_gemm", mutates_args=())
def _epilogue_gemm(spec: str, axes: str, a: Tensor, padded_offsets: Tensor, b: Optional[Tensor],
                   b_ptrs: Optional[Tensor], n: Optional[int], input_names: str,
                   inputs: list[Tensor], row_ends: Optional[Tensor] = None, tail: bool = True) -> list[Tensor]:
    return _epilogue_call(spec, axes, a, padded_offsets, b, b_ptrs, n, input_names, inputs, False, row_ends, tail)


@_epilogue_gemm.register_fake
def _epilogue_gemm_fake(spec, axes, a, padded_offsets, b, b_ptrs, n, input_names, inputs, row_ends=None, tail=True):
    return _epilogue_call(spec, axes, a, padded_offsets, b, b_ptrs, n, input_names, inputs, True, row_ends, tail)


_PLANS: dict[tuple, tuple[str, tuple[str, ...]]] = {}


@torch.compiler.assume_constant_result
def _epilogue_plan(spec: str, axes: tuple, device: int) -> tuple[str, tuple[str, ...]]:
    """(variant choices as JSON, output names in order) of a spec op: constant for torch.compile
    (dynamo calls this once while tracing instead of tracing into the spec machinery), and kept
    per call pattern for eager calls (about 18 us of host time a call otherwise)."""
    key = (spec, axes, device)
    plan = _PLANS.get(key)
    if plan is None:
        import json
        axes_json = json.dumps(dict(axes), sort_keys=True)
        op = _epilogue_op(spec, axes_json, device)
        plan = _PLANS[key] = (axes_json, tuple(op.epilogue.buffers(256, 256, 1)))
    return plan


def epilogue_gemm(spec: str, a: Tensor, padded_offsets: Tensor, b: Optional[Tensor] = None, *,
                  b_ptrs: Optional[Tensor] = None, n: Optional[int] = None,
                  inputs: Optional[dict] = None, row_ends: Optional[Tensor] = None, tail: bool = True,
                  **axes) -> dict:
    """``torch.ops.fusegemm.epilogue_gemm``: ``fusegemm.EpilogueGemm(spec, **axes)(a, padded_offsets,
    b, inputs=inputs)`` as a custom op (traceable by ``torch.compile``). Returns the epilogue's
    outputs by name (FP8/FP4 outputs as raw bytes, SF buffers physical, as EpilogueGemm returns
    them).

    Parameters
    ----------
    spec : str or path
        A spec of the grouped-GEMM family: a packaged name (``"grouped_gemm_swiglu"``) or a YAML file.
    a : (M, K) or (M, K, 1) bfloat16
        Tokens grouped by expert, M a multiple of 256.
    padded_offsets : (L,) int32
        Each expert's end row, nondecreasing multiples of 256.
    b : (L, N, K) or (N, K, L) view, bfloat16, optional
        Dense weights, K-major; with ``b_major="n"`` N-major: the view ``w.transpose(1, 2)`` of (L, K, N) weights.
    b_ptrs : (L,) int64, optional
        Discrete weights: device addresses of each expert's (N, K) weights; needs ``n``.
    n : int, optional
        N of discrete weights.
    inputs : dict, optional
        The epilogue's inputs by spec name (tensors, or Python numbers for scalar inputs).
    row_ends : (L,) int32, optional
        Where each expert's tokens end inside its padded range (:attr:`fusegemm.routing.Routing.row_ends`):
        the rows after it must be zero in ``a``; their tiles are skipped and the outputs' rows
        there come back zero (``fusegemm.Op``'s ``row_ends``).
    tail : bool
        Zero the outputs' rows that no tile writes: those at or past the last offset and, with
        ``row_ends``, the skipped tiles' (``fusegemm.Op``'s ``tail``). False leaves them
        unwritten (one launch less) for a caller that reads none of them.
    **axes
        Variant choices (``d_dtype="float8_e4m3fn"``, tiles...), as for ``EpilogueGemm``.
    """
    axes_json, names = _epilogue_plan(str(spec), tuple(sorted(axes.items())), a.device.index or 0)
    given = dict(inputs or {})
    tensors = [v if isinstance(v, Tensor) else torch.full((1,), float(v), device=a.device) for v in given.values()]
    run = _epilogue_call if _eager(a, a, b, *tensors) else _epilogue_op_call
    return dict(zip(names, run(str(spec), axes_json, a, padded_offsets, b, b_ptrs, n, ",".join(given), tensors, False,
                               row_ends, tail)))


def _epilogue_op_call(spec, axes, a, padded_offsets, b, b_ptrs, n, input_names, inputs, fake, row_ends=None,
                      tail=True):
    return torch.ops.fusegemm.epilogue_gemm(spec, axes, a, padded_offsets, b, b_ptrs, n, input_names, inputs,
                                            row_ends, tail)


def _eager(lead: Any, *tensors: Any) -> bool:
    """Whether a face may call its engine directly instead of through its custom op: a plain CUDA
    lead tensor (not meta, not a fake, functional or other subclass), outside torch.compile, and no
    autograd to record (the op has no formula: through the dispatcher a tensor that needs one is
    refused). The dispatcher's custom-op path costs about 0.4 ms of host time a call on the H200
    machine; the op stays for tracing, where it is what torch.compile sees."""
    return (type(lead) is Tensor and lead.device.type == "cuda" and not torch.compiler.is_compiling()
            and _no_autograd(tensors))


def _no_autograd(tensors: tuple) -> bool:
    return not torch.is_grad_enabled() or not any(isinstance(t, Tensor) and t.requires_grad for t in tensors)


def _ordinal_of(lead: Tensor) -> int:
    return (lead.device.index or 0) if lead.device.type == "cuda" else 0


# ---------------------------------------------------------------- generated ops
# What register(spec) and the preset rows share: a schema from (name, type, default) parameters
# and one body that is the real op and, under dry_run(), its fake implementation.
_REQUIRED = object()   # a parameter without a default


def _schema_default(value: object) -> str:
    if value is None:
        return "None"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def _define(name: str, params: list[tuple[str, str, object]], n_out: int, body) -> None:
    """Register ``torch.ops.fusegemm.<name>``: ``body(args)`` (args in schema order) returns its
    ``n_out`` outputs; the fake implementation is the same body under ``dry_run()`` (validation
    and allocation on the fake tensors, no launch)."""
    from .ops.prepared import dry_run
    decl = [f"{t} {nm}" + ("" if d is _REQUIRED else f"={_schema_default(d)}") for nm, t, d in params]
    schema = f"({', '.join(decl)}) -> ({', '.join(['Tensor'] * n_out)})"

    def one(out: tuple) -> Any:
        return out[0] if n_out == 1 else out          # a one-output schema returns a Tensor

    def fake(*args: Any) -> Any:
        with dry_run():
            return one(body(args))
    op = torch.library.custom_op(f"fusegemm::{name}", lambda *args: one(body(args)), mutates_args=(), schema=schema)
    op.register_fake(fake)


# ---------------------------------------------------------------- any spec: register(spec)
# One custom op per registered spec and variant: the kernel class's operands (fusegemm.Op), then
# every input the spec's epilogue declares as an optional keyword tensor, returning the variant's
# outputs in a fixed order (its ``buffers``). The fake implementation runs the same Op under
# ``dry_run()`` on the fake tensors, so the traced shapes are the real op's allocations.



def _operand_schema(kind: str) -> tuple[tuple[str, str], ...]:
    """(name, schema type) of kernel class ``kind``'s operands (fusegemm/ops/engine.py): a tensor,
    an optional one where the operand defaults to None, and ``n`` / ``d_rows`` optional ints."""
    import inspect

    from .ops.engine import class_operands
    return tuple((p.name, "int?" if p.name in ("n", "d_rows") else "Tensor" if p.default is inspect.Parameter.empty
                  else "Tensor?") for p in class_operands(kind))


_REGISTERED: dict[str, "SpecOp"] = {}


class SpecOp:
    """The Python face of a registered spec op (made by :func:`register`): ``face(*operands,
    inputs={...})`` calls ``torch.ops.fusegemm.<name>`` (traceable by
    ``torch.compile(fullgraph=True)``) and returns the outputs by spec name (a dict). ``face.op``
    is the custom op; ``face.outputs`` its output names in order; ``face.operands`` and
    ``face.inputs`` its parameters.

    Parameters
    ----------
    name : str
        The op's name under ``torch.ops.fusegemm``.
    spec : Spec
        The registered spec.
    key : tuple
        What the registration serves (spec, axes, SFD convention): a second registration of the
        name must match it.
    operands : tuple of str
        The kernel class's operand names, in schema order.
    inputs : tuple of str
        The epilogue's input names, in schema order (after the operands).
    outputs : tuple of str
        The variant's output names, in the order the op returns them.
    axes : dict
        The variant choices.
    e5m2_rcp_max : str
        SFD convention of an e5m2 output.
    """

    def __init__(self, name: str, spec: object, key: tuple, operands: tuple, inputs: tuple, outputs: tuple,
                 axes: dict, e5m2_rcp_max: str) -> None:
        self.name, self.spec, self.key = name, spec, key
        self.operands, self.inputs, self.outputs = operands, inputs, outputs
        self._axes, self._e5m2 = axes, e5m2_rcp_max
        self._ops: dict[int, object] = {}

    @property
    def op(self):
        return getattr(torch.ops.fusegemm, self.name)

    def engine(self, device: int):
        """The :class:`fusegemm.Op` serving ``device`` (built once per device)."""
        from .ops.engine import Op
        op = self._ops.get(device)
        if op is None:
            op = self._ops[device] = Op(self.spec, device=device, e5m2_rcp_max=self._e5m2, **self._axes)
        return op

    def run(self, args: tuple) -> tuple[Tensor, ...]:
        """The custom op's body: ``args`` in schema order (operands, then inputs)."""
        k = len(self.operands)
        operands = dict(zip(self.operands, args[:k]))
        given = {nm: v for nm, v in zip(self.inputs, args[k:]) if v is not None}
        out = self.engine(_ordinal_of(args[0]))(**operands, inputs=given)
        return tuple(out[nm] for nm in self.outputs)

    def __call__(self, *operands: object, inputs: Optional[dict] = None, **kw: object) -> dict:
        """Run the op; the outputs by spec name.

        Parameters
        ----------
        *operands
            The kernel class's operands (``face.operands``), by position or keyword.
        inputs : dict, optional
            The epilogue's inputs by spec name: tensors, or Python numbers for scalar inputs.
        """
        given = dict(inputs or {})
        lead = operands[0] if operands else kw.get(self.operands[0])
        for nm, v in list(given.items()):
            if nm not in self.inputs:
                from .base.errors import ArgumentError
                raise ArgumentError(f"inputs[{nm!r}]", "given", f"the epilogue's inputs: {', '.join(self.inputs)}")
            if not isinstance(v, Tensor):   # a Python number for a scalar input
                given[nm] = torch.full((1,), float(v), dtype=torch.float32, device=lead.device)
        if _eager(lead, *operands, *kw.values(), *given.values()):
            out = self.engine(_ordinal_of(lead))(*operands, **kw,
                                                 inputs={k: v for k, v in given.items() if v is not None})
            return {nm: out[nm] for nm in self.outputs}
        out = self.op(*operands, **kw, **given)
        return dict(zip(self.outputs, (out,) if isinstance(out, Tensor) else out))


# register()'s calls by their arguments: a repeated call (fusegemm.moe's recipe steps register on
# every use) returns its face without reading and resolving the YAML again. H200, the fp8_block
# dsv3-8 step: six register() calls a step took about 0.3 ms of host time each under cProfile.
_BY_CALL: dict[tuple, "SpecOp"] = {}


def _call_key(spec: object, name: Optional[str], e5m2_rcp_max: str, axes: dict) -> Optional[tuple]:
    """register()'s arguments as a key, or None (a Spec object, or an axis value that does not
    hash). A string find_spec reads as a file is made absolute: from another directory the same
    string names another file."""
    if not isinstance(spec, (str, os.PathLike)):
        return None
    given = os.fspath(spec)
    if Path(given).suffix in (".yaml", ".yml") or os.path.lexists(given):
        given = os.path.abspath(given)
    key = (given, name, e5m2_rcp_max, tuple(sorted(axes.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def register(spec: object, *, name: Optional[str] = None, e5m2_rcp_max: str = "page", **axes: object) -> SpecOp:
    """Register ``torch.ops.fusegemm.<name>`` for any spec, a user's YAML path included, on its
    variant ``axes``; returns the op's Python face (:class:`SpecOp`).

    The op takes the spec's kernel-class operands (as :class:`fusegemm.Op` does: ``a_tensor,
    padded_offsets, b_tensor, b_ptrs, n`` for BF16 grouped specs, ``a_tensor, sfa_tensor,
    padded_offsets, b_tensor, sfb_tensor, b_ptrs, sfb_ptrs, n`` block-scaled, ``a_tensor, b_tensor,
    sfa_tensor, sfb_tensor`` batched, ``dy_tensor, x_tensor, padded_offsets`` K-grouped) and the
    epilogue's inputs as optional keyword tensors, and returns the variant's outputs as a tuple
    (``face.outputs`` names them). It is functional (outputs are new tensors) and has a fake
    implementation: ``torch.library.opcheck`` passes and ``torch.compile(fullgraph=True)`` traces it.

    Parameters
    ----------
    spec : str or path
        A packaged spec name or a YAML file.
    name : str, optional
        The op's name under ``torch.ops.fusegemm``; default the spec's ``name``. Registering the
        same name again with the same spec and axes returns the same face; with others, an
        ArgumentError (pass another ``name``).
    e5m2_rcp_max : {"page", "nvidia"}
        SFD convention of an e5m2 output.
    **axes
        Variant choices, as for :class:`fusegemm.Op`.
    """
    call = _call_key(spec, name, e5m2_rcp_max, axes)
    seen = _BY_CALL.get(call) if call is not None else None
    if seen is not None and _REGISTERED.get(seen.name) is seen:
        return seen
    face = _register(spec, name, e5m2_rcp_max, axes)
    if call is not None:
        _BY_CALL[call] = face
    return face


def _register(spec: object, name: Optional[str], e5m2_rcp_max: str, axes: dict) -> SpecOp:
    import re

    from .base.errors import ArgumentError
    from .generator.spec import Spec, find_spec
    from .ops.engine import Op, kernel_class
    s = spec if isinstance(spec, Spec) else find_spec(str(spec))
    op_name = name or s.name
    if not isinstance(op_name, str) or not re.fullmatch(r"[a-z_][a-z0-9_]*", op_name):
        raise ArgumentError("name", repr(op_name), "a lower-case identifier (the op's name under torch.ops.fusegemm)")
    # (a file by its absolute path: the same relative path from another directory is another spec)
    key = (os.path.abspath(s.path) if getattr(s, "path", None) else s.name, tuple(sorted(axes.items())), e5m2_rcp_max)
    known = _REGISTERED.get(op_name)
    if known is not None:
        if known.key == key:
            return known
        raise ArgumentError("name", repr(op_name), "a name not yet registered (torch.ops.fusegemm."
                            f"{op_name} serves {known.key[0]} with {dict(known.key[1])}); pass name=")
    if hasattr(torch.ops.fusegemm, op_name) and op_name not in _REGISTERED:
        raise ArgumentError("name", repr(op_name), "a name no fusegemm op has (a seed op is registered under it)")
    kind = kernel_class(s.kernel)
    operands = _operand_schema(kind)
    inputs = tuple(i.name for i in s.epilogue.inputs)
    clash = sorted(set(inputs) & {nm for nm, _ in operands})
    if clash:
        raise ArgumentError(f"spec {s.name} input {clash[0]!r}", "an operand's name", "input names other than "
                            f"{', '.join(nm for nm, _ in operands)}")
    # Output names depend on the variant, not the arch.
    outputs = tuple(Op.planned(s, e5m2_rcp_max=e5m2_rcp_max, **axes).epilogue.buffers(256, 256, 1))
    params = [(nm, t, None if t.endswith("?") else _REQUIRED) for nm, t in operands]
    params += [(nm, "Tensor?", None) for nm in inputs]
    face = SpecOp(op_name, s, key, tuple(nm for nm, _ in operands), inputs, outputs, dict(axes), e5m2_rcp_max)
    _define(op_name, params, len(outputs), face.run)
    _REGISTERED[op_name] = face
    return face


# ---------------------------------------------------------------- preset ops (fusegemm/presets.py)
# Each preset row is a custom op too, returning the row's outputs in its order (absent ones: empty
# uint8 tensors; a schema has no optional outputs). A row's ``torch`` spelling gives the schema (the
# seeds' ops: short names, no defaults) and a Python face here that takes the keyword parameters
# with the wrapper's defaults; without one the schema is the wrapper's parameters (the seed's
# names, less ``_tensor``; no current_stream: torch's; no caller-owned output such as dGLU's
# dprob_tensor: the op is functional and returns it new), with their defaults, and the op is its
# own face. The body is the preset's wrapper; the fake implementation runs it under ``dry_run()``.

_PRESET_TYPES = {"n": "int?", "linear_offset": "float?", "epilogue_op": "str?", "tanh_clamp_scale": "float?",
                 "mma_tiler_mn": "int[]?", "cluster_shape_mn": "int[]?", "b_major": "str"}
_ANNOTATIONS = {"Tensor": Tensor, "Tensor?": Optional[Tensor], "SymInt": int, "SymInt?": Optional[int],
                "ScalarType": torch.dtype, "bool": bool, "float?": Optional[float], "str": str}


def _spelled(row) -> list[tuple[str, str, str, bool, str]]:
    """(schema name, wrapper name, schema type, keyword-only, written default) of each parameter
    of a row's ``torch`` spelling."""
    wrapper, kw_only, out = row.signature().parameters, False, []
    for decl in row.torch.split(", "):
        if decl == "*":
            kw_only = True
            continue
        head, _, default = decl.partition("=")
        t, name = head.split(" ")
        out.append((name, name + "_tensor" if name + "_tensor" in wrapper else name, t, kw_only, default))
    return out


def _preset_params(row) -> list[tuple[str, str, str, object]]:
    """(schema name, seed name, schema type, default) of a preset row's parameters (default
    ``_REQUIRED`` where the schema has none)."""
    import inspect
    if row.torch:
        return [(name, seed, t, _REQUIRED) for name, seed, t, _, _ in _spelled(row)]
    out = []
    written = {param for _, param in row.into}    # functional op: those outputs come back new
    for p in row.signature().parameters.values():
        if p.name == "current_stream" or p.name in written:
            continue
        d = p.default
        if p.name.endswith(("_tensor", "_ptrs")) or p.name == "padded_offsets":
            t = "Tensor" if d is inspect.Parameter.empty else "Tensor?"
            d = _REQUIRED if d is inspect.Parameter.empty else d
        elif p.name.endswith("_dtype"):
            t, d = "ScalarType?", None                     # None: the preset's default
        elif p.name in _PRESET_TYPES:
            t = _PRESET_TYPES[p.name]
        else:
            t = {bool: "bool", int: "int", float: "float", str: "str"}[type(d)]
        out.append((p.name.removesuffix("_tensor"), p.name, t, d))
    return out


def _face(row):
    """The Python face of a spelled preset op: the parameters before ``*`` by position (required
    unless the spelling gives a default), the rest by keyword with the wrapper's defaults (dtype
    names as torch dtypes); calls ``torch.ops.fusegemm.<name>`` and returns its tuple."""
    import ast
    import inspect

    from .ops.faces import binder
    wrapper, params = row.signature().parameters, []
    for name, seed, t, kw_only, written in _spelled(row):
        if kw_only:
            d = wrapper[seed].default
            d = getattr(torch, d) if t == "ScalarType" else d
        else:
            d = ast.literal_eval(written) if written else inspect.Parameter.empty
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY if kw_only else
                                        inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d, annotation=_ANNOTATIONS[t]))
    sig = inspect.Signature(params, return_annotation=tuple[Tensor, ...])
    names, bind, packet = tuple(sig.parameters), binder(sig, row.name), getattr(torch.ops.fusegemm, row.name)

    def face(*args: Any, **kwargs: Any) -> tuple[Tensor, ...]:
        b = bind(args, kwargs)
        return packet(*[b[n] for n in names])
    face.__name__ = face.__qualname__ = row.name
    face.__module__ = __name__
    face.__signature__ = sig   # type: ignore[attr-defined]
    outs = ", ".join(name.removesuffix("_tensor") for name, _ in row.returns)
    face.__doc__ = (f"``torch.ops.fusegemm.{row.name}``: ``fusegemm.{row.name}`` as a custom op. Returns ``({outs})`` "
                    "as the wrapper does (absent ones: empty tensors).")
    rename = {name: seed for name, seed, _, _, _ in _spelled(row)}
    return shares_parameters(getattr(_reference, row.reference), rename=rename, extra=GPU)(face)


def _register_preset(row) -> None:
    params = _preset_params(row)
    wrapper = getattr(_presets, row.name)

    def run(args: tuple) -> tuple[Tensor, ...]:
        kwargs: dict = {param: None for _, param in row.into}   # returned new, not written into
        for (name, seed, t, _), value in zip(params, args):
            if value is None and t == "ScalarType?":
                continue                                   # the preset's default dtype
            kwargs[seed] = tuple(value) if isinstance(value, list) else value
        out = wrapper(**kwargs)
        lead = args[0]

        def absent(spec_out: str | None) -> Tensor:      # in its dtype where a parameter names one
            dtype = kwargs.get(f"{spec_out}_dtype")
            return lead.new_empty((0,), dtype=dtype if isinstance(dtype, torch.dtype) else torch.uint8)
        return tuple(out[k] if out[k] is not None else absent(spec_out) for k, spec_out in row.returns)

    _define(row.name, [(name, t, d) for name, _, t, d in params], len(row.returns), run)
    globals()[row.name] = _face(row) if row.torch else getattr(torch.ops.fusegemm, row.name)


def _register_presets() -> None:
    for row in _presets.PRESETS + _presets.SEEDS:
        _register_preset(row)


_register_presets()
# The seeds' outputs, in the order their ops return them.
SRELU_OUT, QUANT_OUT, DSWIGLU_OUT, AMAX_OUT = (tuple(name for name, _ in _presets.BY_NAME[op].returns) for op in (
    "grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu", "gemm_amax"))


# ---------------------------------------------------------------- gradients
# torch.ops.fusegemm.grouped_gemm is differentiable, as torch._grouped_mm is: the data gradient
# runs the same grouped GEMM on the weights read transposed, the weight gradient the K-grouped
# family (a reduction over each expert's rows), the small ones (alpha, prob, bias) torch
# reductions per expert segment (deterministic: no atomics).

# The weight gradients' kernels: "auto" (the default) runs fusegemm's K-grouped kernel where
# _kgrouped_fits, else torch._grouped_mm; "torch" and "fusegemm" force one. H200, same run
# (bench/results/wgrad_h200.json), fusegemm against torch._grouped_mm on bench/wgrad.py's ten
# rows: 0.98-1.09x (dsv3's fc2 weight gradient the only one below 1), and the MoE MLP step with
# each: 7.14 / 7.33 ms, 7.79 / 8.04 ms and 28.18 / 28.91 ms (dsv3-8, dsv3-32, mixtral;
# bench/results/moe_mlp_h200_bf16.json).
WGRAD_KERNELS = ("auto", "torch", "fusegemm")


def device_ordinal(device: torch.device) -> int:
    """The CUDA ordinal of ``device`` ("cuda" without an index: the current device).

    Parameters
    ----------
    device : torch.device
        A CUDA device.
    """
    return device.index if device.index is not None else torch.cuda.current_device()


# The host lookups a traced backward makes are constants for torch.compile (dynamo calls them
# once instead of tracing them). An lru_cache may sit inside one, not around it: dynamo traces
# into an lru_cache wrapper.
_B_MAJOR: dict[int, str] = {}


@torch.compiler.assume_constant_result
def _kgrouped_fits(n: int, k: int, m: int, index: int) -> bool:
    """:func:`fusegemm.ops.kgrouped.wgrad_fits` on device ``index``'s arch (both cached)."""
    from .ops.device import device_arch
    from .ops.kgrouped import wgrad_fits
    return wgrad_fits(n, k, m, device_arch(index))


def grouped_wgrad(dy: Tensor, x: Tensor, padded_offsets: Tensor, kernel: str = "auto",
                  row_ends: Optional[Tensor] = None) -> Tensor:
    """(L, N, K): ``dW_e = dy_e^T x_e`` over each expert's rows of ``dy`` (M, N) and ``x`` (M, K),
    bfloat16, accumulated in FP32, with no host copy of the offsets: fusegemm's K-grouped kernel
    (``torch.ops.fusegemm.grouped_gemm_wgrad``, FP32 result) or ``torch._grouped_mm`` (``kernel``;
    see :data:`WGRAD_KERNELS`); traceable by ``torch.compile``.

    Parameters
    ----------
    dy : (M, N) bfloat16 tensor
        The output gradient's rows, grouped by expert (M a multiple of 256 for the fusegemm kernel).
    x : (M, K) bfloat16 tensor
        The forward's input rows.
    padded_offsets : (L,) int32 tensor
        Each expert's end row.
    kernel : {"auto", "torch", "fusegemm"}
        Which kernel; ``auto`` runs fusegemm's where the device's arch has run it and N is whole
        tiles of it, else torch's.
    row_ends : (L,) int32 tensor, optional
        Where each expert's tokens end (the rows after it zero in both operands): fusegemm's
        kernel stops each expert's reduction at the k-block of its last token; torch's reads
        every row.
    """
    if kernel not in WGRAD_KERNELS:
        raise ValueError(f"kernel: got {kernel!r}; allowed: {', '.join(WGRAD_KERNELS)}")
    if kernel == "fusegemm" or (kernel == "auto" and _kgrouped_fits(dy.shape[1], x.shape[1], dy.shape[0],
                                                                     device_ordinal(dy.device))):
        # Token-major rows (the MXFP8 recipe's dequantized operands are transposed views).
        return _WGRAD(dy.contiguous(), x.contiguous(), padded_offsets, row_ends=row_ends)["d"]
    return torch._grouped_mm(dy.t(), x, offs=padded_offsets)


def weight_as_b(w: Tensor) -> tuple[Tensor, str]:
    """A data gradient's weight (L, K, N) as the grouped GEMM's B (L, N, K) and its ``b_major``:
    the view itself where the device's kernel reads N-major B (the registry's row: sm_90a and
    sm_100a today), else a K-major copy.

    Parameters
    ----------
    w : (L, K, N) tensor
        The weights as the forward reads them (its B), whose data gradient contracts over K.
    """
    if _b_major(device_ordinal(w.device)) == "n":
        return w.transpose(1, 2), "n"
    return w.transpose(1, 2).contiguous(), "k"


@torch.compiler.assume_constant_result
def _b_major(index: int) -> str:
    """"n" when device ``index``'s arch implements N-major B for the grouped family, else "k"."""
    if index not in _B_MAJOR:
        from .generator import registry
        from .ops.device import device_arch
        row = registry.lookup("grouped_gemm", device_arch(index))
        _B_MAJOR[index] = "n" if row is not None and row.problem({"b_major": "n"}) is None else "k"
    return _B_MAJOR[index]


def _dgrad(u: Tensor, offsets: Tensor, w: Tensor, alpha: Tensor) -> Tensor:
    """(M, K): ``alpha_e * u_m @ w_e`` for u (M, N) and w (L, N, K)."""
    b, major = weight_as_b(w)
    return epilogue_gemm("grouped_gemm", u, offsets, b, inputs={"alpha": alpha}, b_major=major)["d"]


def _products(a: Tensor, offsets: Tensor, w: Tensor) -> Tensor:
    """(M, N) float32: ``a_m @ w_e^T`` (the GEMM before alpha, prob and bias)."""
    ones = torch.ones(w.shape[0], device=a.device)
    return epilogue_gemm("grouped_gemm", a, offsets, w, inputs={"alpha": ones}, d_dtype="float32")["d"]


def _segment_sum(x: Tensor, offsets: Tensor) -> Tensor:
    """(L, ...): the sum of ``x``'s rows over each expert's range (rows past the last dropped)."""
    ends = offsets.to(torch.int64)
    lengths = ends.diff(prepend=ends.new_zeros(1), append=ends.new_full((1,), x.shape[0]))
    return torch.segment_reduce(x, "sum", lengths=lengths, axis=0)[:-1]


def _grouped_gemm_context(ctx, inputs: tuple, output: tuple) -> None:
    from .arguments import b_is_canonical
    a, offsets, alpha, b, bias, b_ptrs, n, prob, *_ = inputs
    ctx.save_for_backward(a, offsets, alpha, b, bias, prob)
    ctx.discrete = b is None
    # B as the op read it: (L, N, K) canonical or the seed's (N, K, L) view (arguments.dense_b).
    ctx.canonical = b is not None and bool(b_is_canonical(b.shape, b.stride(), a.shape[1], alpha.shape[0]))


def _grouped_gemm_backward(ctx, grad_d: Optional[Tensor], grad_c: Optional[Tensor]) -> tuple:
    """Gradients of ``(d, c)`` (seed 001: ``G = alpha_e A B_e^T``; with bias ``C = G + p bias_e``,
    ``D = C``; without, ``C = G``, ``D = p G``) in a, alpha, b, bias and prob. Everything flows
    through ``U``, the gradient at G divided by alpha: ``dA = alpha_e U B_e``,
    ``dB_e = alpha_e U_e^T A_e`` (both GEMMs read U in A's dtype), ``dalpha_e = sum U_e . S_e``
    (S = A B^T, recomputed only when alpha or, without bias, prob needs a gradient)."""
    a, offsets, alpha, b, bias, prob = ctx.saved_tensors
    need = dict(zip(("a", "alpha", "b", "bias", "prob"), (ctx.needs_input_grad[i] for i in (0, 2, 3, 4, 7))))
    if ctx.discrete and any(need.values()):
        from .base.errors import UnsupportedError
        raise UnsupportedError("b_ptrs: the gradient of grouped_gemm with discrete weights (device addresses carry "
                               "no tensor to differentiate, read transposed or recompute with); pass the weights as b")
    m, l, acc = a.shape[0], alpha.shape[0], torch.promote_types(a.dtype, torch.float32)
    w = b if ctx.canonical else b.permute(2, 0, 1)             # (L, N, K), as stored
    zero = a.new_zeros((m, w.shape[1]), dtype=acc)
    gd = zero if grad_d is None or grad_d.numel() == 0 else grad_d.reshape(m, -1).to(acc)
    gc = zero if grad_c is None or grad_c.numel() == 0 else grad_c.reshape(m, -1).to(acc)
    p = a.new_ones((m, 1), dtype=acc) if prob is None else prob.reshape(m, 1).to(acc)
    u = gd + gc if bias is not None else p * gd + gc           # the gradient at alpha_e * S
    a2 = a.reshape(m, -1)
    ua = u.to(a.dtype)
    grads = dict.fromkeys(need)
    if need["a"]:
        grads["a"] = _dgrad(ua, offsets, w, alpha.float()).to(a.dtype).view_as(a)
    if need["b"]:
        dw = grouped_wgrad(ua, a2, offsets).to(acc) * alpha.to(acc)[:, None, None]
        grads["b"] = dw.to(b.dtype) if ctx.canonical else dw.to(b.dtype).permute(1, 2, 0)
    s = _products(a2, offsets, w) if need["alpha"] or (need["prob"] and bias is None) else None
    if need["alpha"]:
        grads["alpha"] = _segment_sum((u * s).sum(1), offsets).to(alpha.dtype)
    if need["bias"]:
        grads["bias"] = _segment_sum(p * u, offsets).to(bias.dtype).t()
    if need["prob"]:
        # Each row's expert (L past the last one), for its alpha or bias row.
        rows = torch.searchsorted(offsets, torch.arange(m, device=a.device, dtype=offsets.dtype), right=True)
        if bias is None:
            alpha_row = torch.cat((alpha.to(acc), alpha.new_zeros(1, dtype=acc)))[rows][:, None]
            dp = alpha_row * (gd * s).sum(1, keepdim=True)
        else:
            per_row = torch.cat((bias.t().to(acc), bias.new_zeros((1, bias.shape[0]), dtype=acc)))[rows]
            dp = (u * per_row).sum(1, keepdim=True)
        grads["prob"] = torch.where(rows[:, None] < l, dp, 0.0).to(prob.dtype).view_as(prob)
    return (grads["a"], None, grads["alpha"], grads["b"], grads["bias"], None, None, grads["prob"]) + (None,) * 4


torch.library.register_autograd("fusegemm::grouped_gemm", _grouped_gemm_backward,
                                setup_context=_grouped_gemm_context)
# The weight gradient's op exists before any backward is traced (torch.compile cannot define an op
# while it traces one).
_WGRAD = register("grouped_gemm_wgrad")
