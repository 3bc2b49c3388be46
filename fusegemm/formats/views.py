"""Canonical (natural row-major) tensors and the kernel-facing views the seed pages document.

| tensor | canonical   | kernel-facing                                 |
|--------|-------------|-----------------------------------------------|
| A      | (M, K)      | (M, K, 1), strides (K, 1, M*K)                 |
| B      | (L, N, K)   | (N, K, L), strides (K, 1, N*K): ``b.permute(1, 2, 0)`` |
| prob   | (M,)        | (M, 1, 1), strides (1, 1, 1)                   |
| C / D  | (M, N)      | (M, N, 1), strides (N, 1, M*N)                 |

(Strides in elements, for a C-contiguous canonical input; the added unit axis gets the stride
the seed pages state.)

Every function returns a view (no copy) and works on numpy arrays and torch tensors alike.
Packed FP4 tensors keep their byte shape (K/2 or N/2 innermost).
"""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "a_to_kernel",
    "a_from_kernel",
    "b_to_kernel",
    "b_from_kernel",
    "prob_to_kernel",
    "prob_from_kernel",
    "cd_to_kernel",
    "cd_from_kernel",
]


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


def _permute(x: Any, axes: tuple[int, ...]) -> Any:
    return x.permute(*axes) if hasattr(x, "permute") else np.transpose(x, axes)


def _with_unit_axes(x: Any, extra_strides: tuple[int, ...]) -> Any:
    """``x`` with trailing size-1 axes whose strides (in elements) are ``extra_strides``.

    The strides of a size-1 axis never matter for addressing, but the seed pages state them
    (e.g. A (K, 1, M*K)) and stride checks compare them, so they are set exactly.
    """
    shape = _shape(x) + (1,) * len(extra_strides)
    if hasattr(x, "as_strided") and hasattr(x, "stride"):
        return x.as_strided(shape, tuple(x.stride()) + extra_strides, x.storage_offset())
    item = x.itemsize
    strides = tuple(x.strides) + tuple(s * item for s in extra_strides)
    # as_strided goes through __array_interface__, which cannot spell every ml_dtypes dtype
    # (float8_e5m2 has kind 'f' and size 1): stride a same-size unsigned view, then view back.
    raw = x.view(np.dtype(f"u{item}"))
    return np.lib.stride_tricks.as_strided(raw, shape, strides, writeable=x.flags.writeable).view(x.dtype)


def _matrix_size(x: Any) -> int:
    return int(np.prod(_shape(x)))


def _expect(x: Any, argument: str, ndim: int, layout: str, unit_axes: tuple[int, ...] = ()) -> None:
    shape = _shape(x)
    if len(shape) != ndim or any(shape[i] != 1 for i in unit_axes):
        raise ValueError(f"{argument} must have shape {layout}; got {shape}")


def a_to_kernel(a: Any) -> Any:
    """A ``(M, K)`` to the kernel-facing ``(M, K, 1)`` view.

    Parameters
    ----------
    a : (M, K) numpy array or torch tensor
    """
    _expect(a, "a", 2, "(M, K)")
    return _with_unit_axes(a, (_matrix_size(a),))


def a_from_kernel(a: Any) -> Any:
    """Kernel-facing A ``(M, K, 1)`` to canonical ``(M, K)``.

    Parameters
    ----------
    a : (M, K, 1) numpy array or torch tensor
    """
    _expect(a, "a", 3, "(M, K, 1)", (2,))
    return a[:, :, 0]


def b_to_kernel(b: Any) -> Any:
    """B ``(L, N, K)`` to the kernel-facing ``(N, K, L)`` view (``permute(1, 2, 0)``).

    Parameters
    ----------
    b : (L, N, K) numpy array or torch tensor
    """
    _expect(b, "b", 3, "(L, N, K)")
    return _permute(b, (1, 2, 0))


def b_from_kernel(b: Any) -> Any:
    """Kernel-facing B ``(N, K, L)`` to canonical ``(L, N, K)`` (``permute(2, 0, 1)``).

    Parameters
    ----------
    b : (N, K, L) numpy array or torch tensor
    """
    _expect(b, "b", 3, "(N, K, L)")
    return _permute(b, (2, 0, 1))


def prob_to_kernel(prob: Any) -> Any:
    """prob ``(M,)`` to the kernel-facing ``(M, 1, 1)`` view.

    Parameters
    ----------
    prob : (M,) numpy array or torch tensor
    """
    _expect(prob, "prob", 1, "(M,)")
    return _with_unit_axes(prob, (1, 1))


def prob_from_kernel(prob: Any) -> Any:
    """Kernel-facing prob ``(M, 1, 1)`` to canonical ``(M,)``.

    Parameters
    ----------
    prob : (M, 1, 1) numpy array or torch tensor
    """
    _expect(prob, "prob", 3, "(M, 1, 1)", (1, 2))
    return prob[:, 0, 0]


def cd_to_kernel(x: Any) -> Any:
    """C or D ``(M, N)`` to the kernel-facing ``(M, N, 1)`` view.

    Parameters
    ----------
    x : (M, N) numpy array or torch tensor
    """
    _expect(x, "x", 2, "(M, N)")
    return _with_unit_axes(x, (_matrix_size(x),))


def cd_from_kernel(x: Any) -> Any:
    """Kernel-facing C or D ``(M, N, 1)`` to canonical ``(M, N)``.

    Parameters
    ----------
    x : (M, N, 1) numpy array or torch tensor
    """
    _expect(x, "x", 3, "(M, N, 1)", (2,))
    return x[:, :, 0]
