"""The grouped operands (A, padded_offsets, alpha, B or b_ptrs, bias, prob) and outputs of the
grouped ops, validated for the GPU: the seed contract (fusegemm/arguments.py) first, then what the
kernels need (K-major rows, 16-byte pitches and bases, one device).

Checks are ordered so that everything decidable from shapes, strides and dtypes runs first
(tests exercise them on CPU tensors); device and address checks come last.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import arguments as args
from ..base.dtypes import DTYPES
from ..base.errors import ArgumentError
from ..runtime.tensors import TensorView
from . import arg_checks as checks
from .arg_checks import aligned, dtype_arg, row_pitch_aligned, unit_stride
from .loaded_kernel import GroupedShape


@dataclass
class Call:
    """One validated set of arguments."""

    m: int
    n: int
    k: int
    l: int
    a: TensorView
    offsets: TensorView
    alpha: TensorView | None
    b: TensorView | None          # dense weights
    b_strides: tuple[int, int]    # (row pitch, L stride) in elements, dense only; the pitch is
                                  # the N stride of K-major B, the K stride of N-major B
    b_major: str                  # "k" or "n" (stride 1 along K or along N)
    b_ptrs: TensorView | None     # discrete weights
    bias: TensorView | None
    prob: TensorView | None
    canonical: bool               # 2-D A: outputs are (M, N), else (M, N, 1)
    a_index: TensorView | None = None   # gathered A: the row of A each of the M problem rows reads
    a_rows: int = -1              # rows of A (gathered A: its tokens; else M)
    row_ends: TensorView | None = None  # where each expert's tokens end (tiles past it skipped)
    d_index: TensorView | None = None   # scattered outputs: the C/D row each of the M problem rows writes
    d_rows: int = -1              # scattered outputs: rows of C and D (else M)


def parse_call(a_tensor: Any, padded_offsets: Any, alpha_tensor: Any, b_tensor: Any,
               b_ptrs: Any, bias_tensor: Any, prob_tensor: Any, *, ab_dtypes: tuple[str, ...],
               bias_dtypes: tuple[str, ...], n: Any = None, b_dtype: Any = None,
               b_major: str = "k", discrete_experts: int | None = None,
               alpha_required: bool = True, b_majors: tuple[str, ...] = ("k",), devices: bool = True,
               a_index: Any = None) -> Call:
    """Validate the inputs (shapes, strides, dtypes first; devices last).

    ``discrete_experts`` describes discrete weights without a pointer table (class API
    samples: ``num_experts=`` instead of ``b_ptrs``). ``alpha_required=False``: the GEMM operands
    only (a spec-driven op validates its epilogue inputs itself). ``b_majors``: the weight layouts
    the caller's kernel reads (the seed wrappers': K-major only). ``devices=False``: the caller
    checks devices and addresses itself, after its own shape checks (``fusegemm.Op``).
    ``a_index`` (gathered A): int32 (M,), the row of A (T, K) each problem row reads; M from it.
    """
    a, m, k, a_rows, canonical, idx = checks.a_operand(a_tensor, a_index, ab_dtypes)
    item = DTYPES[a.dtype].itemsize
    # Strides of an empty A (an expert-parallel rank that received no tokens) are arbitrary
    # (numpy gives (0, 0)) and never used: nothing is launched for it.
    if a.strides[1] != 1 and k > 1 and a_rows:
        raise ArgumentError("a_tensor.stride", a.strides, "K-major (stride 1 along K)",
                            "pass a_tensor.contiguous()")
    if k < 8 or k % 8:
        raise ArgumentError("a_tensor.shape[1] (K)", k, "a multiple of 8, at least 8 (16-byte rows for TMA)")
    if a_rows:
        row_pitch_aligned(a.strides[0], item, "a_tensor.stride[0]")

    off, l = args.offsets(padded_offsets)
    unit_stride(off, "padded_offsets")
    alpha = None
    if alpha_tensor is not None or alpha_required:
        alpha = args.vector(alpha_tensor, "alpha_tensor", l, what="(one scale per expert)")
        unit_stride(alpha, "alpha_tensor")

    args.choice(b_major, "b_major", b_majors)
    if b_dtype is not None:
        dtype_arg(b_dtype, "b_dtype", ab_dtypes)
    discrete = b_ptrs is not None or discrete_experts is not None
    if (b_tensor is None) != discrete:
        raise ArgumentError("b_tensor/b_ptrs", "both" if b_tensor is not None else "neither",
                            "exactly one of b_tensor (dense) and b_ptrs (discrete)")
    b = ptrs = None
    b_strides = (0, 0)
    if b_tensor is not None:
        db = args.dense_b(b_tensor, k, l, ab_dtypes)
        b, (sn, sk, sl) = db.b, db.strides
        if b_major == "k" and sk != 1:
            raise ArgumentError("b_tensor.stride", b.strides, "K-major (stride 1 along K)",
                                "weights must be K-major")
        if b_major == "n" and sn != 1:
            raise ArgumentError("b_tensor.stride", b.strides, "N-major (stride 1 along N: b_major='n')",
                                "pass the (L, N, K) view w.transpose(1, 2) of a contiguous (L, K, N) weight")
        if n is not None and n != db.n:
            raise ArgumentError("n", n, f"None or {db.n} (b_tensor's N)")
        pitch = sn if b_major == "k" else sk
        n, b_strides = db.n, (pitch, sl)
        row_pitch_aligned(pitch, item, f"b_tensor {'N' if b_major == 'k' else 'K'} stride")
        if l > 1:
            row_pitch_aligned(sl, item, "b_tensor expert stride")
    elif b_ptrs is not None:
        ptrs = args.tensor(b_ptrs, "b_ptrs", ndims=(1,), dtypes=("int64", "uint64"))
        if tuple(ptrs.shape) != (l,):
            raise ArgumentError("b_ptrs.shape", tuple(ptrs.shape), f"({l},): one pointer per expert")
        unit_stride(ptrs, "b_ptrs")
    elif discrete_experts != l:
        raise ArgumentError("num_experts", discrete_experts, f"{l} (length of padded_offsets)")
    if discrete and (n is None or isinstance(n, bool) or not isinstance(n, int)):
        raise ArgumentError("n", repr(n), "an int (N, rows of each expert's (N, K) weight)",
                            "discrete weights need n=")
    if n < 8 or n % 8:
        raise ArgumentError("n (N)", n, "a multiple of 8, at least 8 (16-byte output rows)")

    bias = prob = None
    if bias_tensor is not None:
        bias = args.bias(bias_tensor, n, l, bias_dtypes)
        if bias.strides[0] != 1 or (l > 1 and bias.strides[1] != n):
            raise ArgumentError("bias_tensor.stride", bias.strides, f"(1, {n}): (N, L) with N "
                                "contiguous", "pass bias_LN.t() for a contiguous (L, N) tensor")
    if prob_tensor is not None:
        prob = args.vector(prob_tensor, "prob_tensor", m, what="(one gate per row)")
        unit_stride(prob, "prob_tensor")

    call = Call(m=m, n=n, k=k, l=l, a=a, offsets=off, alpha=alpha, b=b, b_strides=b_strides, b_major=b_major,
                b_ptrs=ptrs, bias=bias, prob=prob, canonical=canonical, a_index=idx, a_rows=a_rows)
    if not devices:
        return call
    # Devices and addresses last (CPU-only tests reach everything above).
    named = [("padded_offsets", off), ("alpha_tensor", alpha), ("b_tensor", b), ("b_ptrs", ptrs),
             ("bias_tensor", bias), ("prob_tensor", prob), ("a_index", idx)]
    checks.require_cuda(a, "a_tensor")
    checks.same_device([(nm, v) for nm, v in named if v is not None], a.device)
    for name, v in (("a_tensor", a), *named):
        if v is not None:
            aligned(v, name, ALIGNMENT[name])
    return call


# Base alignment of every argument, in bytes: TMA and 16-byte vector accesses read A, B and bias
# and write C/D; the offsets and the vectors are read as 4-byte words, the pointer table as
# 8-byte words.
ALIGNMENT = {"a_tensor": 16, "b_tensor": 16, "bias_tensor": 16, "c_tensor": 16, "d_tensor": 16,
             "padded_offsets": 4, "alpha_tensor": 4, "prob_tensor": 4, "b_ptrs": 8, "a_index": 4, "d_index": 4}


def shape_of(call: Call) -> GroupedShape:
    """The launch shape of validated grouped operands."""
    sn, sl = call.b_strides
    if call.b is not None and call.l == 1:
        # L == 1 may report any expert stride; give TMA a legal one
        sl = sn * (call.n if call.b_major == "k" else call.k)
    return GroupedShape(m=call.m, n=call.n, k=call.k, l=call.l, a_ld=call.a.strides[0], b_sn=sn, b_sl=sl,
                        discrete=call.b_ptrs is not None, b_mn=call.b_major == "n", a_rows=call.a_rows)
