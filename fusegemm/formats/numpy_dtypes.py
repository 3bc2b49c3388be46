"""The numpy side of the dtype table: dtype spellings and host arrays, shared by the format
helpers and the references. The table itself (fusegemm/base/dtypes.py) imports no numpy; this
module adds each dtype's numpy / ml_dtypes storage (``FORMATS``) and reads any spelling.

Every dtype argument in fusegemm may be given as a numpy/ml_dtypes dtype or type, a torch dtype,
or a name string (``"bfloat16"``, ``"float8_e4m3fn"``, ``"torch.float8_e4m3fn"``, ...). They are
all reduced to one canonical name here. torch is never imported: a torch dtype or tensor is
recognised by its module name and converted through its public methods.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import ml_dtypes
import numpy as np

from ..base.dtypes import DTYPES

__all__ = [
    "ElementFormat",
    "FORMATS",
    "FP8_NAMES",
    "FP4_NAMES",
    "FLOAT_OUTPUT_NAMES",
    "dtype_name",
    "resolve_dtype",
    "array_dtype_name",
    "to_numpy",
    "is_torch",
]


@dataclass(frozen=True)
class ElementFormat:
    """A number format an array element (or a packed pair of elements) can have.

    Attributes
    ----------
    name : str
        Canonical name, as numpy/ml_dtypes/torch spell it.
    storage : numpy.dtype
        dtype of the numpy array holding one element per item (``uint8`` for packed FP4).
    max_finite : float
        Largest finite magnitude (``inf`` where not meaningful).
    packed : bool
        Two elements per byte (``float4_e2m1fn_x2``; numpy holds it as ``uint8``).
    """

    name: str
    storage: np.dtype
    max_finite: float
    packed: bool = False


# Every host format of the one dtype table (fusegemm/base/dtypes.py), with its numpy storage.
FORMATS: dict[str, ElementFormat] = {
    d.name: ElementFormat(d.name, np.dtype(d.numpy_type()), d.max_finite, d.packed)
    for d in DTYPES.values()
}

FP8_NAMES = ("float8_e4m3fn", "float8_e5m2")
# "uint8" is how numpy and the seed pages spell a packed FP4 A/B/C/D tensor.
FP4_NAMES = ("float4_e2m1fn_x2", "uint8", "float4_e2m1fn")
FLOAT_OUTPUT_NAMES = ("float32", "float16", "bfloat16")


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a torch object (tensor or dtype), decided without importing torch."""
    return type(x).__module__.split(".")[0] == "torch"


def dtype_name(dtype: Any) -> str | None:
    """Canonical name of a dtype given in any accepted spelling, or None if unrecognised.

    Parameters
    ----------
    dtype : numpy dtype, ml_dtypes type, torch dtype or str
        ``"torch.bfloat16"`` and ``torch.bfloat16`` both give ``"bfloat16"``.
    """
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
    elif is_torch(dtype):
        name = str(dtype).removeprefix("torch.")
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            return None
    return name if name in FORMATS else None


def resolve_dtype(dtype: Any, *, argument: str, allowed: Iterable[str]) -> str:
    """Canonical dtype name, checked against the names an argument allows.

    Parameters
    ----------
    dtype : str, numpy dtype, ml_dtypes type or torch.dtype
        Any accepted spelling.
    argument : str
        The argument's name, for the error message.
    allowed : iterable of str
        Canonical names the argument accepts.

    Raises
    ------
    ValueError
        The dtype is recognised but not allowed, or not recognised at all; the message names the
        argument, the value received and the allowed names.
    """
    allowed = tuple(allowed)
    name = dtype_name(dtype)
    if name is None or name not in allowed:
        # Show every spelling (numpy dtype, torch dtype, str) the same way: as its name.
        shown = dtype if isinstance(dtype, str) else (name or str(dtype))
        raise ValueError(f"{argument}={shown!r} is not supported; allowed: {', '.join(allowed)}")
    return name


def array_dtype_name(x: Any) -> str:
    """Canonical dtype name of a numpy array or torch tensor."""
    name = dtype_name(x.dtype)
    if name is None:
        raise ValueError(f"unsupported array dtype {x.dtype}; supported: {', '.join(FORMATS)}")
    return name


_TORCH_VIEW_AS = {
    # torch dtypes numpy has no native type for: reinterpret the bytes, then view as ml_dtypes.
    "bfloat16": ("int16", ml_dtypes.bfloat16),
    "float8_e4m3fn": ("uint8", ml_dtypes.float8_e4m3fn),
    "float8_e5m2": ("uint8", ml_dtypes.float8_e5m2),
    "float8_e8m0fnu": ("uint8", ml_dtypes.float8_e8m0fnu),
    "float4_e2m1fn_x2": ("uint8", np.uint8),
}


def to_numpy(x: Any, *, argument: str = "array") -> np.ndarray:
    """A numpy view (or host copy) of a numpy array, torch tensor or array-like.

    torch tensors are detached and moved to the host; bfloat16/FP8/E8M0 tensors come back as the
    matching ml_dtypes arrays and ``float4_e2m1fn_x2`` as ``uint8`` (two elements per byte).
    Strides are preserved where possible, so a permuted kernel-facing view stays a view.

    Parameters
    ----------
    x : numpy array, torch tensor or array-like
    argument : str
        The argument's name, for the error message.

    Raises
    ------
    TypeError
        ``x`` is None or cannot be converted; the message names ``argument``.
    """
    if x is None:
        raise TypeError(f"{argument} is required; got None")
    if isinstance(x, np.ndarray):
        return x
    if is_torch(x):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        name = str(t.dtype).removeprefix("torch.")
        if name in _TORCH_VIEW_AS:
            int_name, np_type = _TORCH_VIEW_AS[name]
            import torch  # only reached with a torch tensor in hand

            return t.view(getattr(torch, int_name)).numpy().view(np_type)
        return t.numpy()
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{argument} must be a numpy array or torch tensor; got {type(x).__name__}") from err
