"""Argument parsing shared by the references: vectors, offsets, dtypes, wrapper-only options.

Every check raises ValueError/TypeError naming the argument, the value received and what is
allowed. Nothing here does arithmetic beyond converting to float32.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from ..formats.dtypes import array_dtype_name, resolve_dtype, to_numpy
from ..formats.elements import to_float32

MAX_EXPERTS = 1024
M_ALIGNED = 256
ACC_DTYPES = ("float32", "float64")
EPILOGUE_OPS = (None, "none", "identity", "relu", "srelu")
E5M2_RCP_MAX = {"page": 1.0 / 57344.0, "nvidia": 1.0 / 128.0}


def float_vector(
    x: Any,
    argument: str,
    length: int,
    *,
    shapes: str,
    allowed: Iterable[str] = ("float32",),
    trailing_ones: int = 0,
) -> np.ndarray:
    """A float32 ``(length,)`` vector from ``(length,)`` or ``(length, 1, ...)`` input."""
    arr = to_numpy(x, argument=argument)
    resolve_dtype(arr.dtype, argument=f"{argument}.dtype", allowed=allowed)
    ok_shapes = {(length,), (length,) + (1,) * trailing_ones}
    if tuple(arr.shape) not in ok_shapes:
        raise ValueError(f"{argument} has shape {tuple(arr.shape)}; expected {shapes}")
    return to_float32(arr).reshape(length).astype(np.float32)


def scalar_float(x: Any, argument: str) -> np.float32:
    """A float32 scalar from a ``(1,)`` tensor, a 0-d array or a Python number."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return np.float32(x)
    arr = to_numpy(x, argument=argument)
    if arr.size != 1:
        raise ValueError(f"{argument} must hold one value (shape (1,)); got shape {tuple(arr.shape)}")
    resolve_dtype(arr.dtype, argument=f"{argument}.dtype", allowed=("float32",))
    return np.float32(arr.reshape(()))


def parse_offsets(padded_offsets: Any, rows: int, m_aligned: int) -> np.ndarray:
    """Validated cumulative expert ends as int64 ``(L,)``.

    The reference can read offsets on the host, so it always checks their values: nondecreasing,
    multiples of 256, the last one at most the row count of A.
    """
    if m_aligned != M_ALIGNED:
        raise ValueError(f"m_aligned={m_aligned!r} is not supported; allowed: {M_ALIGNED}")
    arr = to_numpy(padded_offsets, argument="padded_offsets")
    if arr.ndim != 1 or not 1 <= arr.shape[0] <= MAX_EXPERTS:
        raise ValueError(
            f"padded_offsets has shape {tuple(arr.shape)}; expected (L,) with 1 <= L <= {MAX_EXPERTS}"
        )
    name = array_dtype_name(arr)
    if name not in ("int32", "int64"):
        raise ValueError(f"padded_offsets.dtype={arr.dtype} is not supported; allowed: int32 (or int64)")
    offsets = arr.astype(np.int64)
    starts = np.concatenate([[0], offsets[:-1]])
    bad = np.flatnonzero((offsets < starts) | (offsets % M_ALIGNED != 0))
    if bad.size:
        e = int(bad[0])
        raise ValueError(
            f"padded_offsets[{e}]={int(offsets[e])} is invalid: offsets must be nondecreasing "
            f"multiples of {M_ALIGNED} (previous end {int(starts[e])}); got {offsets.tolist()[:16]}"
        )
    if offsets[-1] > rows:
        raise ValueError(
            f"padded_offsets[-1]={int(offsets[-1])} (valid_m) exceeds the {rows} rows of a_tensor"
        )
    return offsets


def expert_ranges(offsets: np.ndarray) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` row range of each expert."""
    starts = np.concatenate([[0], offsets[:-1]])
    return [(int(a), int(b)) for a, b in zip(starts, offsets)]


def row_expert(offsets: np.ndarray) -> np.ndarray:
    """Expert index of each row below valid_m (int64 ``(valid_m,)``)."""
    counts = np.diff(np.concatenate([[0], offsets]))
    return np.repeat(np.arange(offsets.size), counts)


def check_choice(value: Any, argument: str, allowed: Iterable[Any]) -> None:
    """Raise ValueError unless ``value`` is one of ``allowed``."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{argument}={value!r} is not supported; allowed: {', '.join(map(repr, allowed))}")


def resolve_acc(acc_dtype: Any) -> str:
    """Accumulation dtype name: ``float32`` (the kernels') or ``float64`` (exact oracle)."""
    return resolve_dtype(acc_dtype, argument="acc_dtype", allowed=ACC_DTYPES)


def check_common(*, cd_major: str = "n", acc_dtype: Any = "float32") -> str:
    """Validate options every grouped wrapper shares; return the accumulation dtype name."""
    check_choice(cd_major, "cd_major", ("n",))
    return resolve_acc(acc_dtype)


def rcp_max(d_name: str, e5m2_rcp_max: str) -> np.float32:
    """fp32 reciprocal of the output format's max used by SFD (page vs NVIDIA for e5m2)."""
    check_choice(e5m2_rcp_max, "e5m2_rcp_max", tuple(E5M2_RCP_MAX))
    if d_name == "float8_e4m3fn":
        return np.float32(1.0 / 448.0)
    if d_name == "float8_e5m2":
        return np.float32(E5M2_RCP_MAX[e5m2_rcp_max])
    return np.float32(1.0 / 6.0)


BIAS_DTYPES = ("bfloat16", "float16", "float32")


def parse_bias(bias_tensor: Any, n: int, l: int) -> np.ndarray | None:
    """Bias as float32 ``(N, L)`` (logical ``bias[n, e]``; the kernel's strides are (1, N))."""
    if bias_tensor is None:
        return None
    bias = to_numpy(bias_tensor, argument="bias_tensor")
    resolve_dtype(bias.dtype, argument="bias_tensor.dtype", allowed=BIAS_DTYPES)
    if tuple(bias.shape) != (n, l):
        raise ValueError(f"bias_tensor has shape {tuple(bias.shape)}; expected (N, L) = {(n, l)}")
    return to_float32(bias)


def parse_prob(prob_tensor: Any, m: int, *, required: bool, allowed: Sequence[str] = ("float32",)) -> np.ndarray:
    """prob as float32 ``(M,)`` from ``(M, 1, 1)`` or ``(M,)``; ones when omitted and optional."""
    if prob_tensor is None:
        if required:
            raise ValueError(
                "prob_tensor is required (the kernel multiplies by the per-row gating "
                f"probability); pass ones of shape ({m}, 1, 1) for no gating"
            )
        return np.ones(m, dtype=np.float32)
    return float_vector(
        prob_tensor, "prob_tensor", m, shapes=f"({m}, 1, 1) or ({m},)", allowed=allowed, trailing_ones=2
    )


def parse_norm_const(norm_const_tensor: Any, needed: bool) -> np.float32 | None:
    """``norm_const`` as float32 when SFD outputs are produced (then it is required)."""
    if not needed:
        return None
    if norm_const_tensor is None:
        raise ValueError(
            "norm_const_tensor is required when FP8 A/B produce an FP8/FP4 D (SFD outputs); "
            "pass a (1,) float32 array, e.g. numpy.array([0.01], numpy.float32)"
        )
    return scalar_float(norm_const_tensor, "norm_const_tensor")


def d_dtypes_for(is_fp8: bool, fp8_allowed: tuple[str, ...], fp4_allowed: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """Allowed D dtypes and the argument label naming the input kind, for error messages."""
    if is_fp8:
        return fp8_allowed, "d_dtype (with FP8 A/B)"
    return fp4_allowed, "d_dtype (with FP4 A/B)"
