"""The seed API's argument contract, checked once for the ops and the references.

What a seed page says about each argument -- rank and shape, dtype, which of the accepted layouts
(kernel-facing ``(M, K, 1)`` / ``(N, K, L)`` or canonical ``(M, K)`` / ``(L, N, K)``) it is in,
how a vector may be shaped, the 256-row padding, at most 1024 experts -- is checked here, on a
:class:`~fusegemm.runtime.tensors.TensorView` of anything (torch, numpy, CUDA array interface,
DLPack). The GPU ops (``fusegemm/ops``) add what their kernels need on top (strides, alignment,
devices); the numpy references (``fusegemm/reference``) add what they compute on the host
(offset values, per-expert host arrays). Both raise the same :class:`ArgumentError` for the same
mistake: ``name: got <value>; allowed: <what>``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from .base.errors import ArgumentError
from .runtime.tensors import TensorView, view

# Seed contract: every padded_offsets value and M are multiples of M_ALIGNED (kernels export the
# value they assume as kMAligned and the ops check it, fusegemm/ops/prepared.py); L <= MAX_EXPERTS.
M_ALIGNED = 256
MAX_EXPERTS = 1024


def tensor(x: Any, name: str, *, ndims: tuple[int, ...], dtypes: Iterable[str]) -> TensorView:
    """Describe ``x`` and check its rank and dtype."""
    if x is None:
        raise ArgumentError(name, None, "a tensor", f"{name} is required")
    v = view(x, name)
    if v.ndim not in ndims:
        raise ArgumentError(f"{name}.shape", tuple(v.shape), " or ".join(f"{d}-D" for d in ndims) + " tensor")
    dtypes = tuple(dtypes)
    if v.dtype not in dtypes:
        raise ArgumentError(f"{name}.dtype", v.dtype, ", ".join(dtypes))
    return v


def choice(value: Any, name: str, allowed: Sequence[Any]) -> Any:
    """``value`` if it is one of ``allowed``; ArgumentError otherwise."""
    if value not in tuple(allowed):
        raise ArgumentError(name, repr(value), ", ".join(map(repr, allowed)))
    return value


def vector(x: Any, name: str, length: int, *, dtypes: Iterable[str] = ("float32",),
           what: str = "") -> TensorView:
    """A length-``length`` vector given as (length,), (length, 1) or (length, 1, 1)."""
    v = tensor(x, name, ndims=(1, 2, 3), dtypes=dtypes)
    if v.shape[0] != length or any(d != 1 for d in v.shape[1:]):
        raise ArgumentError(f"{name}.shape", tuple(v.shape), f"({length},) or ({length}, 1, 1) {what}".rstrip())
    return v


@dataclass(frozen=True)
class Rows:
    """A (the rows of every expert): ``(M, K, 1)`` kernel-facing or ``(M, K)`` canonical."""

    a: TensorView
    m: int
    k_stored: int      # innermost extent (bytes for packed FP4)
    canonical: bool    # 2-D A: outputs are (M, N), else (M, N, 1)


def rows(a_tensor: Any, dtypes: Iterable[str]) -> Rows:
    """A as ``(M, K, 1)`` or ``(M, K)``, M a multiple of :data:`M_ALIGNED`."""
    a = tensor(a_tensor, "a_tensor", ndims=(2, 3), dtypes=dtypes)
    if a.ndim == 3 and a.shape[2] != 1:
        raise ArgumentError("a_tensor.shape", tuple(a.shape), "(M, K, 1) or (M, K)")
    m, k = a.shape[0], a.shape[1]
    if m % M_ALIGNED:
        raise ArgumentError("a_tensor.shape[0]", m, f"a multiple of {M_ALIGNED} (padded rows)")
    return Rows(a, m, k, a.ndim == 2)


def offsets(padded_offsets: Any, *, dtypes: Iterable[str] = ("int32",)) -> tuple[TensorView, int]:
    """``padded_offsets`` (L,) and L."""
    off = tensor(padded_offsets, "padded_offsets", ndims=(1,), dtypes=dtypes)
    l = off.shape[0]
    if not 1 <= l <= MAX_EXPERTS:
        raise ArgumentError("padded_offsets.shape", tuple(off.shape), f"(L,) with 1 <= L <= {MAX_EXPERTS}")
    return off, l


def offsets_values(values: Sequence[int], m: int, rows_of: str = "a_tensor") -> None:
    """Host check of padded_offsets values: nondecreasing multiples of 256, the last <= M (the
    rows of ``rows_of``)."""
    prev = 0
    for e, v in enumerate(values):
        if v < prev or v % M_ALIGNED:
            raise ArgumentError(f"padded_offsets[{e}]", v, f"nondecreasing multiples of {M_ALIGNED} "
                                f"(previous end {prev})")
        prev = v
    if prev > m:
        raise ArgumentError("padded_offsets[-1]", prev, f"<= {m} (rows of {rows_of})")


@dataclass(frozen=True)
class DenseB:
    """Dense weights in either accepted layout."""

    b: TensorView
    n: int
    canonical: bool              # (L, N, K) rather than the kernel-facing (N, K, L)
    strides: tuple[int, int, int]  # (N, K, L) strides in elements, whatever the layout


def b_is_canonical(shape: Sequence[int], strides: Sequence[int], k_stored: int, l: int) -> bool | None:
    """Which reading of a 3-D B fits: False for ``(N, K, L)``, True for ``(L, N, K)``, None for
    neither (shapes and strides only: the torch custom ops' fake implementations use it too)."""
    kernel = shape[1] == k_stored and shape[2] == l
    canonical = shape[0] == l and shape[2] == k_stored
    if kernel and canonical:
        return not (strides[2] >= strides[0] >= strides[1])
    return True if canonical else (False if kernel else None)


def dense_b(b_tensor: Any, k_stored: int, l: int, dtypes: Iterable[str]) -> DenseB:
    """B as ``(N, K, L)`` (kernel-facing) or ``(L, N, K)`` (canonical), decided by its shape.

    When both readings fit (N == K == L), the strides decide: the kernel-facing view has K
    unit-stride and L outermost.
    """
    b = tensor(b_tensor, "b_tensor", ndims=(3,), dtypes=dtypes)
    s, st = b.shape, b.strides
    canonical = b_is_canonical(s, st, k_stored, l)
    if canonical is False:
        return DenseB(b, s[0], False, (st[0], st[1], st[2]))
    if canonical:
        return DenseB(b, s[1], True, (st[1], st[2], st[0]))
    raise ArgumentError("b_tensor.shape", tuple(s), f"(N, {k_stored}, {l}) (kernel-facing) or ({l}, N, "
                        f"{k_stored}) (canonical), with K from a_tensor and L from padded_offsets")


def bias(bias_tensor: Any, n: int, l: int, dtypes: Iterable[str]) -> TensorView:
    """Bias ``(N, L)`` (logical ``bias[n, e]``)."""
    v = tensor(bias_tensor, "bias_tensor", ndims=(2,), dtypes=dtypes)
    if tuple(v.shape) != (n, l):
        raise ArgumentError("bias_tensor.shape", tuple(v.shape), f"({n}, {l}) = (N, L)")
    return v


def output(x: Any, name: str, m: int, n: int, dtypes: Iterable[str], *,
           what: str = "(M, N) or (M, N, 1)") -> TensorView:
    """An output C/D: ``(M, N)`` or ``(M, N, 1)``.

    ``what`` names the extents in the message where they are not the GEMM's M and N (dSwiGLU's
    C input is ``(M, 2N)``).
    """
    v = tensor(x, name, ndims=(2, 3), dtypes=dtypes)
    want = (m, n) if v.ndim == 2 else (m, n, 1)
    if tuple(v.shape) != want:
        raise ArgumentError(f"{name}.shape", tuple(v.shape), f"{want} = {what}")
    return v
