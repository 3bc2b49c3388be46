"""The vocabulary of the preset rows (fusegemm/presets.py): how a seed-style call's arguments
become its variant's axes. A row lists ``(axis, how, parameter)`` in order; each how checks one
argument (an ``ArgumentError`` naming it) and gives the axis value. :func:`resolve` runs a row's
list, for a wrapper's arguments and for a class's samples alike.

==================  ========================================================================
how                 the argument
==================  ========================================================================
``dtype``           a dtype (torch, numpy or its name): its name
``dtype_in``        a dtype of the row's ``accepts`` (raw uint8: packed FP4)
``one_of``          one of the row's ``accepts``, as given
``value``           as given (the variant checks it)
``bool``            True or False
``scheduler``       ``use_dynamic_sched``: ``dynamic`` or ``static``
``tensor_dtype``    a tensor's dtype, ``none`` without one
``tensor_dtype_in`` the same, a dtype of the row's ``accepts`` (seed 001's bias)
``forward_dtype``   a required tensor's dtype (the forward's C a backward reads)
``prob_dtype``      seed 000's prob: float32 (also without one) or bfloat16
``weight_mode``     ``dense`` with the tensor, ``discrete`` (pointers) without
``dense_b``         dense weights only (seed 000)
``ab_format``       A's format (``ab_dtype``); ``sf_format``: its scales' (``sf_dtype``)
``sf_vec``          16, 32 or 128 (blockwise) elements per scale
``b_format``        None or the format of A (discrete weights' ``b_dtype``)
``bf16_weights``    None or bfloat16 (BF16 discrete weights' ``b_dtype``)
``pair``            a tile or cluster (two ints), None for the arch's default
``int_pair``        the same, ints only (the BF16 presets')
``tanh_clamp``      None or a positive finite float (seed 002's ``tanh_clamp_scale``)
==================  ========================================================================
"""
from __future__ import annotations

import math
from typing import Any, Callable

from ..base.errors import ArgumentError
from ..formats.numpy_dtypes import dtype_name
from ..runtime.tensors import view
from . import arg_checks as checks
from .scaled_layouts import layout_axes
from .scaled_operands import AB_DTYPES, SF_AXIS, SF_DTYPES, ab_axis


def _dtype(v: Any, name: str, allowed: Any, bound: dict) -> str:
    got = dtype_name(v)
    if got is None:
        raise ArgumentError(name, repr(v), "a dtype (torch, numpy or its name)")
    return got


def _one_of(v: Any, name: str, allowed: tuple, bound: dict) -> Any:
    if v not in allowed:
        raise ArgumentError(name, repr(v), ", ".join(map(repr, allowed)))
    return v


def _int_pair(v: Any, name: str, allowed: Any, bound: dict) -> tuple[int, int] | None:
    if v is not None and (not isinstance(v, (tuple, list)) or len(v) != 2
                          or not all(isinstance(x, int) and not isinstance(x, bool) for x in v)):
        raise ArgumentError(name, repr(v), "None or a pair of ints")
    return None if v is None else (int(v[0]), int(v[1]))


def _bf16_weights(v: Any, name: str, allowed: Any, bound: dict) -> None:
    if v is not None and _dtype(v, name, allowed, bound) != "bfloat16":
        raise ArgumentError(name, repr(v), "None or bfloat16 (the weights' dtype)")


def _ab_format(v: Any, name: str, allowed: Any, bound: dict) -> str:
    # The operands' formats are named as the operands in every face (a class's sample_a too).
    a = view(v, "a_tensor")
    if a.dtype not in AB_DTYPES:
        raise ArgumentError("a_tensor.dtype", a.dtype, ", ".join(AB_DTYPES) + " (uint8: packed FP4 bytes)")
    return ab_axis(a.dtype)


def _sf_format(v: Any, name: str, allowed: Any, bound: dict) -> str:
    if v is None:
        raise ArgumentError("sfa_tensor", None, "a tensor", "block-scaled A/B need their scale factors")
    sf = view(v, "sfa_tensor").dtype
    blockwise = sf == "float32" and bound.get("sf_vec_size") == 128    # FP32 scales: that recipe only
    if sf not in SF_DTYPES and not blockwise:
        raise ArgumentError("sfa_tensor.dtype", sf, ", ".join(SF_DTYPES) + " (uint8/int8: E8M0 bytes); float32 "
                            "with sf_vec_size=128 (the blockwise recipe)")
    return SF_AXIS[sf]


def _sf_vec(v: Any, name: str, allowed: Any, bound: dict) -> int:
    if isinstance(v, bool) or v not in (16, 32, 128):
        raise ArgumentError(name, repr(v), "16, 32 (MX scales), 128 (the blockwise recipe: float32 scales)")
    return v


def _b_format(v: Any, name: str, allowed: Any, bound: dict) -> None:
    if v is None:
        return
    a = view(bound["a_tensor"], "a_tensor").dtype
    if ab_axis(checks.dtype_arg(v, name, AB_DTYPES)) != ab_axis(a):
        raise ArgumentError(name, repr(v), f"None or {a} (the dtype of a_tensor)")


def _dense_b(v: Any, name: str, allowed: Any, bound: dict) -> str:
    if v is None:
        raise ArgumentError("b_tensor", None, "a dense (N, K, L) tensor (dSwiGLU has no discrete weights)")
    return "dense"


def _forward_dtype(v: Any, name: str, allowed: Any, bound: dict) -> str:
    if v is None:
        raise ArgumentError(name, None, "a tensor: the forward's saved input (its dtype chooses the kernel)")
    return view(v, name).dtype


def _prob_dtype(v: Any, name: str, allowed: Any, bound: dict) -> str:
    dtype = "float32" if v is None else view(v, name).dtype      # seed 000: float32 or bfloat16 prob
    if dtype not in ("float32", "bfloat16"):
        raise ArgumentError(f"{name}.dtype", dtype, "float32, bfloat16")
    return dtype


def _tensor_dtype_in(v: Any, name: str, allowed: tuple, bound: dict) -> str:
    if v is None:
        return "none"
    dtype = view(v, name).dtype
    if dtype not in allowed:
        raise ArgumentError(f"{name}.dtype", dtype, ", ".join(allowed))
    return dtype


def _tanh_clamp(v: Any, name: str, allowed: Any, bound: dict) -> Any:
    if v is None:
        return "none"
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
        raise ArgumentError(name, repr(v), "None or a positive finite float")
    return float(v)


# how -> f(value, message name, the row's accepted values, every bound argument) -> the axis value.
HOWS: dict[str, Callable[[Any, str, Any, dict], Any]] = {
    "dtype": _dtype, "one_of": _one_of, "int_pair": _int_pair, "bf16_weights": _bf16_weights,
    "dtype_in": lambda v, name, allowed, b: ab_axis(checks.dtype_arg(v, name, allowed)),
    "tensor_dtype": lambda v, name, allowed, b: "none" if v is None else view(v, name).dtype,
    "bool": lambda v, name, allowed, b: checks.bool_arg(v, name),
    "scheduler": lambda v, name, allowed, b: "dynamic" if checks.bool_arg(v, name) else "static",
    "weight_mode": lambda v, name, allowed, b: "dense" if v is not None else "discrete",
    "value": lambda v, name, allowed, b: v,
    "pair": lambda v, name, allowed, b: None if v is None else checks.pair_arg(v, name),
    "ab_format": _ab_format, "sf_format": _sf_format, "sf_vec": _sf_vec, "b_format": _b_format,
    "tensor_dtype_in": _tensor_dtype_in, "dense_b": _dense_b, "forward_dtype": _forward_dtype,
    "prob_dtype": _prob_dtype, "tanh_clamp": _tanh_clamp,
}


def plan(axes: tuple, accepts: dict[str, tuple]) -> tuple:
    """A row's ``axes`` as (how's function, parameter, accepted values, axis, pair of axes): the
    lookups :func:`resolve` would repeat on every call, done once."""
    return tuple((HOWS[how], param, accepts.get(param), None if axis is None or "," in axis else axis,
                  tuple(axis.split(",")) if axis and "," in axis else None) for axis, how, param in axes)


def resolve(row: Any, bound: dict[str, Any], names: dict[str, str] | None = None) -> dict[str, Any]:
    """The variant axes of a call of ``row`` (wrapper or class) from its wrapper-named arguments:
    the fixed parameters, every how in order, then block-scaled operands' MN-major layouts.
    ``names``: the caller's name of a parameter in messages (a class's sample)."""
    names = names or {}
    for param, allowed, why in row.fixed:
        value = bound.get(param)
        if isinstance(allowed, str) and value is not None and not isinstance(value, str):
            value = _dtype(value, param, None, bound) if param.endswith("_dtype") else value
        if value != allowed and not (param.endswith("_dtype") and value is None):   # a None dtype: the default
            raise ArgumentError(param, repr(bound.get(param)), repr(allowed), why)
    axes: dict[str, Any] = {}
    for how, param, allowed, axis, pair in row.plan:
        value = how(bound.get(param), names.get(param, param), allowed, bound)
        if axis is not None:
            axes[axis] = value
        elif pair is not None and value is not None:
            axes[pair[0]], axes[pair[1]] = value
    if row.kind != "grouped":
        axes.update(layout_axes(row.spec, axes, bound["a_tensor"], bound.get("b_tensor"),
                                batched=row.kind == "batched"))
    return axes
