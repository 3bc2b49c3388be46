"""Operand layouts of the block-scaled seeds: which are invalid for an op (ArgumentError) and which
are valid for it but not run here (UnsupportedError naming the arch and what it lacks); and the
discrete weights a class is built for (seed 002's ``num_experts=``, ``b_shape=``).

A and B are K-major in every seed; MN-major FP8 operands are valid too where a seed says so
(seed 004: A M-major and B N-major; seed 000: dense B N-major; seed 002: discrete B
``b_major="n"``). Whether a layout is valid for an op is its spec's answer (the ``a_major`` /
``b_major`` choices and constraints, so packed FP4 stays K-major); whether an arch runs it is the
registry's (sm_90a's FP8 WGMMA reads K-major operands only). The sm_100a kernels read MN-major
FP8, but fusegemm's host launch path encodes K-major tensor maps only, so those are refused too,
as UnsupportedError, until it encodes them (templates/include/fusegemm/sm100/blockscaled_gemm.cuh
documents the maps they need).
"""
from __future__ import annotations

from typing import Any

from .. import arguments as args
from ..base.errors import ArgumentError, UnsupportedError
from ..runtime.tensors import TensorView, view
from . import arg_checks as checks
from .scaled_operands import FP4_DTYPES, is_mn_major

# The MN-major value of each layout axis and the argument it describes.
MN = {"a_major": ("m", "a_tensor"), "b_major": ("n", "b_tensor")}


def _mn_major(v: TensorView, a: TensorView, batched: bool) -> bool:
    """Whether A or B (``v``) is MN-major: batched (rows, K[, L]); grouped dense B (N, K, L) or its
    canonical (L, N, K), told apart by A's K as the operand parse does (fusegemm/arguments.py)."""
    if batched:
        return v.ndim in (2, 3) and is_mn_major(v.strides, v.shape, 0, 1)
    if v.ndim != 3 or a.ndim not in (2, 3):
        return False
    kb = a.shape[1]
    canonical = args.b_is_canonical(v.shape, v.strides, kb, v.shape[2] if v.shape[1] == kb else v.shape[0])
    if canonical is None:
        return False
    return is_mn_major(v.strides, v.shape, 1 if canonical else 0, 2 if canonical else 1)


def layout_axes(spec: str, axes: dict[str, Any], a_tensor: Any, b_tensor: Any, *, batched: bool) -> dict[str, str]:
    """``a_major`` / ``b_major`` of the MN-major operands of a call whose other axes are ``axes``
    (K-major operands, and layouts that are neither, are left to the operand parse, which names
    the stride). An MN-major layout the spec does not declare is an ArgumentError with its reason."""
    from ..generator.spec import check_choice, find_spec
    a = view(a_tensor, "a_tensor")
    found: dict[str, str] = {}
    operands = ((("a_major", a_tensor),) if batched else ()) + (("b_major", b_tensor),)
    for axis, x in operands:
        if x is None:
            continue                     # discrete weights: b_major is the caller's argument
        mn, arg = MN[axis]
        v = view(x, arg)
        if not _mn_major(v, a, batched):
            continue
        s = find_spec(spec)              # (only here: a wrapper's K-major call reads no spec)
        offered = s.choice_map.get(axis, ("k",))
        why = (f"{spec} offers {axis} {list(offered)} only" if mn not in offered else
               check_choice({**dict(s.defaults), **axes, **found, axis: mn}, s.constraints))
        if why:
            raise ArgumentError(f"{arg}.stride", tuple(v.strides), f"K-major (stride 1 along K) on every arch: {why}",
                                f"pass a K-major {arg}")
        found[axis] = mn
    return found


def check_layouts(op: Any) -> None:
    """UnsupportedError when ``op``'s variant has an MN-major operand (valid for the op: its spec
    declared it) that its arch's kernel does not implement (the registry's limit, naming the arch
    and why) or that fusegemm cannot launch yet (no MN-major tensor maps on the host)."""
    from ..generator import registry
    v = op.variant
    row = registry.lookup(op.spec.kernel, op.arch)
    if row is None:
        return                           # no kernel at all: check_support says so
    for axis, (mn, arg) in MN.items():
        if getattr(v, axis) != mn:
            continue
        if v.weight_mode == "discrete" and axis == "b_major":
            arg = "b_major"              # discrete weights: the argument that chose it
        lim = next((lim for lim in row.limits if lim.axis == axis and mn not in lim.values and lim.applies(v.choices)), None)
        if lim is not None:
            raise UnsupportedError(f"{arg}: MN-major {v.ab_dtype} ({axis}={mn!r}) is valid for {op.spec.name} but "
                                   f"not implemented on {op.arch}: {lim.because}; allowed on {op.arch}: "
                                   f"{axis}={lim.values[0]!r} (K-major)", axis=axis)
        raise UnsupportedError(f"{arg}: MN-major {v.ab_dtype} ({axis}={mn!r}) is valid for {op.spec.name} and the "
                               f"{op.arch} kernel reads it, but fusegemm's host launch path encodes K-major tensor "
                               f"maps only; allowed: K-major ({axis}='k')", axis=axis)


class DiscreteWeights:
    """What a class built for discrete weights fixed: N and the expert count (seed 002's
    ``num_experts=``, ``b_shape=(N, K)``; each call passes ``b_ptrs`` / ``sfb_ptrs``)."""

    def __init__(self, n: int, experts: int) -> None:
        self.n, self.experts = n, experts

    def n_for(self, n: Any, padded_offsets: Any) -> int:
        """N of an ``execute`` call (``n`` None or the op's), its expert count checked."""
        if n is not None and n != self.n:
            raise ArgumentError("n", repr(n), f"None or {self.n} (b_shape[0] of this op)")
        if padded_offsets is not None:
            got = tuple(view(padded_offsets, "padded_offsets").shape)
            if got[:1] != (self.experts,):
                raise ArgumentError("padded_offsets.shape", got, f"({self.experts},): num_experts of this op")
        return self.n


def discrete_weights(sample_a: Any, sample_b: Any, sample_sfb: Any, sample_padded_offsets: Any,
                     num_experts: Any, b_shape: Any) -> DiscreteWeights | None:
    """None for dense weights (``sample_b``); for discrete ones (``num_experts``, ``b_shape``), N
    and L checked against the samples. ``b_shape`` is ``(N, K)`` with K in elements or, for packed
    FP4, the bytes of a row (a ``float4_e2m1fn_x2`` / uint8 tensor's ``(N, K // 2)``)."""
    if sample_b is not None:
        for name, value in (("num_experts", num_experts), ("b_shape", b_shape)):
            if value is not None:
                raise ArgumentError(name, repr(value), "None with sample_b (dense weights); discrete weights "
                                    "pass num_experts= and b_shape=(N, K) instead of sample_b")
        return None
    if num_experts is None or b_shape is None:
        missing = "num_experts" if num_experts is None else "b_shape"
        raise ArgumentError(missing, None, "an int (L)" if missing == "num_experts" else "(N, K)",
                            "without sample_b (dense weights), discrete weights need num_experts= and b_shape=(N, K)")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or not 1 <= num_experts <= args.MAX_EXPERTS:
        raise ArgumentError("num_experts", repr(num_experts), f"an int from 1 to {args.MAX_EXPERTS}")
    n, k = checks.pair_arg(b_shape, "b_shape")
    if n < 8 or n % 8:
        raise ArgumentError("b_shape[0] (N)", n, "a multiple of 8, at least 8 (16-byte output rows)")
    if sample_sfb is not None:
        raise ArgumentError("sample_sfb", "a tensor", "None with discrete weights (sfb_ptrs at execute hold "
                            "each expert's scales)")
    a = view(sample_a, "sample_a")
    if a.ndim in (2, 3):
        kb = a.shape[1]
        ks = (2 * kb, kb) if a.dtype in FP4_DTYPES else (kb,)
        if k not in ks:
            allowed = f"(N, {ks[0]})" + (f" or (N, {ks[1]}) (packed FP4 bytes)" if len(ks) > 1 else "")
            raise ArgumentError("b_shape", repr(tuple(b_shape)), f"{allowed}: K of sample_a")
    if sample_padded_offsets is not None:
        got = tuple(view(sample_padded_offsets, "sample_padded_offsets").shape)
        if got[:1] != (num_experts,):
            raise ArgumentError("sample_padded_offsets.shape", got, f"({num_experts},): num_experts")
    return DiscreteWeights(n, num_experts)
