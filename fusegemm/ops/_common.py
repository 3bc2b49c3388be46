"""Machinery every op shares: argument checks, arch dispatch, output allocation, a fast
packer for the kernel parameter struct, and the compiled-op cache of the wrappers.

Checks are ordered so that everything decidable from shapes, strides and dtypes runs first
(tests exercise them on CPU tensors); device, address and arch checks come after.
Every failure is an :class:`ArgumentError` naming the argument, what was received and what
is allowed, raised before anything is launched.
"""
from __future__ import annotations

import functools
import struct
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable

from ..formats.dtypes import dtype_name
from ..generator.abi import KINDS, ParamStruct
from ..runtime.errors import ArgumentError, UnsupportedError
from ..runtime.tensors import TensorView, is_capturing, view

ARCH_OF_CAPABILITY = {(9, 0): "sm_90a", (10, 0): "sm_100a"}
OUT_DTYPES = ("bfloat16", "float16", "float32")
MAX_EXPERTS = 1024
M_ALIGNED = 256   # every padded_offsets value and M are multiples of this (seed contract)


# --------------------------------------------------------------------------------------
# dtype and tensor checks
# --------------------------------------------------------------------------------------
def dtype_arg(value: Any, name: str, allowed: tuple[str, ...]) -> str:
    """Canonical dtype name of a dtype argument (torch/numpy dtype or string)."""
    got = dtype_name(value) if value is not None else None
    if got is None or got not in allowed:
        raise ArgumentError(name, repr(value), ", ".join(allowed))
    return got


def tensor_arg(x: Any, name: str, *, ndims: tuple[int, ...], dtypes: tuple[str, ...]) -> TensorView:
    """Describe ``x`` and check its rank and dtype (no device checks yet)."""
    if x is None:
        raise ArgumentError(name, None, "a tensor", f"{name} is required")
    v = view(x, name)
    if v.ndim not in ndims:
        raise ArgumentError(f"{name}.shape", tuple(v.shape),
                            " or ".join(f"{d}-D" for d in ndims) + " tensor")
    if v.dtype not in dtypes:
        raise ArgumentError(f"{name}.dtype", v.dtype, ", ".join(dtypes))
    return v


def expect_shape(v: TensorView, name: str, want: tuple[int, ...], what: str) -> None:
    if v.shape != want:
        raise ArgumentError(f"{name}.shape", tuple(v.shape), f"{want} {what}".rstrip())


def expect_vector(v: TensorView, name: str, length: int, what: str) -> None:
    """A length-``length`` vector given as (length,), (length, 1) or (length, 1, 1), unit stride."""
    if v.shape[0] != length or any(d != 1 for d in v.shape[1:]):
        raise ArgumentError(f"{name}.shape", tuple(v.shape),
                            f"({length},) or ({length}, 1, 1) {what}")
    if length > 1 and v.strides[0] != 1:
        raise ArgumentError(f"{name}.stride", v.strides, "unit stride along the first dimension",
                            f"pass {name}.contiguous()")


def aligned(v: TensorView, name: str, nbytes: int = 16) -> None:
    if v.ptr % nbytes:
        raise ArgumentError(f"{name}.data_ptr", hex(v.ptr), f"a multiple of {nbytes} bytes",
                            "TMA and vector stores need aligned bases; slice offsets break it")


def row_pitch_aligned(stride: int, itemsize: int, name: str, nbytes: int = 16) -> None:
    if (stride * itemsize) % nbytes:
        raise ArgumentError(name, stride, f"a row stride that is a multiple of {nbytes} bytes "
                            f"({nbytes // itemsize} elements)")


def same_device(views: list[tuple[str, TensorView]], device: tuple[str, int]) -> None:
    for name, v in views:
        if v.device != device:
            raise ArgumentError(f"{name}.device", _dev(v.device), _dev(device),
                                "every tensor must be on a_tensor's device")


def require_cuda(v: TensorView, name: str) -> int:
    if not v.is_cuda:
        raise ArgumentError(f"{name}.device", _dev(v.device), "a CUDA device")
    return v.device[1]


def _dev(d: tuple[str, int]) -> str:
    return d[0] if d[1] < 0 else f"{d[0]}:{d[1]}"


def tile_arg(value: Any, name: str, default: tuple[int, int]) -> tuple[int, int]:
    if value is None:
        return default
    try:
        a, b = value
        a, b = int(a), int(b)
    except (TypeError, ValueError):
        raise ArgumentError(name, repr(value), "a pair of ints, e.g. (128, 256)") from None
    return a, b


def bool_arg(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ArgumentError(name, repr(value), "True or False")
    return value


# --------------------------------------------------------------------------------------
# device facts
# --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def device_arch(device: int) -> str:
    """sm_90a / sm_100a for ``device``; UnsupportedError naming the capability otherwise."""
    from ..runtime.load import device_attribute, ensure_context
    ensure_context(device)
    cc = (device_attribute(device, "COMPUTE_CAPABILITY_MAJOR"),
          device_attribute(device, "COMPUTE_CAPABILITY_MINOR"))
    arch = ARCH_OF_CAPABILITY.get(cc)
    if arch is None:
        raise UnsupportedError(f"device {device} has compute capability {cc[0]}.{cc[1]}; fusegemm "
                               f"kernels need 9.0 (Hopper, sm_90a) or 10.0 (Blackwell, sm_100a)")
    return arch


@functools.lru_cache(maxsize=16)
def num_sms(device: int) -> int:
    from ..runtime.load import device_attribute
    return device_attribute(device, "MULTIPROCESSOR_COUNT")


# --------------------------------------------------------------------------------------
# parameter struct packing
# --------------------------------------------------------------------------------------
class StructPacker:
    """Packs a :class:`ParamStruct` with one precompiled ``struct.Struct`` (host fast path).

    Same bytes as ``ParamStruct.pack`` (a unit test checks), without per-field Python work.
    """

    def __init__(self, ps: ParamStruct) -> None:
        fmt, cur = ["<"], 0
        self.names: tuple[str, ...] = tuple(f.name for f in ps.fields)
        self.defaults: list[Any] = []
        for f, off in zip(ps.fields, ps.offsets().values()):
            if off > cur:
                fmt.append(f"{off - cur}x")
            fmt.append(KINDS[f.kind][3])
            cur = off + f.size
            self.defaults.append(b"\0" * 128 if f.kind == "tensormap" else 0)
        if ps.size > cur:
            fmt.append(f"{ps.size - cur}x")
        self._struct = struct.Struct("".join(fmt))
        self._index = {n: i for i, n in enumerate(self.names)}
        self.size = ps.size

    def pack(self, values: dict[str, Any]) -> bytes:
        out = list(self.defaults)
        index = self._index
        for k, v in values.items():
            try:
                out[index[k]] = v
            except KeyError:
                raise ArgumentError("params field", repr(k), ", ".join(self.names)) from None
        return self._struct.pack(*out)


# --------------------------------------------------------------------------------------
# compiled-op cache of the wrappers
# --------------------------------------------------------------------------------------
class OpCache:
    """Compiled ops by a key of labelled fields (dtypes, layout, features, tiles, device...).

    Keys never contain data pointers or shapes the kernel takes at run time, so one compiled
    op serves every call with the same configuration. Per-call buffers live in the call.
    """

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._ops: dict[Hashable, Any] = {}
        self._lock = threading.Lock()

    def get_or_create(self, key: Hashable, make: Callable[[], Any]) -> Any:
        op = self._ops.get(key)
        if op is not None:
            return op
        with self._lock:
            op = self._ops.get(key)
            if op is None:
                op = make()
                if len(self._ops) >= self.capacity:
                    self._ops.pop(next(iter(self._ops)))
                self._ops[key] = op
        return op

    def __len__(self) -> int:
        return len(self._ops)

    def clear(self) -> None:
        with self._lock:
            self._ops.clear()


def alloc(shape: tuple[int, ...], dtype: str, device: int) -> Any:
    """A new torch tensor (outputs and per-call workspaces use torch's caching allocator,
    which is stream-ordered and CUDA-graph aware)."""
    import torch
    return torch.empty(shape, dtype=getattr(torch, dtype), device=f"cuda:{device}")


# --------------------------------------------------------------------------------------
# grouped operands (A, padded_offsets, alpha, B or b_ptrs, bias, prob), shared by the
# grouped ops of seeds 000-003
# --------------------------------------------------------------------------------------
@dataclass
class Call:
    """One validated set of arguments."""

    m: int
    n: int
    k: int
    l: int
    a: TensorView
    offsets: TensorView
    alpha: TensorView
    b: TensorView | None          # dense weights
    b_strides: tuple[int, int]    # (N stride, L stride) in elements, dense only
    b_ptrs: TensorView | None     # discrete weights
    bias: TensorView | None
    prob: TensorView | None
    canonical: bool               # 2-D A: outputs are (M, N), else (M, N, 1)


def parse_call(a_tensor: Any, padded_offsets: Any, alpha_tensor: Any, b_tensor: Any,
               b_ptrs: Any, bias_tensor: Any, prob_tensor: Any, *, n: Any = None,
               b_dtype: Any = None, b_major: str = "k", discrete_experts: int | None = None) -> Call:
    """Validate the inputs (shapes, strides, dtypes first; devices last).

    ``discrete_experts`` describes discrete weights without a pointer table (class API
    samples: ``num_experts=`` instead of ``b_ptrs``).
    """
    a = tensor_arg(a_tensor, "a_tensor", ndims=(2, 3), dtypes=("bfloat16",))
    if a.ndim == 3 and a.shape[2] != 1:
        raise ArgumentError("a_tensor.shape", tuple(a.shape), "(M, K, 1) or (M, K)")
    m, k = a.shape[0], a.shape[1]
    if a.strides[1] != 1 and k > 1:
        raise ArgumentError("a_tensor.stride", a.strides, "K-major (stride 1 along K)",
                            "pass a_tensor.contiguous()")
    if m % M_ALIGNED:
        raise ArgumentError("a_tensor.shape[0]", m, f"a multiple of {M_ALIGNED} (padded rows)")
    if k < 8 or k % 8:
        raise ArgumentError("a_tensor.shape[1] (K)", k, "a multiple of 8, at least 8 "
                            "(16-byte rows for TMA)")
    row_pitch_aligned(a.strides[0], 2, "a_tensor.stride[0]")

    off = tensor_arg(padded_offsets, "padded_offsets", ndims=(1,), dtypes=("int32",))
    l = off.shape[0]
    if not 1 <= l <= MAX_EXPERTS:
        raise ArgumentError("padded_offsets.shape", tuple(off.shape), f"(L,) with 1 <= L <= {MAX_EXPERTS}")
    if l > 1 and off.strides[0] != 1:
        raise ArgumentError("padded_offsets.stride", off.strides, "contiguous (stride 1)")
    alpha = tensor_arg(alpha_tensor, "alpha_tensor", ndims=(1, 2, 3), dtypes=("float32",))
    expect_vector(alpha, "alpha_tensor", l, "(one scale per expert)")

    if b_major != "k":
        raise ArgumentError("b_major", repr(b_major), "'k'", "weights must be K-major")
    if b_dtype is not None:
        dtype_arg(b_dtype, "b_dtype", ("bfloat16",))
    discrete = b_ptrs is not None or discrete_experts is not None
    if (b_tensor is None) != discrete:
        raise ArgumentError("b_tensor/b_ptrs", "both" if b_tensor is not None else "neither",
                            "exactly one of b_tensor (dense) and b_ptrs (discrete)")
    b = ptrs = None
    b_strides = (0, 0)
    if b_tensor is not None:
        b = tensor_arg(b_tensor, "b_tensor", ndims=(3,), dtypes=("bfloat16",))
        s = b.shape
        if s[1] == k and s[2] == l and b.strides[1] == 1:        # kernel-facing (N, K, L)
            nb, b_strides = s[0], (b.strides[0], b.strides[2])
        elif s[0] == l and s[2] == k and b.strides[2] == 1:      # canonical (L, N, K)
            nb, b_strides = s[1], (b.strides[1], b.strides[0])
        else:
            raise ArgumentError("b_tensor", f"shape {tuple(s)} strides {b.strides}",
                                f"(N, {k}, {l}) with strides (K, 1, N*K) or a contiguous "
                                f"({l}, N, {k})", "weights must be K-major")
        if n is not None and n != nb:
            raise ArgumentError("n", n, f"None or {nb} (b_tensor's N)")
        n = nb
        row_pitch_aligned(b_strides[0], 2, "b_tensor N stride")
        if l > 1:
            row_pitch_aligned(b_strides[1], 2, "b_tensor expert stride")
    elif b_ptrs is not None:
        ptrs = tensor_arg(b_ptrs, "b_ptrs", ndims=(1,), dtypes=("int64", "uint64"))
        if tuple(ptrs.shape) != (l,):
            raise ArgumentError("b_ptrs.shape", tuple(ptrs.shape), f"({l},): one pointer per expert")
        if l > 1 and ptrs.strides[0] != 1:
            raise ArgumentError("b_ptrs.stride", ptrs.strides, "contiguous (stride 1)")
    elif discrete_experts != l:
        raise ArgumentError("num_experts", discrete_experts, f"{l} (length of padded_offsets)")
    if discrete:
        if n is None or isinstance(n, bool) or not isinstance(n, int):
            raise ArgumentError("n", repr(n), "an int (N, rows of each expert's (N, K) weight)",
                                "discrete weights need n=")
    if n < 8 or n % 8:
        raise ArgumentError("n (N)", n, "a multiple of 8, at least 8 (16-byte output rows)")

    bias = prob = None
    if bias_tensor is not None:
        bias = tensor_arg(bias_tensor, "bias_tensor", ndims=(2,), dtypes=OUT_DTYPES)
        expect_shape(bias, "bias_tensor", (n, l), "= (N, L)")
        if bias.strides[0] != 1 or (l > 1 and bias.strides[1] != n):
            raise ArgumentError("bias_tensor.stride", bias.strides, f"(1, {n}): (N, L) with N "
                                "contiguous", "pass bias_LN.t() for a contiguous (L, N) tensor")
    if prob_tensor is not None:
        prob = tensor_arg(prob_tensor, "prob_tensor", ndims=(1, 2, 3), dtypes=("float32",))
        expect_vector(prob, "prob_tensor", m, "(one gate per row)")

    call = Call(m=m, n=n, k=k, l=l, a=a, offsets=off, alpha=alpha, b=b, b_strides=b_strides,
                b_ptrs=ptrs, bias=bias, prob=prob, canonical=a.ndim == 2)
    # Devices and addresses last (CPU-only tests reach everything above).
    named = [("padded_offsets", off), ("alpha_tensor", alpha), ("b_tensor", b), ("b_ptrs", ptrs),
             ("bias_tensor", bias), ("prob_tensor", prob)]
    require_cuda(a, "a_tensor")
    same_device([(nm, v) for nm, v in named if v is not None], a.device)
    aligned(a, "a_tensor")
    if b is not None:
        aligned(b, "b_tensor")
    if ptrs is not None:
        aligned(ptrs, "b_ptrs", 8)
    if bias is not None:
        aligned(bias, "bias_tensor")
    for name, v in (("padded_offsets", off), ("alpha_tensor", alpha), ("prob_tensor", prob)):
        if v is not None:
            aligned(v, name, 4)
    return call


def check_output(x: Any, name: str, call: Call, dtype: str) -> TensorView:
    v = tensor_arg(x, name, ndims=(2, 3), dtypes=(dtype,))
    want = (call.m, call.n) if v.ndim == 2 else (call.m, call.n, 1)
    expect_shape(v, name, want, "= (M, N) or (M, N, 1)")
    if v.strides[1] != 1:
        raise ArgumentError(f"{name}.stride", v.strides, "N-major (stride 1 along N)")
    row_pitch_aligned(v.strides[0], v.itemsize, f"{name}.stride[0]")
    if v.device != call.a.device:
        raise ArgumentError(f"{name}.device", v.device, f"a_tensor's device {call.a.device}")
    aligned(v, name)
    return v


def check_offsets_values(offsets: Any, m: int, stream: int) -> None:
    """Host check of padded_offsets values (a device->host copy), skipped while ``stream``
    captures a CUDA graph (a copy there would break the capture)."""
    if is_capturing(stream):
        return
    import torch
    vals = torch.as_tensor(offsets).to("cpu").tolist()
    prev = 0
    for e, v in enumerate(vals):
        if v < prev or v % M_ALIGNED:
            raise ArgumentError(f"padded_offsets[{e}]", v, f"nondecreasing multiples of {M_ALIGNED}"
                                f" (previous end {prev})")
        prev = v
    if prev > m:
        raise ArgumentError("padded_offsets[-1]", prev, f"<= {m} (rows of a_tensor)")


@dataclass(frozen=True)
class Layout:
    """Everything a launch needs from validated arguments except their addresses."""

    m: int
    n: int
    k: int
    l: int
    a_ld: int
    b_sn: int
    b_sl: int
    ldd: int
    ldc: int
    discrete: bool

    @staticmethod
    def of(call: Call, c: TensorView | None, d: TensorView) -> "Layout":
        sn, sl = call.b_strides
        if call.b is not None and call.l == 1:
            sl = sn * call.n   # L == 1 may report any expert stride; give TMA a legal one
        return Layout(m=call.m, n=call.n, k=call.k, l=call.l, a_ld=call.a.strides[0], b_sn=sn,
                      b_sl=sl, ldd=d.strides[0], ldc=c.strides[0] if c is not None else 0,
                      discrete=call.b_ptrs is not None)


# Argument positions in GroupedGemm.execute's tuple that need aligned addresses.
_ALIGN_16 = ((0, "a_tensor"), (3, "b_tensor"), (5, "bias_tensor"), (7, "d_tensor"), (8, "c_tensor"))
_ALIGN_SMALL = ((1, "padded_offsets", 4), (2, "alpha_tensor", 4), (4, "b_ptrs", 8),
                (6, "prob_tensor", 4))


def _signature(args: tuple) -> tuple | None:
    """(dtype, shape, strides, device) of every argument, or None unless all are torch
    tensors (or None)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    tensor = torch.Tensor
    out = []
    for x in args:
        if x is None:
            out.append(None)
        elif isinstance(x, tensor):
            out.append((x.dtype, x.shape, x.stride(), x.get_device()))
        else:
            return None
    return tuple(out)
