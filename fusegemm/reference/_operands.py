"""GEMM operands of the references: parse A/B/SFA/SFB in any accepted layout, dequantize, accumulate.

Accumulation: per expert, ``dequant(A_e) @ dequant(B_e)^T`` with BLAS over float32 operands
(``acc_dtype="float32"``, the kernels' accumulator type; the summation order differs from the
tensor cores', so results agree to FP32 rounding, not bit for bit) or float64 operands
(``acc_dtype="float64"``: every product and partial sum is exact or nearly so, giving the
correctly rounded FP32 value of the dot product — a kernel-independent oracle, ~3x slower).
Dequantized values are exact in float32 (FP8/FP4 element times a power-of-two or e4m3 scale), except
the blockwise recipe's (FP8 times an FP32 scale: rounded once to float32).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .. import arguments
from ..base.errors import ArgumentError
from ..formats.blockscale import block_format
from ..formats.blockwise import BLOCK
from ..formats.numpy_dtypes import FP8_NAMES, to_numpy
from ..formats.elements import to_float32
from ..formats.scales import sf_physical_shape, sf_view_shape, unpack_sf
from ..runtime.tensors import TensorView
from ._args import dtype_option, expert_ranges, parse_offsets

BLOCKSCALED_AB = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2", "uint8", "float4_e2m1fn")
SF_DTYPES = ("float8_e8m0fnu", "float8_e4m3fn", "uint8", "int8")
# A scale buffer is flat (1-D), physical or the kernel-facing view (both 6-D).
SF_NDIMS = (1, 6)


def rows_through(source: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Gathered rows as the kernels read them: row r is ``source[index[r]]``, zeros where the index
    is outside the source (the routing's -1 padding included)."""
    index = np.asarray(index).astype(np.int64)
    inside = (index >= 0) & (index < source.shape[0])
    rows = np.zeros((index.shape[0],) + source.shape[1:], source.dtype)
    rows[inside] = source[index[inside]]
    return rows


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def elem_of(dtype: str) -> str:
    """Canonical element name of an A/B/C dtype name (``uint8`` means packed FP4)."""
    return "float4_e2m1fn_x2" if dtype == "uint8" else dtype


def sf_of(dtype: str) -> str:
    """Canonical scale dtype name (raw ``uint8``/``int8`` bytes are E8M0, as in the seed pages)."""
    return "float8_e8m0fnu" if dtype in ("uint8", "int8") else dtype


def logical_k(k_stored: int, name: str) -> int:
    """K in elements from the innermost stored extent (bytes for packed FP4)."""
    return 2 * k_stored if name == "float4_e2m1fn_x2" else k_stored


def decode(data: np.ndarray, name: str) -> np.ndarray:
    """float32 values of stored elements (packed FP4 unpacks along the last axis)."""
    if name == "float4_e2m1fn_x2":
        return to_float32(data.view(np.uint8), "float4_e2m1fn_x2")
    return to_float32(data)


def decode_scales(sf: np.ndarray, name: str) -> np.ndarray:
    """float32 values of logical scale bytes."""
    return to_float32(sf.view(np.uint8), name)


def dequant(data: np.ndarray, name: str, scales: np.ndarray | None, vec: int | None) -> np.ndarray:
    """``decode(data) * scales`` broadcast over ``vec``-element K blocks; float32."""
    values = decode(data, name)
    if scales is None:
        return values
    k = values.shape[-1]
    values *= np.repeat(scales, vec, axis=-1)[..., :k]
    return values


def scale_tensor(buf: Any, name: str) -> TensorView:
    """A scale buffer's rank and dtype (flat or 6-D; E8M0, e4m3 or raw E8M0 bytes)."""
    return arguments.tensor(buf, name, ndims=SF_NDIMS, dtypes=SF_DTYPES)


def _check_sf_shape(v: TensorView, name: str, mn: int, sfk: int, l: int) -> None:
    """Scales for ``(l, mn, sfk)`` in one of the three accepted forms (reference-only forms:
    the ops take the kernel-facing view)."""
    view_shape, phys_shape = sf_view_shape(mn, sfk, l), sf_physical_shape(mn, sfk, l)
    size = int(np.prod(phys_shape))
    shape = tuple(v.shape)
    if shape in (view_shape, phys_shape) or (size and shape == (size,)):
        return
    raise ArgumentError(f"{name}.shape", shape, f"the kernel-facing view {view_shape}, the physical "
                        f"buffer {phys_shape} or a flat ({size},) buffer (scales of mn={mn}, "
                        f"sfk={sfk}, L={l})")


def parse_scales(buf: Any, name: str, mn: int, sfk: int, l: int) -> tuple[np.ndarray, str]:
    """Logical float32 scales ``(L, mn, sfk)`` and their dtype name from any accepted SF form."""
    v = scale_tensor(buf, name)
    _check_sf_shape(v, name, mn, sfk, l)
    sf = sf_of(v.dtype)
    logical = unpack_sf(to_numpy(buf, argument=name).view(np.uint8), mn, sfk, l=l, batch_first=True)
    return decode_scales(logical, sf), sf


@dataclass(frozen=True)
class GroupedOperands:
    """Parsed operands of a grouped GEMM, ready to accumulate.

    ``b`` and ``sfb`` hold one entry per expert (views into a dense B, or the discrete list).
    """

    a: np.ndarray
    sfa: np.ndarray | None
    b: tuple[np.ndarray, ...]
    sfb: tuple[np.ndarray, ...] | None
    ab: str
    sf: str | None
    sf_vec_size: int | None
    k: int
    n: int
    offsets: np.ndarray
    canonical: bool
    acc: str

    @property
    def m(self) -> int:
        """Rows of A (outputs have as many; rows at or past valid_m stay zero)."""
        return int(self.a.shape[0])

    @property
    def l(self) -> int:
        """Number of experts."""
        return int(self.offsets.size)

    @property
    def valid_m(self) -> int:
        """``padded_offsets[-1]``."""
        return int(self.offsets[-1])

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """Row range ``[start, end)`` of each expert."""
        return expert_ranges(self.offsets)

    @property
    def is_fp8(self) -> bool:
        """FP8 A/B (the only inputs that produce SFD outputs)."""
        return self.ab in FP8_NAMES

    def accumulate(self) -> np.ndarray:
        """FP32 ``dequant(A_e) @ dequant(B_e)^T`` for every row below valid_m: ``(valid_m, N)``."""
        acc = np.float64 if self.acc == "float64" else np.float32
        out = np.zeros((self.valid_m, self.n), dtype=np.float32)
        for e, (start, end) in enumerate(self.ranges):
            if start == end:
                continue
            sfa = None if self.sfa is None else self.sfa[start:end]
            sfb = None if self.sfb is None else self.sfb[e]
            a_e = dequant(self.a[start:end], self.ab, sfa, self.sf_vec_size).astype(acc, copy=False)
            b_e = dequant(self.b[e], self.ab, sfb, self.sf_vec_size).astype(acc, copy=False)
            out[start:end] = a_e @ b_e.T
        return out


def _parse_a(a_tensor: Any, allowed: Sequence[str]) -> tuple[np.ndarray, str, bool]:
    """A as ``(M, K_stored)``, its element name and whether it came canonical (2-D)."""
    rows = arguments.rows(a_tensor, allowed)
    a = to_numpy(a_tensor, argument="a_tensor")
    return (a if rows.canonical else a[:, :, 0]), elem_of(rows.a.dtype), rows.canonical


def same_elements(v: TensorView, name: str, ab: str) -> None:
    """Weights hold A's element type (reference rule: the ops allow one A/B dtype per kernel)."""
    if elem_of(v.dtype) != ab:
        raise ArgumentError(f"{name}.dtype", v.dtype, f"{ab} (the dtype of a_tensor)")


def _parse_dense_b(b_tensor: Any, kb: int, l: int, ab: str, allowed: Sequence[str]) -> tuple[np.ndarray, ...]:
    """Per-expert ``(N, Kb)`` weights from the kernel-facing ``(N, Kb, L)`` view or ``(L, N, Kb)``."""
    dense = arguments.dense_b(b_tensor, kb, l, allowed)
    same_elements(dense.b, "b_tensor", ab)
    b = to_numpy(b_tensor, argument="b_tensor")
    b_lnk = b if dense.canonical else np.transpose(b, (2, 0, 1))
    return tuple(b_lnk[e] for e in range(l))


def _parse_b_list(b_list: Sequence[Any], kb: int, l: int, ab: str, allowed: Sequence[str]) -> tuple[np.ndarray, ...]:
    """Per-expert ``(N, Kb)`` weights from ``b_list`` (the host stand-in for ``b_ptrs``)."""
    if len(b_list) != l:
        raise ArgumentError("len(b_list)", len(b_list), f"{l} (L, the length of padded_offsets)")
    experts, n = [], None
    for i, x in enumerate(b_list):
        name = f"b_list[{i}]"
        v = arguments.tensor(x, name, ndims=(2,), dtypes=allowed)
        same_elements(v, name, ab)
        if v.shape[1] != kb or (n is not None and v.shape[0] != n):
            want = f"(N, {kb}) with K from a_tensor" if n is None else f"({n}, {kb}), as b_list[0]"
            raise ArgumentError(f"{name}.shape", tuple(v.shape), want)
        n = v.shape[0]
        experts.append(to_numpy(x, argument=name))
    return tuple(experts)


def _exactly_one(dense: Any, listed: Any, names: tuple[str, str], allowed: str) -> None:
    """Exactly one of a dense tensor and its per-expert list."""
    if (dense is None) == (listed is None):
        raise ArgumentError(f"{names[0]}/{names[1]}", "both" if dense is not None else "neither",
                            allowed)


def _parse_weights(
    b_tensor: Any, b_list: Sequence[Any] | None, kb: int, l: int, ab: str, allowed: Sequence[str]
) -> tuple[np.ndarray, ...]:
    """Per-expert ``(N, Kb)`` weights from a dense B (either layout) or a per-expert list."""
    _exactly_one(b_tensor, b_list, ("b_tensor", "b_list"),
                 "exactly one of b_tensor (dense weights) and b_list (one (N, K) array per expert)")
    if b_tensor is not None:
        return _parse_dense_b(b_tensor, kb, l, ab, allowed)
    return _parse_b_list(b_list, kb, l, ab, allowed)


def same_scales(got: str, name: str, sf: str) -> None:
    """SFB holds SFA's scale type (raw bytes count as E8M0)."""
    if got != sf:
        raise ArgumentError(f"{name}.dtype", got, f"{sf} (the scale type of sfa_tensor)")


def _parse_grouped_scales(
    sfa_tensor: Any, sfb_tensor: Any, sfb_list: Sequence[Any] | None, ab: str, vec: int,
    m: int, n: int, k: int, l: int,
) -> tuple[np.ndarray, tuple[np.ndarray, ...], str]:
    """Logical float32 SFA ``(M, sfk)``, per-expert SFB ``(N, sfk)`` and the scale dtype name."""
    if sfa_tensor is None:
        raise ArgumentError("sfa_tensor", None, "a tensor", f"sfa_tensor is required for "
                            f"block-scaled A/B ({ab})")
    if vec == BLOCK:
        return _parse_blockwise_scales(sfa_tensor, sfb_tensor, sfb_list, m, n, k, l)
    sf = sf_of(scale_tensor(sfa_tensor, "sfa_tensor").dtype)
    block_format(ab, sf, vec)  # raises for the invalid (ab, sf, sf_vec_size) combinations
    sfk = _ceil_div(k, vec)
    sfa = parse_scales(sfa_tensor, "sfa_tensor", m, sfk, 1)[0][0]
    _exactly_one(sfb_tensor, sfb_list, ("sfb_tensor", "sfb_list"),
                 "exactly one of sfb_tensor (dense) and sfb_list (one SF buffer per expert)")
    if sfb_tensor is not None:
        sfb_all, sfb_dtype = parse_scales(sfb_tensor, "sfb_tensor", n, sfk, l)
        same_scales(sfb_dtype, "sfb_tensor", sf)
        return sfa, tuple(sfb_all[e] for e in range(l)), sf
    if len(sfb_list) != l:
        raise ArgumentError("len(sfb_list)", len(sfb_list), f"{l} (L, the length of padded_offsets)")
    sfb = []
    for i, x in enumerate(sfb_list):
        values, dtype = parse_scales(x, f"sfb_list[{i}]", n, sfk, 1)
        same_scales(dtype, f"sfb_list[{i}]", sf)
        sfb.append(values[0])
    return sfa, tuple(sfb), sf


def _float32_scales(x: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
    v = arguments.tensor(x, name, ndims=(len(shape),), dtypes=("float32",))
    if tuple(v.shape) != shape:
        raise ArgumentError(f"{name}.shape", tuple(v.shape), f"{shape} (float32 blockwise scales)")
    return np.asarray(to_numpy(x, argument=name), dtype=np.float32)


def _parse_blockwise_scales(sfa_tensor: Any, sfb_tensor: Any, sfb_list: Sequence[Any] | None, m: int, n: int,
                            k: int, l: int) -> tuple[np.ndarray, tuple[np.ndarray, ...], str]:
    """The blockwise recipe's scales (formats/blockwise.py) as the per-row ``(M, sfk)`` and per-expert
    ``(N, sfk)`` tables :func:`dequant` applies: each 128x128 B scale repeated over its 128 rows."""
    sfk, nb = _ceil_div(k, BLOCK), _ceil_div(n, BLOCK)
    sfa = _float32_scales(sfa_tensor, "sfa_tensor", (m, sfk))
    _exactly_one(sfb_tensor, sfb_list, ("sfb_tensor", "sfb_list"),
                 "exactly one of sfb_tensor (dense) and sfb_list (one scale table per expert)")
    if sfb_tensor is not None:
        shape = (l, nb, sfk) if len(getattr(sfb_tensor, "shape", ())) == 3 or l > 1 else (nb, sfk)
        blocks = _float32_scales(sfb_tensor, "sfb_tensor", shape).reshape(l, nb, sfk)
    else:
        if len(sfb_list) != l:
            raise ArgumentError("len(sfb_list)", len(sfb_list), f"{l} (L, the length of padded_offsets)")
        blocks = np.stack([_float32_scales(x, f"sfb_list[{i}]", (nb, sfk)) for i, x in enumerate(sfb_list)])
    rows = np.repeat(blocks, BLOCK, axis=1)[:, :n]
    return sfa, tuple(rows[e] for e in range(l)), "float32"


def _refuse_pointers(b_ptrs: Any, sfb_ptrs: Any) -> None:
    """Device pointer tables cannot be read on the host: the lists stand in for them."""
    for name, value, listed in (("b_ptrs", b_ptrs, "b_list"), ("sfb_ptrs", sfb_ptrs, "sfb_list")):
        if value is not None:
            raise ArgumentError(name, "device pointers", "None (the host reference cannot read "
                                "device memory)", f"Pass the per-expert arrays as {listed} instead")


def _check_b_options(b_dtype: Any, b_major: str, ab: str, allowed: Sequence[str]) -> None:
    """``b_dtype`` and ``b_major`` agree with the weights (they describe discrete weights on the GPU)."""
    if b_dtype is not None and elem_of(dtype_option(b_dtype, "b_dtype", allowed)) != ab:
        raise ArgumentError("b_dtype", repr(b_dtype), f"None or {ab} (the dtype of the weights)")
    majors = ("k", "n") if ab in FP8_NAMES else ("k",)
    if b_major not in majors:
        raise ArgumentError("b_major", repr(b_major), f"{', '.join(map(repr, majors))} (with {ab} "
                            "weights)")


def parse_grouped(
    *,
    a_tensor: Any,
    b_tensor: Any,
    b_list: Sequence[Any] | None,
    padded_offsets: Any,
    m_aligned: int,
    acc: str,
    n: int | None = None,
    b_dtype: Any = None,
    b_major: str = "k",
    b_ptrs: Any = None,
    sfa_tensor: Any = None,
    sfb_tensor: Any = None,
    sfb_list: Sequence[Any] | None = None,
    sfb_ptrs: Any = None,
    sf_vec_size: int | None = None,
) -> GroupedOperands:
    """Parse the operands of any grouped op; ``sf_vec_size=None`` means the BF16 op (no scales)."""
    blockscaled = sf_vec_size is not None
    _refuse_pointers(b_ptrs, sfb_ptrs)
    allowed = BLOCKSCALED_AB if blockscaled else ("bfloat16",)
    a, ab, canonical = _parse_a(a_tensor, allowed)
    m, kb = int(a.shape[0]), int(a.shape[1])
    k = logical_k(kb, ab)
    offsets = parse_offsets(padded_offsets, m, m_aligned)
    l = int(offsets.size)
    experts = _parse_weights(b_tensor, b_list, kb, l, ab, allowed)
    _check_b_options(b_dtype, b_major, ab, allowed)
    n_out = int(experts[0].shape[0])
    if n is not None and n != n_out:
        raise ArgumentError("n", n, f"None or {n_out} (the weights' N)")
    sfa = sfb = sf = None
    if blockscaled:
        sfa, sfb, sf = _parse_grouped_scales(sfa_tensor, sfb_tensor, sfb_list, ab, sf_vec_size, m, n_out, k, l)
    return GroupedOperands(
        a=a, sfa=sfa, b=experts, sfb=sfb, ab=ab, sf=sf, sf_vec_size=sf_vec_size, k=k, n=n_out,
        offsets=offsets, canonical=canonical, acc=acc,
    )
