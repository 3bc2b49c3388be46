"""fusegemm inside ``jax.jit``: XLA FFI targets implemented as ctypes callbacks.

For an FFI custom call XLA calls a C function with a *call frame*: the argument and result
buffers (dtype, address, dims), the attributes, and an execution context from which the CUDA
stream is read. ``ctypes.CFUNCTYPE`` turns a Python function into such a C function pointer,
so no host compiler is needed (NVIDIA Warp registers its JAX kernels the same way). The
structures below follow XLA's FFI C API (``xla/ffi/api/c_api.h``; append-only, so the fields
read here stay where they are).

    import fusegemm.jax_ffi as fj

    @jax.jit
    def f(a, offsets, alpha, b):
        return fj.grouped_gemm(a, offsets, alpha, b)        # D (M, N) bfloat16

What runs in the callback: the result buffers XLA allocated become the op's outputs, the
engine (:class:`fusegemm.Op` of the call's spec and variant, cached) validates the buffers and
launches on XLA's stream; one target serves every spec, seed 001's included. The callback
holds the GIL while it runs (host work of one cached ``execute()`` plus the decoding); XLA
releases the GIL while it executes, as for any JAX call. A failure becomes an XLA error
carrying fusegemm's message, never a crash. Buffers are dense row-major (XLA's default
layout): A ``(M, K)``, B ``(L, N, K)``, outputs ``(M, N)``.
Registering the targets needs JAX with a CUDA backend; importing this module does not.
"""
from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

from . import reference as _reference
from .base.docstrings import shares_parameters
from .base.errors import ArgumentError, UnsupportedError
from .ops.param_docs import TORCH_NAMES

# ---------------------------------------------------------------- the FFI C API (ctypes)

_P = ctypes.c_void_p
_I64P = ctypes.POINTER(ctypes.c_int64)
_METADATA = 1          # XLA_FFI_Extension_Type: the handler is asked for its API version/traits
_EXECUTE = 3           # XLA_FFI_ExecutionStage
_INVALID_ARGUMENT, _INTERNAL = 3, 13
_ATTR_SCALAR, _ATTR_STRING = 3, 4
# XLA_FFI_DataType -> fusegemm dtype name (the ones the ops take)
DTYPES = {1: "bool", 4: "int32", 5: "int64", 6: "uint8", 10: "float16", 11: "float32", 16: "bfloat16",
          19: "float8_e5m2", 20: "float8_e4m3fn", 33: "float8_e8m0fnu"}


class _Ext(ctypes.Structure):
    pass


_Ext._fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int), ("next", ctypes.POINTER(_Ext))]


def _head() -> list:
    return [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.POINTER(_Ext))]


class _Buffer(ctypes.Structure):
    _fields_ = _head() + [("dtype", ctypes.c_int), ("data", _P), ("rank", ctypes.c_int64), ("dims", _I64P)]


class _List(ctypes.Structure):       # XLA_FFI_Args and XLA_FFI_Rets have this layout
    _fields_ = _head() + [("size", ctypes.c_int64), ("types", ctypes.POINTER(ctypes.c_int)),
                          ("items", ctypes.POINTER(_P))]


class _Span(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Scalar(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("value", _P)]


class _Attrs(ctypes.Structure):
    _fields_ = _head() + [("size", ctypes.c_int64), ("types", ctypes.POINTER(ctypes.c_int)),
                          ("names", ctypes.POINTER(ctypes.POINTER(_Span))), ("attrs", ctypes.POINTER(_P))]


class _Version(ctypes.Structure):
    _fields_ = _head() + [("major", ctypes.c_int), ("minor", ctypes.c_int)]


class _Metadata(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", _Version), ("traits", ctypes.c_uint32)]


class _MetadataExt(ctypes.Structure):
    _fields_ = [("base", _Ext), ("metadata", ctypes.POINTER(_Metadata))]


class _ErrorArgs(ctypes.Structure):
    _fields_ = _head() + [("message", ctypes.c_char_p), ("errc", ctypes.c_int)]


class _StreamArgs(ctypes.Structure):
    _fields_ = _head() + [("ctx", _P), ("stream", _P)]


_ErrorCreate = ctypes.CFUNCTYPE(_P, ctypes.POINTER(_ErrorArgs))
_StreamGet = ctypes.CFUNCTYPE(_P, ctypes.POINTER(_StreamArgs))


class _Api(ctypes.Structure):
    # Only the entries used here are typed; the rest keep their places as pointers.
    _fields_ = _head() + [("api_version", _Version), ("internal_api", _P), ("error_create", _ErrorCreate),
                          ("error_get_message", _P), ("error_destroy", _P), ("handler_register", _P),
                          ("stream_get", _StreamGet)]


class _CallFrame(ctypes.Structure):
    _fields_ = _head() + [("api", ctypes.POINTER(_Api)), ("ctx", _P), ("stage", ctypes.c_int),
                          ("args", _List), ("rets", _List), ("attrs", _Attrs), ("future", _P)]


_Handler = ctypes.CFUNCTYPE(_P, ctypes.POINTER(_CallFrame))

# ---------------------------------------------------------------- decoding


def _views(items: _List, what: str) -> list:
    """The buffers of an argument or result list as TensorViews (dense row-major)."""
    from .runtime.tensors import TensorView, dense_strides, pointer_device
    out, device = [], None
    for i in range(items.size):
        b = ctypes.cast(items.items[i], ctypes.POINTER(_Buffer)).contents
        name = DTYPES.get(b.dtype)
        if name is None:
            raise ArgumentError(f"{what}[{i}].dtype", f"XLA type {b.dtype}", ", ".join(DTYPES.values()))
        shape = tuple(int(b.dims[d]) for d in range(b.rank))
        ptr = int(b.data or 0)
        if device is None and ptr:
            device = pointer_device(ptr)
        out.append(TensorView(ptr, shape, dense_strides(shape), name,
                              ("cuda", device if device is not None else 0), None))
    return out


def _attrs(attrs: _Attrs) -> dict[str, Any]:
    """Scalar (bool/int) and string attributes by name."""
    out: dict[str, Any] = {}
    for i in range(attrs.size):
        span = attrs.names[i].contents
        name = ctypes.string_at(span.ptr, span.len).decode()
        if attrs.types[i] == _ATTR_STRING:
            s = ctypes.cast(attrs.attrs[i], ctypes.POINTER(_Span)).contents
            out[name] = ctypes.string_at(s.ptr, s.len).decode()
        elif attrs.types[i] == _ATTR_SCALAR:
            sc = ctypes.cast(attrs.attrs[i], ctypes.POINTER(_Scalar)).contents
            kind = DTYPES.get(sc.dtype)
            ctype = {"bool": ctypes.c_bool, "int32": ctypes.c_int32, "int64": ctypes.c_int64}.get(kind)
            if ctype is None:
                raise ArgumentError(f"attribute {name}", f"XLA scalar type {sc.dtype}", "bool, int32, int64")
            out[name] = ctypes.cast(sc.value, ctypes.POINTER(ctype)).contents.value
    return out


def _error(frame: _CallFrame, code: int, message: str) -> int:
    args = _ErrorArgs(ctypes.sizeof(_ErrorArgs), None, message.encode("utf-8", "replace")[:4000], code)
    return frame.api.contents.error_create(ctypes.byref(args))


def _stream(frame: _CallFrame) -> int:
    args = _StreamArgs(ctypes.sizeof(_StreamArgs), None, frame.ctx, None)
    err = frame.api.contents.stream_get(ctypes.byref(args))
    if err:
        raise RuntimeError("XLA_FFI_Stream_Get failed")
    return int(args.stream or 0)


def _handler(run):
    """A C handler around ``run(args, rets, attrs, stream)``: answers XLA's metadata query,
    acts in the execute stage only, and turns every exception into an FFI error."""
    def handle(frame_ptr):
        frame = frame_ptr.contents
        try:
            ext = frame.extension_start
            if ext and ext.contents.type == _METADATA:
                md = ctypes.cast(ext, ctypes.POINTER(_MetadataExt)).contents.metadata.contents
                md.api_version.major, md.api_version.minor = 0, 1
                md.traits = 0          # not command-buffer safe: per-call host work (addresses)
                return None
            if frame.stage != _EXECUTE:
                return None
            run(_views(frame.args, "args"), _views(frame.rets, "rets"), _attrs(frame.attrs), _stream(frame))
            return None
        except ArgumentError as exc:
            return _error(frame, _INVALID_ARGUMENT, f"fusegemm: {exc}")
        except Exception as exc:   # noqa: BLE001 -- never unwind through XLA's C frames
            return _error(frame, _INTERNAL, f"fusegemm: {type(exc).__name__}: {exc}")
    return _Handler(handle)


_ops_lock = threading.Lock()


_registered: dict[str, Any] = {}   # target name -> the C handler (kept alive: XLA holds its address)


def register() -> None:
    """Register fusegemm's FFI targets with JAX's CUDA backend (idempotent)."""
    if _registered:
        return
    import jax
    for name, run in (("fusegemm_spec", _run_spec),):
        fn = _handler(run)
        capsule = jax.ffi.pycapsule(ctypes.cast(fn, ctypes.c_void_p).value)
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
        _registered[name] = fn


@shares_parameters(_reference.grouped_gemm, rename=TORCH_NAMES, extra={
    "a": "(M, K) bfloat16\nTokens grouped by expert (row-major), M a multiple of 256.",
    "b": "(L, N, K) bfloat16\nDense weights, K-major (row-major per expert).",
    "bias": "(L, N), optional\nOne row per expert: the seed's (N, L) N-contiguous view of the same memory.",
    "d_dtype": "jnp dtype, optional\nbfloat16 (default), float16 or float32.",
    "c_dtype": "jnp dtype, optional\nbfloat16 (default), float16 or float32 (with ``generate_c``)."})
def grouped_gemm(a: Any, padded_offsets: Any, alpha: Any, b: Any, *, prob: Any = None, bias: Any = None,
                 d_dtype: Any = None, c_dtype: Any = None, generate_c: bool = False) -> Any:
    """Seed 001's grouped GEMM as a JAX operation (usable inside ``jax.jit``, differentiable).

    ``a`` (M, K) bfloat16, ``padded_offsets`` (L,) int32, ``alpha`` (L,) float32, ``b`` (L, N, K)
    bfloat16, ``prob`` (M,) float32, ``bias`` (L, N) (one row per expert; the seed's (N, L) view of
    the same memory). Returns D (M, N) (``d_dtype``, default bfloat16), or ``(D, C)`` with
    ``generate_c``. Rows at or past ``padded_offsets[-1]`` are unspecified (XLA's buffers).

    ``jax.grad`` and ``jax.vjp`` reach a, alpha, b, prob and bias (a ``jax.custom_vjp``): the data
    gradient runs this op on the transposed weights, the weight gradient fusegemm's K-grouped
    kernel where it fits (N whole tiles of it, K a multiple of 8, on an arch where it has run),
    else one masked XLA matmul per expert (L times the GEMM's work); alpha, prob and bias by
    per-expert segment sums. Cotangents of rows past the last expert are ignored.
    """
    import jax.numpy as jnp
    axes = (("bias_dtype", jnp.dtype(bias.dtype).name if bias is not None else "none"),
            ("c_dtype", jnp.dtype(c_dtype or jnp.bfloat16).name), ("d_dtype", jnp.dtype(d_dtype or jnp.bfloat16).name),
            ("generate_c", bool(generate_c)))
    return _differentiable(axes)(a, padded_offsets, alpha, b, prob, bias)


@functools.lru_cache(maxsize=64)
def _seed_op(axes: tuple) -> Any:
    """Seed 001's spec as a JAX operation of these variant axes (the one FFI target of every spec)."""
    return spec_op("grouped_gemm", **dict(axes))


@functools.lru_cache(maxsize=64)
def _differentiable(axes: tuple) -> Any:
    """Seed 001's op of these axes as a ``jax.custom_vjp`` of (a, offsets, alpha, b, prob, bias)."""
    import jax

    generate_c = dict(axes)["generate_c"]

    def forward(a, offsets, alpha, b, prob, bias):
        out = _seed_op(axes)(a, offsets, b, inputs={"alpha": alpha, "prob": prob, "bias": bias})
        return (out["d"], out["c"]) if generate_c else out["d"]

    f = jax.custom_vjp(forward)
    f.defvjp(lambda *args: (forward(*args), args),
             lambda saved, g: _grouped_gemm_vjp(saved, *(g if generate_c else (g, None))))
    return f


def _grouped_gemm_vjp(saved: tuple, gd: Any, gc: Any) -> tuple:
    """Cotangents of (a, offsets, alpha, b, prob, bias), as torch_library's backward computes them:
    U, the cotangent at alpha_e A B_e^T over alpha; ``da = alpha_e U B_e``, ``db_e = alpha_e U_e^T A_e``."""
    import jax
    import jax.numpy as jnp
    a, offsets, alpha, b, prob, bias = saved
    # FP32 (the kernels' accumulation), or wider for wider operands (the CPU test's float64).
    m, n_exp, f32 = a.shape[0], alpha.shape[0], jnp.promote_types(a.dtype, jnp.float32)
    rows = jnp.searchsorted(offsets, jnp.arange(m, dtype=offsets.dtype), side="right")   # L: past the end
    valid = (rows < n_exp)[:, None]
    gd = jnp.where(valid, gd.astype(f32), 0)
    gc = jnp.where(valid, gc.astype(f32), 0) if gc is not None else 0
    p = prob.reshape(m, 1).astype(f32) if prob is not None else 1.0
    u = gd + gc if bias is not None else p * gd + gc
    ua = u.astype(a.dtype)
    da = jnp.where(valid, grouped_gemm(ua, offsets, alpha, jnp.transpose(b, (0, 2, 1)), d_dtype=a.dtype), 0)
    db = (_wgrad(ua, a, offsets, rows, n_exp).astype(f32) * alpha.astype(f32)[:, None, None]).astype(b.dtype)

    def per_expert(x):
        return jax.ops.segment_sum(x, rows, num_segments=n_exp + 1)[:n_exp]
    s = grouped_gemm(a, offsets, jnp.ones_like(alpha), b, d_dtype=f32)     # A B^T (XLA drops it if unused)
    dalpha = per_expert(jnp.where(valid, u * s, 0).sum(1)).astype(alpha.dtype)
    dbias = per_expert(p * u).astype(bias.dtype) if bias is not None else None
    dprob = None
    if prob is not None:
        if bias is None:
            alpha_row = jnp.concatenate((alpha.astype(f32), jnp.zeros(1, f32)))[rows]
            dp = alpha_row * jnp.where(valid, gd * s, 0).sum(1)
        else:
            bias_row = jnp.concatenate((bias.astype(f32), jnp.zeros((1, bias.shape[1]), f32)))[rows]
            dp = (u * bias_row).sum(1)
        dprob = dp.astype(prob.dtype).reshape(prob.shape)
    return da, None, dalpha, db, dprob, dbias


@functools.lru_cache(maxsize=1)
def _wgrad_op() -> Any:
    return spec_op("grouped_gemm_wgrad")


def _wgrad(u: Any, a: Any, offsets: Any, rows: Any, n_exp: int) -> Any:
    """(L, N, K) float32: ``u_e^T a_e`` per expert (see :func:`grouped_gemm`). Where the K-grouped
    kernel does not serve (its tiles, or an arch where it has not run: sm_100a today), one masked
    XLA matmul per expert: memory of one (M, N) mask at a time (an einsum over an (M, L) mask
    would build an (L, M, N) product), L times the GEMM's work."""
    import jax
    import jax.numpy as jnp

    from .ops.device import device_arch
    from .ops.kgrouped import wgrad_fits
    if wgrad_fits(u.shape[1], a.shape[1], u.shape[0], device_arch(0)):
        return _wgrad_op()(u, a, offsets)["d"]
    acc = jnp.promote_types(u.dtype, jnp.float32)
    u32, a32 = u.astype(acc), a.astype(acc)
    return jax.lax.map(lambda e: jnp.where((rows == e)[:, None], u32, 0).T @ a32, jnp.arange(n_exp))


# ---------------------------------------------------------------- any spec: spec_op(spec)
# One FFI target serves every spec: the spec, its variant and the buffers' names travel as string
# attributes, the callback runs fusegemm.Op.execute into XLA's result buffers.

_spec_ops: dict[tuple, Any] = {}


def _transposed(v: Any, order: tuple[int, ...]) -> Any:
    """A TensorView with its axes permuted (no copy)."""
    from .runtime.tensors import TensorView
    return TensorView(v.ptr, tuple(v.shape[i] for i in order), tuple(v.strides[i] for i in order), v.dtype,
                      v.device, None)


def _run_spec(args: list, rets: list, attrs: dict[str, Any], stream: int) -> None:
    import json

    from .ops.engine import Op
    operand_names = attrs["operands"].split(",")
    input_names = [x for x in attrs["inputs"].split(",") if x]
    outputs = attrs["outputs"].split(",")
    k = len(operand_names)
    if len(args) != k + len(input_names) or len(rets) != len(outputs):
        raise ArgumentError("ffi buffers", f"{len(args)} arguments, {len(rets)} results",
                            f"{k + len(input_names)} arguments and {len(outputs)} results for these attributes")
    device = args[0].device[1]
    key = (attrs["spec"], attrs["axes"], attrs["e5m2_rcp_max"], device)
    op = _spec_ops.get(key)
    if op is None:
        with _ops_lock:
            op = _spec_ops.get(key) or Op(attrs["spec"], device=device, e5m2_rcp_max=attrs["e5m2_rcp_max"],
                                          **json.loads(attrs["axes"]))
            _spec_ops[key] = op
    operands = dict(zip(operand_names, args[:k]))
    if op.kind == "batched":   # (L, M, K) row-major is the kernel's (M, K, L) K-major
        for nm in ("a_tensor", "b_tensor"):
            if operands[nm].ndim == 3:
                operands[nm] = _transposed(operands[nm], (1, 2, 0))
    inputs = dict(zip(input_names, args[k:]))
    for inp in op.epilogue.inputs:
        v = inputs.get(inp.name)
        if inp.per == "column" and v is not None and v.ndim == 2:
            inputs[inp.name] = _transposed(v, (1, 0))   # (L, N) row-major is the (N, L) N-contiguous view
    op.execute(**operands, inputs=inputs, outputs=dict(zip(outputs, rets)), current_stream=stream)


def spec_op(spec: Any, *, e5m2_rcp_max: str = "page", **axes: Any) -> Any:
    """Any spec as a JAX operation, usable inside ``jax.jit``: returns ``f(*operands, inputs={...})``.

    The operands are the spec's kernel class's (:class:`fusegemm.Op`), as row-major arrays: BF16
    grouped ``(a (M, K), padded_offsets (L,), b (L, N, K))``; block-scaled grouped ``(a, sfa,
    padded_offsets, b, sfb)`` (FP8 as ``float8_e4m3fn``/``e5m2`` or bytes, scales as flat or physical
    uint8/E8M0 buffers); batched ``(a (L, M, K), b (L, N, K), sfa, sfb)``; K-grouped ``(dy (T, M),
    x (T, N), padded_offsets)``; FP8 K-grouped ``(a = dY^T (M, T), sfa (M, T/128), b = X^T (N, T),
    sfb (N, T/128), padded_offsets)``. ``inputs`` are the epilogue's by spec name (arrays; a per-column
    input as (L, N), one row per expert). ``f`` returns a dict of the outputs by spec name in the
    kernel's storage (FP8/FP4 as uint8 bytes, SF buffers physical: 1x128 scales, ``sfd_vec_size=128``,
    as the float32 (ceil(N/128), pitch) buffer whose row j holds every row's scale of columns
    128j..); K-grouped C/D as (L, M, N).
    Rows at or past ``padded_offsets[-1]`` are unspecified (XLA's buffers).

    Parameters
    ----------
    spec : str or path
        A packaged spec name or a YAML file.
    e5m2_rcp_max : {"page", "nvidia"}
        SFD convention of an e5m2 output.
    **axes
        Variant choices, as for :class:`fusegemm.Op`.
    """
    import json

    from .ops.engine import Op, positional_operands
    plan = Op.planned(spec, e5m2_rcp_max=e5m2_rcp_max, **axes)
    if plan.variant.a_gather or plan.variant.b_gather or plan.variant.d_scatter:
        raise UnsupportedError("a_gather / b_gather / d_scatter: gathered operands and scattered outputs (their "
                               "index operands) run through fusegemm.Op and the torch ops; the JAX target passes "
                               "the positional operands only")
    import jax
    import jax.numpy as jnp

    names = positional_operands(plan.kind)      # row-major buffers, as JAX passes them
    declared = [i.name for i in plan.spec.epilogue.inputs]
    axes_json = json.dumps(axes, sort_keys=True)

    def call(*operands: Any, inputs: dict | None = None) -> dict:
        if len(operands) != len(names):
            raise ArgumentError("operands", len(operands), f"{len(names)}: {', '.join(names)}")
        given = dict(inputs or {})
        unknown = sorted(set(given) - set(declared))
        if unknown:
            raise ArgumentError(f"inputs[{unknown[0]!r}]", "given", f"the epilogue's inputs: {', '.join(declared)}")
        given = {nm: (jnp.full((1,), v, jnp.float32) if isinstance(v, (int, float)) else v)
                 for nm, v in given.items() if v is not None}
        register()
        dims = plan.dims_of({nm: tuple(x.shape) for nm, x in zip(names, operands)})
        bufs = plan.epilogue.buffers(*dims)
        outs = [jax.ShapeDtypeStruct(shape, jnp.dtype(store)) for shape, store, _ in bufs.values()]
        res = jax.ffi.ffi_call("fusegemm_spec", outs)(
            *operands, *given.values(), spec=str(spec), axes=axes_json, e5m2_rcp_max=e5m2_rcp_max,
            operands=",".join(names), inputs=",".join(given), outputs=",".join(bufs))
        out = dict(zip(bufs, res))
        if plan.k_grouped:   # (L * M, N) rows as (L, M, N); an M-major D's (L * N, M) as (L, N, M)
            n, rows_out, l = dims
            m = rows_out // l
            rows = {o.name for o in plan.epilogue.outputs}
            out = {k: (v.reshape(l, m, n) if k in rows else v) for k, v in out.items()}
        return out
    return call
