"""Argument handling of the references beyond the seed contract of :mod:`fusegemm.arguments`.

The seed's rules (A's rows, padded_offsets, per-expert and per-row vectors, dense B, bias, C/D
shapes, option choices) are checked by :mod:`fusegemm.arguments`, exactly as for the GPU ops.
What stays here is what only a host reference does or allows: reading padded_offsets values on
the host, ``acc_dtype="float64"``, ``e5m2_rcp_max``, optional prob with ones as default, a Python
number for ``norm_const_tensor``, and the float32 host copies the math runs on. Every error is an
:class:`~fusegemm.base.errors.ArgumentError`: ``name: got <value>; allowed: <what>``.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from ..arguments import M_ALIGNED, choice, offsets, offsets_values, vector
from ..base.errors import ArgumentError
from ..formats.numpy_dtypes import dtype_name, to_numpy
from ..formats.elements import to_float32
from ..runtime.tensors import TensorView

ACC_DTYPES = ("float32", "float64")
EPILOGUE_OPS = (None, "none", "identity", "relu", "srelu")
E5M2_RCP_MAX = {"page": 1.0 / 57344.0, "nvidia": 1.0 / 128.0}
BIAS_DTYPES = ("bfloat16", "float16", "float32")
# The host reads offsets itself, so int64 (numpy's default integer) is accepted beside the seed's int32.
OFFSET_DTYPES = ("int32", "int64")
# What the message says a vector holds (the ops' wording).
PER_EXPERT = "(one scale per expert)"
PER_ROW = "(one gate per row)"


def dtype_option(value: Any, name: str, allowed: Iterable[str], *, context: str = "") -> str:
    """Canonical name of a dtype option (numpy/ml_dtypes/torch dtype or name) among ``allowed``.

    ``context`` qualifies the allowed list when it depends on other arguments
    (``"(with FP8 A/B)"``).
    """
    allowed = tuple(allowed)
    got = dtype_name(value) if value is not None else None
    if got is None or got not in allowed:
        # Show every spelling (numpy dtype, torch dtype, str) the same way: as its name.
        shown = value if isinstance(value, str) else (got or str(value))
        raise ArgumentError(name, repr(shown), f"{', '.join(allowed)} {context}".rstrip())
    return got


def host_float32(v: TensorView) -> np.ndarray:
    """float32 host copy of a validated tensor (the references compute in float32)."""
    return to_float32(to_numpy(v.obj)).astype(np.float32, copy=False)


def host_vector(v: TensorView) -> np.ndarray:
    """A validated ``(n,)``, ``(n, 1)`` or ``(n, 1, 1)`` vector as float32 ``(n,)``."""
    return host_float32(v).reshape(v.shape[0])


def scalar_float(x: Any, name: str) -> np.float32:
    """A float32 scalar from a ``(1,)`` float32 tensor or a Python number (host convenience)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return np.float32(x)
    return np.float32(host_vector(vector(x, name, 1, dtypes=("float32",)))[0])


def parse_offsets(padded_offsets: Any, rows: int, m_aligned: int) -> np.ndarray:
    """Validated cumulative expert ends as int64 ``(L,)``.

    Shape and dtype follow the seed contract; the reference can read offsets on the host, so it
    always checks their values too (nondecreasing multiples of 256, the last at most ``rows``).
    """
    choice(m_aligned, "m_aligned", (M_ALIGNED,))
    off, _ = offsets(padded_offsets, dtypes=OFFSET_DTYPES)
    values = to_numpy(off.obj, argument="padded_offsets").astype(np.int64)
    offsets_values(values.tolist(), rows)
    return values


def expert_ranges(offsets: np.ndarray) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` row range of each expert."""
    starts = np.concatenate([[0], offsets[:-1]])
    return [(int(a), int(b)) for a, b in zip(starts, offsets)]


def row_expert(offsets: np.ndarray) -> np.ndarray:
    """Expert index of each row below valid_m (int64 ``(valid_m,)``)."""
    counts = np.diff(np.concatenate([[0], offsets]))
    return np.repeat(np.arange(offsets.size), counts)


def resolve_acc(acc_dtype: Any) -> str:
    """Accumulation dtype name: ``float32`` (the kernels') or ``float64`` (exact oracle)."""
    return dtype_option(acc_dtype, "acc_dtype", ACC_DTYPES)


def check_common(*, cd_major: str = "n", acc_dtype: Any = "float32") -> str:
    """Validate options every grouped wrapper shares; return the accumulation dtype name."""
    choice(cd_major, "cd_major", ("n",))
    return resolve_acc(acc_dtype)


def rcp_max(d_name: str, e5m2_rcp_max: str) -> np.float32:
    """fp32 reciprocal of the output format's max used by SFD (page vs NVIDIA for e5m2)."""
    choice(e5m2_rcp_max, "e5m2_rcp_max", tuple(E5M2_RCP_MAX))
    if d_name == "float8_e4m3fn":
        return np.float32(1.0 / 448.0)
    if d_name == "float8_e5m2":
        return np.float32(E5M2_RCP_MAX[e5m2_rcp_max])
    return np.float32(1.0 / 6.0)


def parse_prob(prob_tensor: Any, m: int, *, required: bool, allowed: Sequence[str] = ("float32",)) -> np.ndarray:
    """prob as float32 ``(M,)`` from ``(M, 1, 1)`` or ``(M,)``; ones when omitted and optional."""
    if prob_tensor is None:
        if required:
            raise ArgumentError(
                "prob_tensor", None, f"a ({m},) or ({m}, 1, 1) {' or '.join(allowed)} tensor",
                f"The kernel multiplies by the per-row gating probability; pass ones of shape "
                f"({m}, 1, 1) for no gating")
        return np.ones(m, dtype=np.float32)
    return host_vector(vector(prob_tensor, "prob_tensor", m, dtypes=allowed, what=PER_ROW))


def parse_norm_const(norm_const_tensor: Any, needed: bool) -> np.float32 | None:
    """``norm_const`` as float32 when SFD outputs are produced (then it is required)."""
    if not needed:
        return None
    if norm_const_tensor is None:
        raise ArgumentError(
            "norm_const_tensor", None, "a (1,) float32 tensor",
            "It is required when FP8 A/B produce an FP8/FP4 D (SFD outputs), e.g. "
            "numpy.array([0.01], numpy.float32)")
    return scalar_float(norm_const_tensor, "norm_const_tensor")


def d_dtypes_for(is_fp8: bool, fp8_allowed: tuple[str, ...], fp4_allowed: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """Allowed D dtypes and the context naming the input kind, for error messages."""
    if is_fp8:
        return fp8_allowed, "(with FP8 A/B)"
    return fp4_allowed, "(with FP4 A/B)"
