"""The operands of the block-scaled kernel classes, validated for the GPU: MXFP8 (e4m3 / e5m2 A
and B with E8M0 scales per 32 K; packed FP4 on sm_100a), A ``(M, K, 1)`` or ``(M, K)`` K-major,
dense B ``(N, K, L)`` or ``(L, N, K)`` K-major or discrete per-expert weights (``b_ptrs`` /
``sfb_ptrs``), scale factors in the 32x4x4 atom layout of :mod:`fusegemm.formats.scales` given as
the kernel-facing view, the physical buffer or a flat buffer (each a view of the same dense
bytes). Shapes, strides and dtypes are checked here; devices and addresses by the engine
(fusegemm/ops/engine.py), after every other argument.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import arguments as args
from ..base.errors import ArgumentError
from ..formats.scales import sf_physical_shape, sf_view_shape
from ..runtime.tensors import TensorView, dense_strides
from . import arg_checks as checks

FAMILIES = ("grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu", "gemm_amax")
# Packed FP4 A/B (two E2M1 values per byte, the even element in the low nibble): raw uint8 bytes
# or torch.float4_e2m1fn_x2, the two spellings the seeds list; the kernels read the bytes either way.
FP4_DTYPES = ("uint8", "float4_e2m1fn_x2")
AB_DTYPES = ("float8_e4m3fn", "float8_e5m2") + FP4_DTYPES
SF_DTYPES = ("float8_e8m0fnu", "uint8", "int8", "float8_e4m3fn")  # raw bytes are E8M0
SF_AXIS = {"float8_e8m0fnu": "float8_e8m0fnu", "uint8": "float8_e8m0fnu", "int8": "float8_e8m0fnu",
           "float8_e4m3fn": "float8_e4m3fn", "float32": "float32"}
ATOM_BYTES = 512
# The blockwise recipe (sf_vec_size 128, FP32 scales; issue 31): A one scale per row and 128 K,
# B one per 128 N x 128 K block. SFA is M-contiguous with a row pitch of a multiple of 4 floats
# (a 16-byte TMA pitch); SFB dense (L, ceil(N/128), ceil(K/128)), K blocks contiguous.
BLOCKWISE = 128


def ab_axis(dtype: str) -> str:
    """The ``ab_dtype`` axis value of an A/B tensor dtype (raw uint8 bytes are packed FP4)."""
    return "float4_e2m1fn_x2" if dtype in FP4_DTYPES else dtype


def same_format(dtype: str) -> tuple[str, ...]:
    """The tensor dtypes of A/B in ``dtype``'s format (B must match A: either FP4 spelling)."""
    return FP4_DTYPES if dtype in FP4_DTYPES else (dtype,)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# MN-major FP8 A/B (seed 004's a_major 'm' / b_major 'n', seed 000's N-major dense B) reach the
# kernels through a K-major copy that an op built for them makes on each call
# (fusegemm/ops/scaled_layouts.py); the kernels themselves read K-major. So an MN-major FP8
# operand here, where the parse reads the operand as the kernel will, went to an op built for
# K-major operands: an ArgumentError that names the axis to build it with. Packed FP4 A/B are
# K-major on every arch.
def _mn_axis(name: str) -> str:
    return "a_major='m'" if name == "a_tensor" else "b_major='n'"


def is_mn_major(strides: tuple[int, ...], shape: tuple[int, ...], mn_dim: int, k_dim: int) -> bool:
    """Whether an operand has unit stride along its rows (M or N) instead of along K."""
    return strides[k_dim] != 1 and shape[mn_dim] > 1 and strides[mn_dim] == 1


def not_k_major(name: str, v: TensorView, strides: tuple[int, ...], mn_major: bool, hint: str) -> Exception:
    """The error for an A/B operand that is not K-major (an MN-major FP8 one: the op was built for
    K-major operands; its hint names the axis that takes this layout)."""
    if mn_major and v.dtype not in FP4_DTYPES:
        return ArgumentError(f"{name}.stride", tuple(strides), "K-major (stride 1 along K): this op was built for "
                             "K-major operands",
                             f"build the op with {_mn_axis(name)} to pass an MN-major {v.dtype} {name} (a K-major "
                             f"copy is made on the device before each launch), or pass a K-major {name}")
    what = "packed FP4 is K-major on every arch" if mn_major else "stride 1 along K"
    return ArgumentError(f"{name}.stride", tuple(strides), f"K-major ({what})", hint)


def blockwise_sfa(x: Any, name: str, m: int, sfk: int, l: int, batched: bool,
                  rows_of: str = "A") -> tuple[TensorView, int, int]:
    """The blockwise recipe's A scales: float32 ``(M, ceil(K/128))`` (batched: ``(M, ceil(K/128), L)``)
    with unit stride along M and a pitch of a multiple of 4 floats; (view, pitch, batch stride) in
    floats. ``rows_of``: the operand whose rows they scale, for the message."""
    shape = (m, sfk, l) if batched else (m, sfk)
    v = args.tensor(x, name, ndims=(len(shape),), dtypes=("float32",))
    if tuple(v.shape) != shape:
        raise ArgumentError(f"{name}.shape", tuple(v.shape), f"{shape}: one FP32 scale per row of {rows_of} and 128 K"
                            + (" per batch" if batched else ""))
    ld = v.strides[1] if sfk > 1 else -(-m // 4) * 4
    ls = v.strides[2] if batched and l > 1 else ld * sfk
    if (m > 1 and v.strides[0] != 1) or ld < m or ld % 4 or ls % 4 or (batched and l > 1 and ls < ld * sfk):
        raise ArgumentError(f"{name}.stride", tuple(v.strides), "unit stride along M and a K-block pitch of a "
                            "multiple of 4 floats, at least M (a 16-byte TMA pitch)",
                            f"fusegemm.formats.blockwise_sfa_layout(scales) makes one; e.g. torch: "
                            f"{name}.t().contiguous().t() when M % 4 == 0")
    return v, ld, ls


def blockwise_sfb(x: Any, name: str, n: int, sfk: int, l: int) -> TensorView:
    """The blockwise recipe's B scales: float32 ``(L, ceil(N/128), ceil(K/128))``, contiguous (a 2-D
    ``(ceil(N/128), ceil(K/128))`` for L = 1)."""
    nb = _ceil(n, BLOCKWISE)
    v = args.tensor(x, name, ndims=(2, 3), dtypes=("float32",))
    want = (l, nb, sfk) if v.ndim == 3 or l > 1 else (nb, sfk)
    if tuple(v.shape) != want:
        raise ArgumentError(f"{name}.shape", tuple(v.shape), f"{(l, nb, sfk)}: one FP32 scale per 128 x 128 block "
                            "of each expert's B" + (f" (or {(nb, sfk)} for one expert)" if l == 1 else ""))
    if any(st != d for st, d, e in zip(v.strides, dense_strides(want), want) if e > 1):
        raise ArgumentError(f"{name}.stride", tuple(v.strides), f"{dense_strides(want)} (contiguous)",
                            f"pass {name}.contiguous()")
    return v


def sf_buffer(x: Any, name: str, mn: int, sfk: int, l: int) -> TensorView:
    """A scale-factor buffer for ``(l, mn, sfk)`` scales: the kernel-facing 6-D view, the physical
    6-D buffer or a flat 1-D buffer, each over the dense physical bytes (formats/scales.py)."""
    from ..formats.scales import _TO_VIEW  # the view's axis order, defined once there
    v = args.tensor(x, name, ndims=(1, 6), dtypes=SF_DTYPES)
    phys = sf_physical_shape(mn, sfk, l)
    view_shape = sf_view_shape(mn, sfk, l)
    dense = dense_strides(phys)
    size = 1
    for d in phys:
        size *= d
    shape = tuple(v.shape)
    if shape == phys:
        want = dense
    elif shape == view_shape:
        want = tuple(dense[i] for i in _TO_VIEW)
    elif shape == (size,):
        want = (1,)
    else:
        raise ArgumentError(f"{name}.shape", shape, f"the kernel-facing view {view_shape}, the physical buffer "
                            f"{phys} or a flat ({size},) buffer (scales of mn={mn}, sfk={sfk}, L={l})")
    if size and any(s != w for s, w, d in zip(v.strides, want, shape) if d > 1):   # empty: arbitrary, unused
        raise ArgumentError(f"{name}.stride", tuple(v.strides), f"{want}: a view of the dense physical atom "
                            "buffer", "build it with fusegemm.formats.pack_sf (and sf_to_kernel_view)")
    return v


@dataclass
class ScaledCall:
    """One validated set of block-scaled grouped operands."""

    m: int
    n: int
    k: int              # elements
    k_bytes: int        # stored K extent (packed FP4: K / 2)
    sfk: int            # scale blocks along K
    l: int
    ab: str             # A/B tensor dtype name
    sf: str             # scale dtype name
    a: TensorView
    offsets: TensorView | None
    b: TensorView | None
    b_strides: tuple[int, int]   # dense: (N, L) strides in bytes
    b_ptrs: TensorView | None
    sfb_ptrs: TensorView | None
    sfa: TensorView
    sfb: TensorView | None
    canonical: bool
    batched: bool = False   # gemm_amax: L batches of M rows (offsets unused, A (M, K, L))
    a_lstride: int = 0      # batched: A's batch stride in bytes
    sfa_ld: int = 0         # blockwise: SFA's K-block pitch and batch stride, in floats (0: MX atoms)
    sfa_lstride: int = 0
    a_index: TensorView | None = None   # gathered A: the row of A (and of SFA) each of the M problem rows reads
    a_rows: int = -1        # gathered A: A's (token) rows; -1: m

    @property
    def a_map_rows(self) -> int:
        """Rows of A and SFA as stored: their tokens for gathered A, else the problem's M."""
        return self.m if self.a_index is None else self.a_rows

    @property
    def blockwise(self) -> bool:
        """The blockwise recipe's FP32 scales (not MX scale atoms)."""
        return self.sf == "float32"

    @property
    def discrete(self) -> bool:
        return self.b_ptrs is not None


def _pointer_table(x: Any, name: str, l: int) -> TensorView:
    v = args.tensor(x, name, ndims=(1,), dtypes=("int64", "uint64"))
    if tuple(v.shape) != (l,):
        raise ArgumentError(f"{name}.shape", tuple(v.shape), f"({l},): one pointer per expert")
    checks.unit_stride(v, name)
    return v


def parse_scaled(a_tensor: Any, sfa_tensor: Any, padded_offsets: Any, b_tensor: Any, sfb_tensor: Any,
                 b_ptrs: Any, sfb_ptrs: Any, n: Any, sf_vec_size: int, a_index: Any = None) -> ScaledCall:
    """Validate block-scaled grouped operands: shapes, dtypes and strides (devices and addresses:
    ``Op`` checks them after every other argument). ``a_index`` (gathered A): int32 (M,), the row
    of A (T, K) and of its scales (T, ceil(K/128)) each problem row reads; M from it."""
    a, m, kb, a_rows, canonical, idx = checks.a_operand(a_tensor, a_index, AB_DTYPES)
    ab = a.dtype
    if a.strides[1] != 1 and kb > 1 and a_rows:   # an empty A's strides are arbitrary and unused
        raise ArgumentError("a_tensor.stride", a.strides, "K-major (stride 1 along K)", "pass a_tensor.contiguous()")
    if kb < 16 or kb % 16:
        raise ArgumentError("a_tensor.shape[1] (K bytes)", kb, "a multiple of 16 bytes, at least 16 (TMA rows)")
    if a_rows:
        checks.row_pitch_aligned(a.strides[0], 1, "a_tensor.stride[0]")
    k = 2 * kb if ab in FP4_DTYPES else kb
    off, l = args.offsets(padded_offsets)
    checks.unit_stride(off, "padded_offsets")

    discrete = b_ptrs is not None or sfb_ptrs is not None
    if (b_tensor is None) != discrete:
        raise ArgumentError("b_tensor/b_ptrs", "both" if b_tensor is not None else "neither",
                            "exactly one of b_tensor (dense) and b_ptrs + sfb_ptrs (discrete)")
    b = bp = sbp = None
    b_strides = (0, 0)
    if b_tensor is not None:
        db = args.dense_b(b_tensor, kb, l, same_format(ab))
        b, (sn, sk, sl) = db.b, db.strides
        if sk != 1:
            raise not_k_major("b_tensor", b, b.strides, is_mn_major((sn, sk), (db.n, kb), 0, 1),
                              "weights must be K-major")
        if n is not None and n != db.n:
            raise ArgumentError("n", n, f"None or {db.n} (b_tensor's N)")
        n = db.n
        checks.row_pitch_aligned(sn, 1, "b_tensor N stride")
        if l > 1:
            checks.row_pitch_aligned(sl, 1, "b_tensor expert stride")
        b_strides = (sn, sl if l > 1 else sn * n)
        if sfb_tensor is None:
            raise ArgumentError("sfb_tensor", None, "a tensor", "dense weights need their scale factors")
    else:
        if b_ptrs is None or sfb_ptrs is None:
            missing = "b_ptrs" if b_ptrs is None else "sfb_ptrs"
            raise ArgumentError(missing, None, "an (L,) int64 tensor of device pointers",
                                "discrete weights need both b_ptrs and sfb_ptrs")
        if sfb_tensor is not None:
            raise ArgumentError("sfb_tensor", "a tensor", "None with discrete weights (sfb_ptrs holds their scales)")
        bp = _pointer_table(b_ptrs, "b_ptrs", l)
        sbp = _pointer_table(sfb_ptrs, "sfb_ptrs", l)
        if n is None or isinstance(n, bool) or not isinstance(n, int):
            raise ArgumentError("n", repr(n), "an int (N, rows of each expert's (N, K) weight)",
                                "discrete weights need n=")
    if n < 8 or n % 8:
        raise ArgumentError("n (N)", n, "a multiple of 8, at least 8 (16-byte output rows)")

    sfk = _ceil(k, sf_vec_size)
    sfa, sfb, ld, _ = _scales(sfa_tensor, sfb_tensor, sf_vec_size, a_rows, n, sfk, l, batched=False)
    call = ScaledCall(m=m, n=n, k=k, k_bytes=kb, sfk=sfk, l=l, ab=ab, sf=sfa.dtype, a=a, offsets=off, b=b,
                      b_strides=b_strides, b_ptrs=bp, sfb_ptrs=sbp, sfa=sfa, sfb=sfb, canonical=canonical,
                      sfa_ld=ld, a_index=idx, a_rows=a_rows)
    return call


def _scales(sfa_tensor: Any, sfb_tensor: Any, sf_vec_size: int, m: int, n: int, sfk: int, l: int,
            batched: bool) -> tuple[TensorView, TensorView | None, int, int]:
    """(SFA, SFB, SFA's pitch and batch stride in floats) of either recipe: MX atoms, or the
    blockwise recipe's FP32 tables (pitches 0 for atoms). Grouped SFA covers all rows (L = 1);
    grouped SFB is None with discrete weights (sfb_ptrs), batched SFB is required."""
    ld = ls = 0
    parse_b = sfb_tensor is not None or batched
    if sf_vec_size == BLOCKWISE:
        sfa, ld, ls = blockwise_sfa(sfa_tensor, "sfa_tensor", m, sfk, l, batched=batched)
        sfb = blockwise_sfb(sfb_tensor, "sfb_tensor", n, sfk, l) if parse_b else None
    else:
        sfa = sf_buffer(sfa_tensor, "sfa_tensor", m, sfk, l if batched else 1)
        sfb = sf_buffer(sfb_tensor, "sfb_tensor", n, sfk, l) if parse_b else None
    if sfb is not None and SF_AXIS[sfb.dtype] != SF_AXIS[sfa.dtype]:
        raise ArgumentError("sfb_tensor.dtype", sfb.dtype, f"{sfa.dtype} or raw bytes (the scale type of sfa_tensor)")
    return sfa, sfb, ld, ls


def _batched_operand(x: Any, name: str, dtypes: tuple[str, ...]) -> tuple[TensorView, int, int, int, int, int]:
    """A or B of seed 004 as (view, rows, K bytes, L, row stride, batch stride) from the kernel-facing
    ``(rows, K, L)`` or a 2-D ``(rows, K)``; K-major (the sm_90a kernels' and the wrapper's layout)."""
    v = args.tensor(x, name, ndims=(2, 3), dtypes=dtypes)
    rows, kb = v.shape[0], v.shape[1]
    l = v.shape[2] if v.ndim == 3 else 1
    if v.strides[1] != 1 and kb > 1:
        raise not_k_major(name, v, v.strides, is_mn_major(v.strides, v.shape, 0, 1), f"pass a K-major {name}")
    if rows < 1:
        raise ArgumentError(f"{name}.shape", tuple(v.shape), "at least one row")
    checks.row_pitch_aligned(v.strides[0], 1, f"{name}.stride[0]")
    lstride = v.strides[2] if v.ndim == 3 and l > 1 else v.strides[0] * rows
    checks.row_pitch_aligned(lstride, 1, f"{name}.stride[2]")
    return v, rows, kb, l, v.strides[0], lstride


def parse_batched(a_tensor: Any, b_tensor: Any, sfa_tensor: Any, sfb_tensor: Any, sf_vec_size: int) -> ScaledCall:
    """Validate seed 004's operands: A (M, K, L), B (N, K, L) (or 2-D for L = 1), their scales
    (devices and addresses: ``Op``, after every other argument)."""
    a, m, kb, l, a_ld, a_ls = _batched_operand(a_tensor, "a_tensor", AB_DTYPES)
    if kb < 16 or kb % 16:
        raise ArgumentError("a_tensor.shape[1] (K bytes)", kb, "a multiple of 16 bytes, at least 16 (TMA rows)")
    b, n, kbb, lb, b_ld, b_ls = _batched_operand(b_tensor, "b_tensor", same_format(a.dtype))
    if kbb != kb or lb != l:
        two_d = f" or (N, {kb})" if l == 1 else ""
        raise ArgumentError("b_tensor.shape", tuple(b.shape), f"(N, {kb}, {l}){two_d} (K and L from a_tensor)")
    if n < 8 or n % 8:
        raise ArgumentError("b_tensor.shape[0] (N)", n, "a multiple of 8, at least 8 (16-byte output rows)")
    k = 2 * kb if a.dtype in FP4_DTYPES else kb
    sfk = _ceil(k, sf_vec_size)
    sfa, sfb, ld, ls = _scales(sfa_tensor, sfb_tensor, sf_vec_size, m, n, sfk, l, batched=True)
    return ScaledCall(m=m, n=n, k=k, k_bytes=kb, sfk=sfk, l=l, ab=a.dtype, sf=sfa.dtype, a=a, offsets=None,
                      b=b, b_strides=(b_ld, b_ls), b_ptrs=None, sfb_ptrs=None, sfa=sfa, sfb=sfb,
                      canonical=a.ndim == 2, batched=True, a_lstride=a_ls, sfa_ld=ld, sfa_lstride=ls)


def scaled_maps(ln: Any, call: ScaledCall) -> dict[str, bytes]:
    """A, B, SFA and SFB tensor maps of block-scaled operands, boxes and swizzles from the contract
    of ``ln`` (the loaded kernel, fusegemm/ops/loaded_kernel.py; scale atoms of ATOM_BYTES,
    :mod:`fusegemm.formats.scales`)."""
    c, tiled = ln.contract, ln.tmaps.tiled
    kb, m, n, l = call.k_bytes, call.m, call.n, call.l
    box_a, box_b = (c.box_a_inner, c.box_a_outer), (c.box_b_inner, c.box_b_outer)
    if call.batched:
        a = tiled(call.a.ptr, "uint8", (kb, m, l), (call.a.strides[0], call.a_lstride), box_a + (1,), c.swizzle_a)
    else:
        a = tiled(call.a.ptr, "uint8", (kb, call.a_map_rows), (call.a.strides[0],), box_a, c.swizzle_a)
    if call.discrete:
        # Templates of the per-expert maps the kernel rewrites on the device: any aligned address
        # will do (A's is one).
        b = tiled(call.a.ptr, "uint8", (kb, n), (kb,), box_b, c.swizzle_b)
    else:
        b = tiled(call.b.ptr, "uint8", (kb, n, l), call.b_strides, box_b + (1,), c.swizzle_b)
    if call.blockwise:
        return {"tma_a": a, "tma_b": b, **_blockwise_scale_maps(ln, call)}
    # (gathered A: SFA's atoms cover A's token rows; the kernel's lanes copy their words, the map
    # stays unread)
    sfa = sf_atom_map(tiled, call.sfa.ptr, call.a_map_rows, call.sfk, l if call.batched else 1,
                      (128, c.sf_box_k, 1, 1))
    sfb_base, sfb_l = (call.sfa.ptr, 1) if call.discrete else (call.sfb.ptr, l)
    sfb = sf_atom_map(tiled, sfb_base, n, call.sfk, sfb_l, (128, c.sf_box_k, c.sf_box_nb, 1))
    return {"tma_a": a, "tma_b": b, "tma_sfa": sfa, "tma_sfb": sfb}


def sf_atom_map(tiled: Any, ptr: int, mn: int, sfk: int, l: int, box: tuple[int, ...]) -> Any:
    """The tensor map of a scale-atom buffer for ``(l, mn, sfk)`` scales: uint32 words, 4-D
    {128, K atoms, MN atoms, L} with dense atom strides (:mod:`fusegemm.formats.scales`)."""
    kt, mt = -(-sfk // 4), -(-mn // 128)
    return tiled(ptr, "uint32", (128, kt, mt, l), (ATOM_BYTES, kt * ATOM_BYTES, mt * kt * ATOM_BYTES), box, 0)


def sf_atom_group_words(sfk: int) -> int:
    """4-byte words from one 128-row atom group of a scale-atom buffer to the next (``sfk`` scales
    per row): its K atoms, :func:`sf_atom_map`'s MN stride."""
    return -(-sfk // 4) * ATOM_BYTES // 4


def blockwise_rows_map(tiled: Any, ptr: int, rows: int, sfk: int, ld: int, box_rows: int) -> Any:
    """The tensor map of blockwise 1x128 scales, float32 ``(rows, sfk)`` with unit stride along the
    rows and a K-block pitch of ``ld`` floats: boxes of ``box_rows`` rows by one 128-K block."""
    return tiled(ptr, "float32", (rows, sfk), (4 * ld,), (box_rows, 1), 0)


def _blockwise_scale_maps(ln: Any, call: ScaledCall) -> dict[str, Any]:
    """The blockwise recipe's scales: SFA (M, sfk[, L]) float32 as a map with boxes of the A box's
    rows by one K block; SFB by address (the kernel reads one float per 128-K stage)."""
    c, tiled = ln.contract, ln.tmaps.tiled
    m, sfk, l = call.a_map_rows, call.sfk, call.l
    if call.batched:
        sfa = tiled(call.sfa.ptr, "float32", (m, sfk, l), (4 * call.sfa_ld, 4 * call.sfa_lstride),
                    (c.box_a_outer, 1, 1), 0)
    else:
        sfa = blockwise_rows_map(tiled, call.sfa.ptr, m, sfk, call.sfa_ld, c.box_a_outer)
    return {"tma_sfa": sfa, "sfb": call.sfb.ptr if call.sfb is not None else 0}
