"""GEMM operands of the references: parse A/B/SFA/SFB in any accepted layout, dequantize, accumulate.

Accumulation: per expert, ``dequant(A_e) @ dequant(B_e)^T`` with BLAS over float32 operands
(``acc_dtype="float32"``, the kernels' accumulator type; the summation order differs from the
tensor cores', so results agree to FP32 rounding, not bit for bit) or float64 operands
(``acc_dtype="float64"``: every product and partial sum is exact or nearly so, giving the
correctly rounded FP32 value of the dot product — a kernel-independent oracle, ~3x slower).
Dequantized values are exact in float32 (FP8/FP4 element times a power-of-two or e4m3 scale).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..formats.blockscale import block_format
from ..formats.dtypes import FP8_NAMES, resolve_dtype, to_numpy
from ..formats.elements import to_float32
from ..formats.scales import unpack_sf
from ._args import expert_ranges, parse_offsets

BLOCKSCALED_AB = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2", "uint8", "float4_e2m1fn")
SF_DTYPES = ("float8_e8m0fnu", "float8_e4m3fn", "uint8", "int8")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def elem_name(arr: np.ndarray, argument: str, allowed: Sequence[str]) -> str:
    """Canonical element name of an A/B array (``uint8`` means packed FP4)."""
    name = resolve_dtype(arr.dtype, argument=f"{argument}.dtype", allowed=allowed)
    return "float4_e2m1fn_x2" if name == "uint8" else name


def sf_name(arr: np.ndarray, argument: str) -> str:
    """Canonical scale dtype name (raw ``uint8``/``int8`` bytes are E8M0, as in the seed pages)."""
    name = resolve_dtype(arr.dtype, argument=f"{argument}.dtype", allowed=SF_DTYPES)
    return "float8_e8m0fnu" if name in ("uint8", "int8") else name


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


def parse_scales(buf: Any, argument: str, mn: int, sfk: int, l: int) -> tuple[np.ndarray, str]:
    """Logical float32 scales ``(L, mn, sfk)`` and their dtype name from any accepted SF form."""
    arr = to_numpy(buf, argument=argument)
    name = sf_name(arr, argument)
    logical = unpack_sf(arr.view(np.uint8), mn, sfk, l=l, batch_first=True)
    return decode_scales(logical, name), name


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
    a = to_numpy(a_tensor, argument="a_tensor")
    if a.ndim == 3 and a.shape[2] == 1:
        a2, canonical = a[:, :, 0], False
    elif a.ndim == 2:
        a2, canonical = a, True
    else:
        raise ValueError(
            f"a_tensor has shape {tuple(a.shape)}; expected (M, K, 1) (kernel-facing) or (M, K) "
            "(canonical); packed FP4 has K/2 innermost"
        )
    return a2, elem_name(a2, "a_tensor", allowed), canonical


def _parse_dense_b(b_tensor: Any, kb: int, l: int) -> np.ndarray:
    """B as ``(L, N, Kb)`` from the kernel-facing ``(N, Kb, L)`` view or canonical ``(L, N, Kb)``."""
    b = to_numpy(b_tensor, argument="b_tensor")
    if b.ndim != 3:
        raise ValueError(f"b_tensor has shape {tuple(b.shape)}; expected (N, K, L) or (L, N, K)")
    kernel = b.shape[1] == kb and b.shape[2] == l
    canonical = b.shape[0] == l and b.shape[2] == kb
    if kernel and canonical:
        # Same shape both ways (N == K == L): the seed's view has K unit-stride and L outermost.
        canonical = not (b.strides[2] >= b.strides[0] >= b.strides[1])
        kernel = not canonical
    if kernel:
        return np.transpose(b, (2, 0, 1))
    if canonical:
        return b
    raise ValueError(
        f"b_tensor has shape {tuple(b.shape)}; with K={kb} (stored, from a_tensor) and L={l} "
        f"(from padded_offsets) expected (N, {kb}, {l}) (kernel-facing) or ({l}, N, {kb}) (canonical)"
    )


def _parse_weights(
    b_tensor: Any, b_list: Sequence[Any] | None, kb: int, l: int, ab: str, allowed: Sequence[str]
) -> tuple[np.ndarray, ...]:
    """Per-expert ``(N, Kb)`` weights from a dense B (either layout) or a per-expert list."""
    if (b_tensor is None) == (b_list is None):
        raise ValueError(
            "pass exactly one of b_tensor (dense weights) and b_list (one (N, K) array per expert); "
            f"got b_tensor={'set' if b_tensor is not None else None}, "
            f"b_list={'set' if b_list is not None else None}"
        )
    if b_tensor is not None:
        b_lnk = _parse_dense_b(b_tensor, kb, l)
        names = {elem_name(b_lnk, "b_tensor", allowed)}
        experts = tuple(b_lnk[e] for e in range(l))
    else:
        experts = tuple(to_numpy(x, argument=f"b_list[{i}]") for i, x in enumerate(b_list))
        if len(experts) != l:
            raise ValueError(f"b_list has {len(experts)} arrays; expected L={l} (len(padded_offsets))")
        shapes = {tuple(x.shape) for x in experts}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2 or next(iter(shapes))[1] != kb:
            raise ValueError(f"b_list arrays must all have shape (N, {kb}); got shapes {sorted(shapes)}")
        names = {elem_name(x, f"b_list[{i}]", allowed) for i, x in enumerate(experts)}
    if names != {ab}:
        raise ValueError(f"B dtype {', '.join(sorted(names))} must match a_tensor dtype {ab}")
    return experts


def _parse_grouped_scales(
    sfa_tensor: Any, sfb_tensor: Any, sfb_list: Sequence[Any] | None, ab: str, vec: int,
    m: int, n: int, k: int, l: int,
) -> tuple[np.ndarray, tuple[np.ndarray, ...], str]:
    """Logical float32 SFA ``(M, sfk)``, per-expert SFB ``(N, sfk)`` and the scale dtype name."""
    if sfa_tensor is None:
        raise ValueError(f"sfa_tensor is required for block-scaled A/B ({ab})")
    sf = sf_name(to_numpy(sfa_tensor, argument="sfa_tensor"), "sfa_tensor")
    block_format(ab, sf, vec)  # raises for the invalid (ab, sf, sf_vec_size) combinations
    sfk = _ceil_div(k, vec)
    sfa = parse_scales(sfa_tensor, "sfa_tensor", m, sfk, 1)[0][0]
    if (sfb_tensor is None) == (sfb_list is None):
        raise ValueError("pass exactly one of sfb_tensor (dense) and sfb_list (one SF buffer per expert)")
    if sfb_tensor is not None:
        sfb_all, sfb_dtype = parse_scales(sfb_tensor, "sfb_tensor", n, sfk, l)
        sfb, dtypes = tuple(sfb_all[e] for e in range(l)), {sfb_dtype}
    else:
        if len(sfb_list) != l:
            raise ValueError(f"sfb_list has {len(sfb_list)} buffers; expected L={l}")
        parsed = [parse_scales(x, f"sfb_list[{i}]", n, sfk, 1) for i, x in enumerate(sfb_list)]
        sfb, dtypes = tuple(p[0][0] for p in parsed), {p[1] for p in parsed}
    if dtypes != {sf}:
        raise ValueError(f"SFB dtype {', '.join(sorted(dtypes))} must match SFA dtype {sf}")
    return sfa, sfb, sf


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
    for name, value in (("b_ptrs", b_ptrs), ("sfb_ptrs", sfb_ptrs)):
        if value is not None:
            raise ValueError(
                f"{name} holds device pointers, which the host reference cannot read; pass the "
                f"per-expert arrays as {'b_list' if name == 'b_ptrs' else 'sfb_list'} instead"
            )
    allowed = BLOCKSCALED_AB if blockscaled else ("bfloat16",)
    a, ab, canonical = _parse_a(a_tensor, allowed)
    m, kb = int(a.shape[0]), int(a.shape[1])
    k = logical_k(kb, ab)
    offsets = parse_offsets(padded_offsets, m, m_aligned)
    l = int(offsets.size)
    experts = _parse_weights(b_tensor, b_list, kb, l, ab, allowed)
    if b_dtype is not None:
        want = resolve_dtype(b_dtype, argument="b_dtype", allowed=allowed)
        if ("float4_e2m1fn_x2" if want == "uint8" else want) != ab:
            raise ValueError(f"b_dtype={b_dtype!r} does not match the weights' dtype {ab}")
    if b_major not in ("k", "n") or (b_major == "n" and ab not in FP8_NAMES):
        allowed_major = "'k', 'n'" if ab in FP8_NAMES else "'k'"
        raise ValueError(f"b_major={b_major!r} is not supported for ab_dtype {ab}; allowed: {allowed_major}")
    n_out = int(experts[0].shape[0])
    if n is not None and n != n_out:
        raise ValueError(f"n={n!r} does not match the weights' N={n_out}")
    sfa = sfb = sf = None
    if blockscaled:
        sfa, sfb, sf = _parse_grouped_scales(sfa_tensor, sfb_tensor, sfb_list, ab, sf_vec_size, m, n_out, k, l)
    return GroupedOperands(
        a=a, sfa=sfa, b=experts, sfb=sfb, ab=ab, sf=sf, sf_vec_size=sf_vec_size, k=k, n=n_out,
        offsets=offsets, canonical=canonical, acc=acc,
    )
