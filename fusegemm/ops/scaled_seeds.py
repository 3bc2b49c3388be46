"""What the preset rows (fusegemm/presets.py) run below the arguments: the op of a call
(compiled once per configuration), the seeds' output layouts, and seed 004's class ``execute``
(its C in the caller's memory order).

Outputs come back in the seed's layout: ``(M, N, 1)`` rows and kernel-facing SF views for a
``(M, K, 1)`` A, ``(M, N)`` rows and physical SF buffers for a 2-D A (exactly as
:mod:`fusegemm.reference` returns them); FP8 rows as torch FP8 tensors, packed FP4 as ``uint8``,
SFD in the scale dtype of ``sfa_tensor`` (E8M0 under the blockwise recipe); seed 004's C
``(M, N, L)`` with N- or M-contiguous strides (``c_major``).

Seed options that only choose a kernel (``mma_tiler_mn``, ``cluster_shape_mn``) default to None:
the arch's preferred tile and cluster (``fusegemm show SPEC``); the seeds' defaults ((256, 256),
(2, 1)) are what sm_100a prefers.

``_op`` and ``VALIDATION_ARCH`` are read from this module at every call (tests stand in for
them here), and fusegemm.presets publishes the block-scaled seed wrappers here too
(fusegemm.selftest calls them by family name).
"""
from __future__ import annotations

import weakref
from typing import Any

from ..base.errors import ArgumentError
from ..formats.scales import sf_to_kernel_view
from ..runtime.tensors import TensorView, view
from .blockscaled import BlockScaledGemm
from .engine import Op
from .outputs import as_bytes, check_no_overlap, native_output
from .prepared import OpCache
from .scaled_layouts import check_layouts, k_major_operands
from .scaled_operands import FAMILIES, parse_batched

# Arch whose variant validates the arguments of a call whose a_tensor is not on a GPU: every check
# runs, then the device check refuses the call (nothing is compiled or launched).
VALIDATION_ARCH = "sm_100a"
_OPS = OpCache()
_ROWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # op -> its row buffers' dtypes
_AS_IS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # op -> 2-D outputs need no reshaping
_FP8 = ("float8_e4m3fn", "float8_e5m2")


def _op(spec: str, a_tensor: Any, e5m2_rcp_max: str, axes: dict[str, Any], arch: str | None = None) -> Op:
    """The cached op of this configuration on a_tensor's device (compiled on its first launch):
    a :class:`BlockScaledGemm` for the block-scaled families, an :class:`Op` otherwise. ``arch``:
    the arch to build for (default the device's)."""
    from ..generator import registry
    a = view(a_tensor, "a_tensor")
    device = a.device[1] if a.is_cuda else 0
    arch = arch or device_arch_of(a_tensor)
    row = registry.lookup(spec, arch)
    if row is not None:   # what this arch runs the axes as (sm_90a: vector_f32 as scalar): one op
        axes = row.canonical(axes)
    key = (spec, arch, device, e5m2_rcp_max, tuple(sorted(axes.items())))
    cls = BlockScaledGemm if spec in FAMILIES else Op
    return _OPS.get_or_create(key, lambda: cls(spec, arch=arch, device=device, e5m2_rcp_max=e5m2_rcp_max, **axes))


def device_arch_of(a_tensor: Any) -> str:
    """The arch of a_tensor's device (``VALIDATION_ARCH`` off the GPU)."""
    from .device import device_arch
    a = view(a_tensor, "a_tensor")
    return device_arch(a.device[1]) if a.is_cuda else VALIDATION_ARCH


_LAID_OUT: weakref.WeakSet = weakref.WeakSet()


def check_layouts_once(op: Op) -> None:
    """``check_layouts(op)`` (its answer is the op's variant and arch's: fixed), run until it
    first passes."""
    if op not in _LAID_OUT:
        check_layouts(op)
        _LAID_OUT.add(op)


def _torch_dtype(name: str) -> Any:
    import torch
    return getattr(torch, name)


def shape_out(out: dict[str, Any], op: Op, a_tensor: Any, sfa_tensor: Any, flat: bool) -> dict[str, Any]:
    """The engine's outputs (by spec name) in the seed's layout for ``a_tensor`` (``flat``: it is
    2-D)."""
    dtypes = _ROWS.get(op)
    if dtypes is None:                                       # the row buffers' dtypes, once per op
        outs = op.epilogue.outputs
        dtypes = _ROWS[op] = {**{o.name: o.dtype for o in outs},
                              **{o.quantize.col: o.dtype for o in outs if o.quantize is not None and o.quantize.col}}
        _AS_IS[op] = op.kind != "batched" and not any(o.quantize is not None or o.dtype in _FP8 for o in outs)
    if flat and _AS_IS[op]:   # 2-D rows of non-FP8 outputs, no SF: the engine's layout is the seed's
        return out if type(out) is dict else dict(out)
    if op.kind == "batched":
        return _batched_out(out, view(a_tensor, "a_tensor"), dtypes["c"], op.variant.cd_major)
    shaped: dict[str, Any] = {}
    sf = None
    for name, t in out.items():
        if name in dtypes:                                   # C / D rows and their column copies
            t = t.view(_torch_dtype(dtypes[name])) if dtypes[name] in _FP8 else t
            t = t if flat else t.unsqueeze(-1)
        elif name in ("sfd_row", "sfd_col"):
            sf = sf or _torch_dtype(_sfd_dtype(view(sfa_tensor, "sfa_tensor").dtype))
            t = t.view(sf)
            t = t if flat else sf_to_kernel_view(t)
        elif name == "dprob":
            t = t if flat else t.view(-1, 1, 1)
        elif name == "dbias":
            t = t if flat else t.unsqueeze(-1)
        shaped[name] = t
    return shaped


def _sfd_dtype(sfa_dtype: str) -> str:
    """SFD's scale dtype: the operands' MX scale dtype (E8M0, or e4m3 for NVFP4); E8M0 under the
    blockwise recipe, whose FP32 operand scales are not an output format (D is MXFP8-quantized)."""
    return "float8_e8m0fnu" if sfa_dtype == "float32" else sfa_dtype


def _batched_out(out: dict[str, Any], a: TensorView, c_dtype: str, c_major: str) -> dict[str, Any]:
    """Seed 004's C (M, N, L) from the kernel's (L * M, N) rows (M-major: (L * N, M)), 2-D for a
    2-D A; the global amax (1, 1, 1)."""
    m, l = a.shape[0], a.shape[2] if a.ndim == 3 else 1
    c = out["c"].view(_torch_dtype(c_dtype)) if c_dtype in _FP8 else out["c"]
    cols = c.shape[1]
    if c_major == "n":
        c = c.view(l, m, cols).permute(1, 2, 0)            # strides (N, 1, M*N)
    else:
        c = c.view(l, cols, m).permute(2, 1, 0)            # strides (1, M, M*N)
    return {"c": c[:, :, 0] if a.ndim == 2 else c, "amax": out["amax"].view(1, 1, 1)}


def c_major_of(sample_c: Any) -> str:
    """"m" when a (M, N, L) / (M, N) C sample is M-contiguous, else "n" (seed 004's class)."""
    v = view(sample_c, "sample_c")
    if v.ndim in (2, 3) and v.strides[0] == 1 and v.shape[0] > 1 and v.strides[1] != 1:
        return "m"
    return "n"


_AMAX_NAMES = {"c": "c_tensor", "amax": "amax_tensor"}


def execute_batched(op: BlockScaledGemm, a_tensor: Any, b_tensor: Any, sfa_tensor: Any, sfb_tensor: Any,
                    c_tensor: Any, amax_tensor: Any, current_stream: Any) -> None:
    """Seed 004's class ``execute`` (its layouts checked): C ``(M, N, L)`` (or 2-D for L = 1) in the
    memory order the op was built for, and amax (reset to -inf first), written in place."""
    if op.host_copies:   # MN-major A / B: K-major copies first (scaled_layouts.py), parsed as the kernel reads them
        (a_tensor, b_tensor, sfa_tensor, sfb_tensor), _, _ = k_major_operands(
            op, (a_tensor, b_tensor, sfa_tensor, sfb_tensor), {}, current_stream)
    call = parse_batched(a_tensor, b_tensor, sfa_tensor, sfb_tensor, op.variant.sf_vec_size)
    op.check_operands(call)
    (c_shape, c_store, _), (a_shape, a_store, _) = (op.epilogue.buffers(call.n, call.l * call.m, 1)[k]
                                                    for k in ("c", "amax"))
    c = _native_c(op, c_tensor, call, c_shape, c_store)
    amax = native_output(amax_tensor, "amax_tensor", a_shape, a_store)
    check_no_overlap([("amax_tensor", amax), ("c_tensor", c)], [call.a, call.b, call.sfa, call.sfb])
    op.check_device(call, [("c_tensor", c, 16), ("amax_tensor", amax, 4)])
    # The engine writes C through the kernel's rows (an M-major C's (L * N, M) bytes under the
    # (L * M, N) shape its buffer table gives every batched C; ldc says the pitch).
    op.execute(a_tensor, b_tensor, sfa_tensor, sfb_tensor, outputs={"c": c.obj.reshape(c_shape), "amax": amax.obj},
               current_stream=current_stream, output_names=_AMAX_NAMES)


def _native_c(op: BlockScaledGemm, c_tensor: Any, call: Any, shape: tuple[int, ...], store: str) -> TensorView:
    """C as the kernel's rows: (L * M, N) for N-major, (L * N, M) for M-major (packed FP4 C:
    N / 2 bytes per row, the seed's (M, N // 2, L))."""
    if c_tensor is None:
        raise ArgumentError("c_tensor", None, "a tensor (the kernel writes C here)")
    v = view(c_tensor, "c_tensor")
    m, cols, l = call.m, shape[1], call.l
    want = (m, cols, l) if v.ndim == 3 else (m, cols)
    if tuple(v.shape) != want or (v.ndim == 2 and l != 1):
        what = "(M, N // 2, L): packed FP4" if cols != call.n else "(M, N, L)"
        raise ArgumentError("c_tensor.shape", tuple(v.shape), f"{(m, cols, l)} = {what}")
    t = as_bytes(c_tensor if v.ndim == 3 else c_tensor.unsqueeze(-1))
    m_major = op.variant.cd_major == "m"
    phys = t.permute(2, 1, 0) if m_major else t.permute(2, 0, 1)   # (L, N, M) or (L, M, N)
    if not phys.is_contiguous():
        order = "(1, M, M*N)" if m_major else "(N, 1, M*N)"
        raise ArgumentError("c_tensor.stride", tuple(v.strides), f"{order}: the {'m' if m_major else 'n'}-major C "
                            "this op was built for (from sample_c)")
    got = view(phys.reshape(-1, m if m_major else cols), "c_tensor")
    if got.dtype != store:
        raise ArgumentError("c_tensor.dtype", v.dtype, f"{store} storage (the op's C dtype)")
    return got
