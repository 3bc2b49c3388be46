"""The 32x4x4 scale-factor atom layout the SM100 block-scaled MMA reads, and its variants.

Three forms hold the same scales ``sf[mn, k, l]`` (``k`` counts ``sf_vec_size`` blocks):

* **logical** ``(mn, sfk, L)`` (or ``(L, mn, sfk)`` with ``batch_first=True``);
* **physical**, the C-contiguous buffer ``(L, ceil(mn/128), ceil(sfk/4), 32, 4, 4)``, zero padded,
  with ``phys[l, m//128, k//4, m%32, (m%128)//32, k%4] = sf[m, k, l]``;
* **kernel-facing view** ``phys.transpose(3, 4, 1, 5, 2, 0)`` of shape
  ``(32, 4, ceil(mn/128), 4, ceil(sfk/4), L)``: the SF shape the seed pages document, a strided
  view of the physical bytes (``view[m%32, (m//32)%4, m//128, k%4, k//4, l]``).

A flat 1-D buffer holding the physical bytes in order is accepted wherever a physical buffer is.

``discrete_col_sfd`` (column scales of a grouped output, see ``notes/sfd-semantics.md`` §2) keeps
the physical shape ``(1, ceil(N/128), RM, 32, 4, 4)`` but orders the 512-byte atoms by expert:
expert e (rows ``[o[e-1], o[e])``) owns the atoms ``[o[e-1]/128 * NT, o[e]/128 * NT)`` and, inside
them, atom ``j * T_e + i`` holds column tile ``j = n // 128`` and row tile
``i = (m - o[e-1]) // 128`` (``T_e`` = its row tiles, ``NT = ceil(N/128)``). That is the
concatenation over experts of ``pack_sf`` of each expert's slice.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..base.docstrings import shares_parameters
from .numpy_dtypes import to_numpy

__all__ = [
    "sf_physical_shape",
    "sf_view_shape",
    "pack_sf",
    "unpack_sf",
    "sf_to_kernel_view",
    "sf_from_kernel_view",
    "as_sf_physical",
    "pack_sf_discrete_col",
    "unpack_sf_discrete_col",
]

_ATOM_MN = 128
_ATOM_K = 4
_ATOM_BYTES = 512
_TO_VIEW = (3, 4, 1, 5, 2, 0)
_FROM_VIEW = (5, 2, 4, 0, 1, 3)  # inverse permutation of _TO_VIEW


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_dims(mn: int, sfk: int, l: int = 1) -> None:
    for name, value, low in (("mn", mn, 0), ("sfk", sfk, 0), ("l", l, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name}={value!r} must be an int >= {low}")


def sf_physical_shape(mn: int, sfk: int, l: int = 1) -> tuple[int, ...]:
    """``(L, ceil(mn/128), ceil(sfk/4), 32, 4, 4)``: the C-contiguous buffer's shape.

    Parameters
    ----------
    mn : int
        Rows of the scaled operand (M or N).
    sfk : int
        Scale blocks along K (ceil(K / sf_vec_size)).
    l : int
        Batch / expert count L (default 1).
    """
    _check_dims(mn, sfk, l)
    return (l, _ceil_div(mn, _ATOM_MN), _ceil_div(sfk, _ATOM_K), 32, 4, 4)


@shares_parameters(sf_physical_shape)
def sf_view_shape(mn: int, sfk: int, l: int = 1) -> tuple[int, ...]:
    """``(32, 4, ceil(mn/128), 4, ceil(sfk/4), L)``: the kernel-facing view's shape."""
    phys = sf_physical_shape(mn, sfk, l)
    return tuple(phys[i] for i in _TO_VIEW)


def sf_to_kernel_view(phys: Any) -> Any:
    """Kernel-facing view of a physical buffer: ``phys.transpose(3, 4, 1, 5, 2, 0)``.

    Works on numpy arrays (a view) and torch tensors (``permute``, also a view).
    
    Parameters
    ----------
    phys : (L, ceil(mn/128), ceil(sfk/4), 32, 4, 4) numpy array or torch tensor
    """
    if _shape(phys)[3:] != (32, 4, 4) or len(_shape(phys)) != 6:
        raise ValueError(f"phys must have shape (L, MT, KT, 32, 4, 4); got {_shape(phys)}")
    return _permute(phys, _TO_VIEW)


def sf_from_kernel_view(view: Any) -> Any:
    """Physical buffer of a kernel-facing view (the inverse permutation; a view, not a copy).

    Parameters
    ----------
    view : (32, 4, ceil(mn/128), 4, ceil(sfk/4), L) numpy array or torch tensor
    """
    shape = _shape(view)
    if len(shape) != 6 or shape[0] != 32 or shape[1] != 4 or shape[3] != 4:
        raise ValueError(f"view must have shape (32, 4, MT, 4, KT, L); got {shape}")
    return _permute(view, _FROM_VIEW)


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


def _permute(x: Any, axes: tuple[int, ...]) -> Any:
    return x.permute(*axes) if hasattr(x, "permute") else np.transpose(x, axes)


def pack_sf(sf: Any, *, batch_first: bool = False) -> np.ndarray:
    """Logical scales to the physical atom buffer.

    Parameters
    ----------
    sf : array (mn, sfk), (mn, sfk, L), or (L, mn, sfk) with ``batch_first=True``
        Scale factors in any dtype (E8M0, e4m3 or raw ``uint8``); the dtype is kept.
    batch_first : bool
        ``sf`` has the batch/expert axis first.

    Returns
    -------
    numpy.ndarray
        C-contiguous ``(L, ceil(mn/128), ceil(sfk/4), 32, 4, 4)``, padding bytes zero.
    """
    arr = to_numpy(sf, argument="sf")
    if arr.ndim == 2:
        arr = arr[:, :, None]
    elif arr.ndim == 3 and batch_first:
        arr = np.moveaxis(arr, 0, -1)
    elif arr.ndim != 3:
        raise ValueError(f"sf must be 2-D (mn, sfk) or 3-D; got shape {arr.shape}")
    mn, sfk, l = arr.shape
    phys_shape = sf_physical_shape(mn, sfk, l)
    mt, kt = phys_shape[1], phys_shape[2]
    padded = np.zeros((mt * _ATOM_MN, kt * _ATOM_K, l), dtype=arr.dtype)
    padded[:mn, :sfk] = arr
    # m = mt*128 + m1*32 + m0 and k = kt*4 + k0  ->  phys[l, mt, kt, m0, m1, k0]
    tiles = padded.reshape(mt, 4, 32, kt, 4, l)
    return np.ascontiguousarray(tiles.transpose(5, 0, 3, 2, 1, 4))


def as_sf_physical(buf: Any, mn: int, sfk: int, l: int | None = None, *, argument: str = "sf") -> np.ndarray:
    """Physical 6-D form of a scale buffer given as physical, kernel-facing view, or flat 1-D.

    Parameters
    ----------
    buf : array or tensor
        The scale bytes in one of the three accepted forms.
    mn : int
        Logical extents, to check (or, for a flat buffer, to derive) the shape.
    sfk : int
        Logical extents, to check (or, for a flat buffer, to derive) the shape.
    l : int, optional
        Batch/expert count; inferred from the buffer when omitted.
    argument : str
        Name used in error messages.
    """
    arr = to_numpy(buf, argument=argument)
    phys_l1 = sf_physical_shape(mn, sfk, 1)
    per_batch = int(np.prod(phys_l1))
    if arr.ndim == 1:
        if arr.size % per_batch or arr.size == 0 or (l is not None and arr.size != per_batch * l):
            want = f"{per_batch * l}" if l is not None else f"a positive multiple of {per_batch}"
            raise ValueError(
                f"{argument} is flat with {arr.size} elements; expected {want} "
                f"(physical shape {phys_l1[1:]} per batch for mn={mn}, sfk={sfk})"
            )
        return arr.reshape((arr.size // per_batch,) + phys_l1[1:])
    if arr.ndim == 6 and arr.shape[3:] == (32, 4, 4):
        phys = arr
    elif arr.ndim == 6 and arr.shape[0] == 32 and arr.shape[1] == 4 and arr.shape[3] == 4:
        phys = np.transpose(arr, _FROM_VIEW)
    else:
        raise ValueError(
            f"{argument} has shape {arr.shape}; expected the kernel-facing view "
            f"{sf_view_shape(mn, sfk, l or 1)}, the physical buffer "
            f"{sf_physical_shape(mn, sfk, l or 1)}, or a flat 1-D buffer"
        )
    if phys.shape[1:] != phys_l1[1:] or (l is not None and phys.shape[0] != l):
        raise ValueError(
            f"{argument} has shape {arr.shape}, which does not hold scales for mn={mn}, sfk={sfk}"
            + (f", l={l}" if l is not None else "")
            + f"; expected physical {sf_physical_shape(mn, sfk, l or phys.shape[0])} "
            f"or view {sf_view_shape(mn, sfk, l or phys.shape[0])}"
        )
    return phys


def unpack_sf(buf: Any, mn: int, sfk: int, *, l: int | None = None, batch_first: bool = False) -> np.ndarray:
    """Physical buffer (6-D, kernel-facing view, or flat) back to logical scales.

    Parameters
    ----------
    buf : scale buffer
        The physical 6-D atoms, their kernel-facing view, or the flat 1-D buffer.
    mn : int
        Rows of the scaled operand (M or N).
    sfk : int
        Scale blocks along K.
    l : int, optional
        Batch / expert count (read from a 6-D buffer when None).
    batch_first : bool
        Return ``(L, mn, sfk)`` instead of ``(mn, sfk, L)``.

    Returns
    -------
    numpy.ndarray
        ``(mn, sfk, L)``, or ``(L, mn, sfk)`` with ``batch_first=True``; the dtype is kept.
    """
    phys = as_sf_physical(buf, mn, sfk, l, argument="buf")
    l_, mt, kt = phys.shape[:3]
    # phys[l, mt, kt, m0, m1, k0] -> [mt, m1, m0, kt, k0, l]
    logical = phys.transpose(1, 4, 3, 2, 5, 0).reshape(mt * _ATOM_MN, kt * _ATOM_K, l_)
    out = logical[:mn, :sfk]
    return np.ascontiguousarray(np.moveaxis(out, -1, 0) if batch_first else out)


def _expert_ranges(padded_offsets: Any, rows: int) -> list[tuple[int, int]]:
    offsets = np.asarray(to_numpy(padded_offsets, argument="padded_offsets"), dtype=np.int64).ravel()
    starts = np.concatenate([[0], offsets[:-1]])
    if np.any(offsets % _ATOM_MN) or np.any(offsets < starts) or (offsets.size and offsets[-1] > rows):
        raise ValueError(
            f"padded_offsets={offsets.tolist()} must be nondecreasing multiples of 128 "
            f"ending at most at rows={rows}"
        )
    return [(int(a), int(b)) for a, b in zip(starts, offsets)]


def pack_sf_discrete_col(sf: Any, padded_offsets: Any, *, rows: int) -> np.ndarray:
    """Column scales of a grouped output in the ``discrete_col_sfd`` atom order.

    Parameters
    ----------
    sf : array (N, ceil(rows/32))
        Logical column scales ``sf[n, m // 32]`` of an output with ``rows`` rows.
    padded_offsets : array (L,)
        Cumulative expert row ends (multiples of 128; the ops require 256).
    rows : int
        Output rows M (``padded_offsets[-1] <= rows``); atoms for rows past the last offset
        stay zero.

    Returns
    -------
    numpy.ndarray
        C-contiguous ``(1, ceil(N/128), RM, 32, 4, 4)`` with ``RM = ceil(ceil(rows/32)/4)``.
    """
    arr = to_numpy(sf, argument="sf")
    blocks = _ceil_div(rows, 32)
    if arr.ndim != 2 or arr.shape[1] != blocks:
        raise ValueError(f"sf must have shape (N, {blocks}) for rows={rows}; got {arr.shape}")
    n = arr.shape[0]
    shape = sf_physical_shape(n, blocks, 1)
    flat = np.zeros(int(np.prod(shape)), dtype=arr.dtype)
    n_tiles = shape[1]
    for start, end in _expert_ranges(padded_offsets, rows):
        if end == start:
            continue
        atoms = pack_sf(arr[:, start // 32 : end // 32]).ravel()
        base = start // _ATOM_MN * n_tiles * _ATOM_BYTES
        flat[base : base + atoms.size] = atoms
    return flat.reshape(shape)


def unpack_sf_discrete_col(buf: Any, n: int, rows: int, padded_offsets: Any) -> np.ndarray:
    """Inverse of :func:`pack_sf_discrete_col`: logical ``(N, ceil(rows/32))`` column scales.

    Blocks of rows past the last offset come back zero.

    Parameters
    ----------
    buf : scale buffer
        SFD_col as written with ``discrete_col_sfd`` (physical, view or flat).
    n : int
        Columns of D.
    rows : int
        Rows of D (M).
    padded_offsets : (L,) int array
        The experts' end rows.
    """
    blocks = _ceil_div(rows, 32)
    phys = as_sf_physical(buf, n, blocks, 1, argument="buf")
    flat = phys.reshape(-1)
    out = np.zeros((n, blocks), dtype=flat.dtype)
    n_tiles = _ceil_div(n, _ATOM_MN)
    for start, end in _expert_ranges(padded_offsets, rows):
        if end == start:
            continue
        kb = (end - start) // 32
        size = n_tiles * _ceil_div(kb, _ATOM_K) * _ATOM_BYTES
        base = start // _ATOM_MN * n_tiles * _ATOM_BYTES
        out[:, start // 32 : end // 32] = unpack_sf(flat[base : base + size], n, kb)[:, :, 0]
    return out
