"""Block-scaled GEMMs with a spec's epilogue: ``BlockScaledGemm(spec, ...)``, the op under the seed
wrappers of grouped GEMM + sReLU, + quant, + dSwiGLU and batched GEMM + amax
(fusegemm/ops/scaled_seeds.py, scaled_classes.py).

The operands are MXFP8 (e4m3 / e5m2 A and B with E8M0 scales per 32 K; packed FP4 on sm_100a),
A ``(M, K, 1)`` or ``(M, K)`` K-major, dense B ``(N, K, L)`` or ``(L, N, K)`` K-major or discrete
per-expert weights (``b_ptrs`` / ``sfb_ptrs``), scale factors in the 32x4x4 atom layout of
:mod:`fusegemm.formats.scales` given as the kernel-facing view, the physical buffer or a flat
buffer (each a view of the same dense bytes). The epilogue's inputs are passed by spec name and
every output it declares is returned, as :class:`~fusegemm.ops.epilogue_gemm.EpilogueGemm` does
for BF16 operands.

    op = BlockScaledGemm("grouped_gemm_srelu", d_dtype="float8_e4m3fn")
    out = op(a, sfa, padded_offsets, b, sfb, inputs={"alpha": alpha, "prob": prob, "norm_const": nc})
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .. import arguments as args
from ..base.errors import ArgumentError
from ..formats.scales import sf_physical_shape, sf_view_shape
from ..runtime.tensors import TensorView, dense_strides
from ..tupledict import TupleDict
from . import checks
from ..runtime import config
from .device import alloc_outputs, offsets_on_host
from .epilogue_gemm import SpecGemm
from .launcher import GroupedShape
from .prepared import is_dry

FAMILIES = ("grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu", "gemm_amax")
AB_DTYPES = ("float8_e4m3fn", "float8_e5m2", "uint8")        # uint8: packed FP4 (two per byte)
SF_DTYPES = ("float8_e8m0fnu", "uint8", "int8", "float8_e4m3fn")  # raw bytes are E8M0
SF_AXIS = {"float8_e8m0fnu": "float8_e8m0fnu", "uint8": "float8_e8m0fnu", "int8": "float8_e8m0fnu",
           "float8_e4m3fn": "float8_e4m3fn"}
ATOM_BYTES = 512


def ab_axis(dtype: str) -> str:
    """The ``ab_dtype`` axis value of an A/B tensor dtype (raw uint8 bytes are packed FP4)."""
    return "float4_e2m1fn_x2" if dtype == "uint8" else dtype


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


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
                 b_ptrs: Any, sfb_ptrs: Any, n: Any, sf_vec_size: int) -> ScaledCall:
    """Validate block-scaled grouped operands: shapes, dtypes and strides (devices and addresses:
    :func:`check_devices`, after every other argument)."""
    r = args.rows(a_tensor, AB_DTYPES)
    a, m, kb = r.a, r.m, r.k_stored
    ab = a.dtype
    if a.strides[1] != 1 and kb > 1 and m:   # an empty A's strides are arbitrary and unused
        raise ArgumentError("a_tensor.stride", a.strides, "K-major (stride 1 along K)", "pass a_tensor.contiguous()")
    if kb < 16 or kb % 16:
        raise ArgumentError("a_tensor.shape[1] (K bytes)", kb, "a multiple of 16 bytes, at least 16 (TMA rows)")
    if m:
        checks.row_pitch_aligned(a.strides[0], 1, "a_tensor.stride[0]")
    k = 2 * kb if ab == "uint8" else kb
    off, l = args.offsets(padded_offsets)
    checks.unit_stride(off, "padded_offsets")

    discrete = b_ptrs is not None or sfb_ptrs is not None
    if (b_tensor is None) != discrete:
        raise ArgumentError("b_tensor/b_ptrs", "both" if b_tensor is not None else "neither",
                            "exactly one of b_tensor (dense) and b_ptrs + sfb_ptrs (discrete)")
    b = bp = sbp = None
    b_strides = (0, 0)
    if b_tensor is not None:
        db = args.dense_b(b_tensor, kb, l, (ab,))
        b, (sn, sk, sl) = db.b, db.strides
        if sk != 1:
            raise ArgumentError("b_tensor.stride", b.strides, "K-major (stride 1 along K)", "weights must be K-major")
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
    sfa = sf_buffer(sfa_tensor, "sfa_tensor", m, sfk, 1)
    sfb = sf_buffer(sfb_tensor, "sfb_tensor", n, sfk, l) if sfb_tensor is not None else None
    if sfb is not None and SF_AXIS[sfb.dtype] != SF_AXIS[sfa.dtype]:
        raise ArgumentError("sfb_tensor.dtype", sfb.dtype, f"{sfa.dtype} or raw bytes (the scale type of sfa_tensor)")

    call = ScaledCall(m=m, n=n, k=k, k_bytes=kb, sfk=sfk, l=l, ab=ab, sf=sfa.dtype, a=a, offsets=off, b=b,
                      b_strides=b_strides, b_ptrs=bp, sfb_ptrs=sbp, sfa=sfa, sfb=sfb, canonical=r.canonical)
    return call


def _batched_operand(x: Any, name: str, dtypes: tuple[str, ...]) -> tuple[TensorView, int, int, int, int, int]:
    """A or B of seed 004 as (view, rows, K bytes, L, row stride, batch stride) from the kernel-facing
    ``(rows, K, L)`` or a 2-D ``(rows, K)``; K-major (the sm_90a kernels' and the wrapper's layout)."""
    v = args.tensor(x, name, ndims=(2, 3), dtypes=dtypes)
    rows, kb = v.shape[0], v.shape[1]
    l = v.shape[2] if v.ndim == 3 else 1
    if v.strides[1] != 1 and kb > 1:
        raise ArgumentError(f"{name}.stride", v.strides, "K-major (stride 1 along K)", f"pass a K-major {name}")
    if rows < 1:
        raise ArgumentError(f"{name}.shape", tuple(v.shape), "at least one row")
    checks.row_pitch_aligned(v.strides[0], 1, f"{name}.stride[0]")
    lstride = v.strides[2] if v.ndim == 3 and l > 1 else v.strides[0] * rows
    checks.row_pitch_aligned(lstride, 1, f"{name}.stride[2]")
    return v, rows, kb, l, v.strides[0], lstride


def parse_batched(a_tensor: Any, b_tensor: Any, sfa_tensor: Any, sfb_tensor: Any, sf_vec_size: int) -> ScaledCall:
    """Validate seed 004's operands: A (M, K, L), B (N, K, L) (or 2-D for L = 1), their scales
    (devices and addresses: :func:`check_devices`)."""
    a, m, kb, l, a_ld, a_ls = _batched_operand(a_tensor, "a_tensor", AB_DTYPES)
    if kb < 16 or kb % 16:
        raise ArgumentError("a_tensor.shape[1] (K bytes)", kb, "a multiple of 16 bytes, at least 16 (TMA rows)")
    b, n, kbb, lb, b_ld, b_ls = _batched_operand(b_tensor, "b_tensor", (a.dtype,))
    if kbb != kb or lb != l:
        two_d = f" or (N, {kb})" if l == 1 else ""
        raise ArgumentError("b_tensor.shape", tuple(b.shape), f"(N, {kb}, {l}){two_d} (K and L from a_tensor)")
    if n < 8 or n % 8:
        raise ArgumentError("b_tensor.shape[0] (N)", n, "a multiple of 8, at least 8 (16-byte output rows)")
    k = 2 * kb if a.dtype == "uint8" else kb
    sfk = _ceil(k, sf_vec_size)
    sfa = sf_buffer(sfa_tensor, "sfa_tensor", m, sfk, l)
    sfb = sf_buffer(sfb_tensor, "sfb_tensor", n, sfk, l)
    if SF_AXIS[sfb.dtype] != SF_AXIS[sfa.dtype]:
        raise ArgumentError("sfb_tensor.dtype", sfb.dtype, f"{sfa.dtype} or raw bytes (the scale type of sfa_tensor)")
    return ScaledCall(m=m, n=n, k=k, k_bytes=kb, sfk=sfk, l=l, ab=a.dtype, sf=sfa.dtype, a=a, offsets=None,
                      b=b, b_strides=(b_ld, b_ls), b_ptrs=None, sfb_ptrs=None, sfa=sfa, sfb=sfb,
                      canonical=a.ndim == 2, batched=True, a_lstride=a_ls)


def check_devices(call: ScaledCall, more: list[tuple[str, TensorView, int]] = ()) -> int:
    """Every operand (and ``more``: (name, view, alignment)) on a_tensor's CUDA device at an
    aligned address; the device ordinal."""
    named = [("padded_offsets", call.offsets, 4), ("b_tensor", call.b, 16), ("b_ptrs", call.b_ptrs, 8),
             ("sfb_ptrs", call.sfb_ptrs, 8), ("sfa_tensor", call.sfa, 16), ("sfb_tensor", call.sfb, 16), *more]
    device = checks.require_cuda(call.a, "a_tensor")
    checks.same_device([(nm, v) for nm, v, _ in named if v is not None], call.a.device)
    checks.aligned(call.a, "a_tensor", 16)
    for nm, v, align in named:
        if v is not None:
            checks.aligned(v, nm, align)
    return device


class BlockScaledGemm(SpecGemm):
    """Compiled block-scaled grouped GEMM with a spec's epilogue, for one variant.

    Parameters
    ----------
    spec : Spec, spec name or path to a YAML file
        A spec of kernel family ``grouped_gemm_srelu``, ``grouped_gemm_quant``,
        ``grouped_gemm_dswiglu`` (call the op) or ``gemm_amax`` (call :meth:`batched`), or a user
        spec of one of them.
    arch : str, optional
        Default: the device's (``device``).
    device : int
        CUDA device ordinal (default 0).
    e5m2_rcp_max : {"page", "nvidia"}
        SFD convention of an e5m2 output.
    **axes
        Variant choices (``ab_dtype``, ``d_dtype``, ``weight_mode``, tiles...); the rest take the
        spec's and the arch's defaults.
    """

    FAMILIES = FAMILIES
    WHAT = "block-scaled A/B"

    def __call__(self, a_tensor: Any, sfa_tensor: Any, padded_offsets: Any, b_tensor: Any = None,
                 sfb_tensor: Any = None, *, b_ptrs: Any = None, sfb_ptrs: Any = None, n: int | None = None,
                 inputs: Mapping[str, Any] | None = None, current_stream: Any = None,
                 input_names: Mapping[str, str] | None = None) -> TupleDict:
        """Run and return the epilogue's outputs by spec name (c, d, d_col, sfd_row, sfd_col,
        amax, dprob: the present ones; FP8/FP4 outputs as raw bytes, SF buffers physical, amax
        starting at -inf, dprob at 0).

        Parameters
        ----------
        a_tensor : (M, K) or (M, K, 1)
            FP8 (or packed FP4) A, K-major, M a multiple of 256 (grouped) or any M (batched).
        sfa_tensor : scale buffer
            A's scales: physical atoms, kernel-facing view or flat.
        padded_offsets : (L,) int32
            Each expert's end row (grouped families).
        b_tensor : (L, N, K) or its (N, K, L) view, optional
            Dense weights in A's format, K-major.
        sfb_tensor : scale buffer, optional
            B's scales.
        b_ptrs : (L,) int64 tensor, optional
            Discrete weights: device addresses of each expert's (N, K) weights.
        sfb_ptrs : (L,) int64 tensor, optional
            Discrete weights: device addresses of each expert's scale buffer.
        n : int, optional
            N of discrete weights.
        inputs : dict, optional
            The epilogue's inputs by spec name (alpha, prob, bias, norm_const, ...).
        current_stream : stream, optional
            Where to launch; default torch's current stream.
        input_names : dict, optional
            The caller's argument name of each input (for error messages).
        """
        v = self.variant
        call = parse_scaled(a_tensor, sfa_tensor, padded_offsets, b_tensor, sfb_tensor, b_ptrs, sfb_ptrs,
                            n, v.sf_vec_size)
        self.check_operands(call)
        w = self.widths(call.n)[0]
        deferred: list = []
        values, keep = self._inputs(inputs or {}, call, w, deferred, input_names)
        device = self.check_device(call, deferred)
        self.compile()
        out = alloc_outputs(self.epilogue, call.n, call.m, call.l, f"cuda:{device}")
        self.launch(call, values, out, current_stream)
        del keep
        return TupleDict(**out)

    def batched(self, a_tensor: Any, b_tensor: Any, sfa_tensor: Any, sfb_tensor: Any,
                current_stream: Any = None) -> TupleDict:
        """Run a batched family (seed 004, ``gemm_amax``): A (M, K, L), B (N, K, L) and their
        scales; returns the epilogue's outputs by spec name (C as (L * M, N) rows, or (L * N, M)
        when ``cd_major`` is m; the global amax (1,), starting at -inf).

        Parameters
        ----------
        a_tensor : (M, K, L) or (M, K)
            FP8 A, K-major.
        b_tensor : (N, K, L) or (N, K)
            FP8 B, K-major.
        sfa_tensor : scale buffer
            A's scales.
        sfb_tensor : scale buffer
            B's scales.
        current_stream : stream, optional
            Where to launch; default torch's current stream.
        """
        if self.spec.problem != "batched":
            raise ArgumentError("spec", self.spec.name, "a batched spec (problem: batched) for batched()")
        call = parse_batched(a_tensor, b_tensor, sfa_tensor, sfb_tensor, self.variant.sf_vec_size)
        self.check_operands(call)
        device = self.check_device(call)
        self.compile()
        out = alloc_outputs(self.epilogue, call.n, call.l * call.m, 1, f"cuda:{device}")
        self.launch(call, {}, out, current_stream)
        return TupleDict(**out)

    def check_device(self, call: ScaledCall, more: list[tuple[str, TensorView, int]] = ()) -> int:
        """:func:`check_devices`, and the device is the one this op was built for."""
        device = check_devices(call, more)
        if device != self.device:
            raise ArgumentError("a_tensor.device", f"cuda:{device}", f"cuda:{self.device} (the device this op "
                                "was built for)")
        return device

    def check_operands(self, call: ScaledCall) -> None:
        """The operands are of the format this op was built for."""
        v = self.variant
        if ab_axis(call.ab) != v.ab_dtype:
            raise ArgumentError("a_tensor.dtype", call.ab, f"{v.ab_dtype} (the A/B format this op was built for)")
        if SF_AXIS[call.sf] != v.sf_dtype:
            raise ArgumentError("sfa_tensor.dtype", call.sf, f"{v.sf_dtype} scales (this op's sf_dtype)")
        if call.discrete != (v.weight_mode == "discrete"):
            raise ArgumentError("b_tensor/b_ptrs", "b_ptrs" if call.discrete else "b_tensor",
                                f"the {v.weight_mode} weights this op was built for")

    def launch(self, call: ScaledCall, values: dict[str, Any], out: dict[str, Any], current_stream: Any) -> None:
        """Encode the maps, pack the parameters and launch on ``current_stream``."""
        from ..runtime.load import thread_context
        from ..runtime.tensors import resolve_stream
        if is_dry():
            return   # a fake implementation's trace: outputs allocated, nothing to launch
        thread_context(self.device)
        ln = self._launcher
        tile_m = self.variant.tile_m
        # Batched: the grid covers L * ceil(M / TILE_M) row blocks; m_rows is M of one batch.
        rows = call.l * _ceil(call.m, tile_m) * tile_m if call.batched else call.m
        s = GroupedShape(m=rows, n=call.n, k=call.k, l=call.l, a_ld=call.a.strides[0], b_sn=call.b_strides[0],
                         b_sl=call.b_strides[1], discrete=call.discrete)
        stream = resolve_stream(current_stream, self.device)
        if call.offsets is not None and config.validate_offsets():
            # Opt-in (FUSEGEMM_VALIDATE_OFFSETS), as for the BF16 op: a host copy, never during capture.
            host = offsets_on_host(call.offsets.obj, stream)
            if host is not None:
                args.offsets_values(host, call.m)
        if rows < tile_m:
            return   # no row tile (an empty A): nothing to map or launch; outputs hold their fills
        grid = ln.grid(s)
        values.update(self.maps(call))
        values.update(ln.scalars(s))
        values.update({"m_rows": call.m, "offsets": call.offsets.ptr if call.offsets is not None else 0,
                       "rcp_max": self.rcp_max,
                       "b_ptrs": call.b_ptrs.ptr if call.b_ptrs is not None else 0,
                       "sfb_ptrs": call.sfb_ptrs.ptr if call.sfb_ptrs is not None else 0})
        values.update(self.epilogue.buffer_params({name: t.data_ptr() for name, t in out.items()}, call.n))
        if self.variant.cd_major == "m":
            values["ldc"] = call.m   # C is (L, N, M): rows of M elements
        values.update(ln.workspace(grid, call.discrete, stream, current_stream is not None))
        ln.launch(values, grid, stream)

    def maps(self, call: ScaledCall) -> dict[str, bytes]:
        """A, B, SFA and SFB tensor maps, boxes and swizzles from the kernel's contract."""
        c = self._launcher.contract
        tiled = self._launcher.tmaps.tiled
        kb, m, n, l = call.k_bytes, call.m, call.n, call.l
        box_a, box_b = (c.box_a_inner, c.box_a_outer), (c.box_b_inner, c.box_b_outer)
        if call.batched:
            a = tiled(call.a.ptr, "uint8", (kb, m, l), (call.a.strides[0], call.a_lstride), box_a + (1,), c.swizzle_a)
        else:
            a = tiled(call.a.ptr, "uint8", (kb, m), (call.a.strides[0],), box_a, c.swizzle_a)
        if call.discrete:
            # Templates of the per-expert maps the kernel rewrites on the device: any aligned
            # address will do (A's is one).
            b = tiled(call.a.ptr, "uint8", (kb, n), (kb,), box_b, c.swizzle_b)
        else:
            b = tiled(call.b.ptr, "uint8", (kb, n, l), call.b_strides, box_b + (1,), c.swizzle_b)
        kt, mt, nt = _ceil(call.sfk, 4), _ceil(m, 128), _ceil(n, 128)
        box_sfa, box_sfb = (128, c.sf_box_k, 1, 1), (128, c.sf_box_k, c.sf_box_nb, 1)
        sfa = tiled(call.sfa.ptr, "uint32", (128, kt, mt, l if call.batched else 1),
                    (ATOM_BYTES, kt * ATOM_BYTES, mt * kt * ATOM_BYTES), box_sfa, 0)
        sfb_base, sfb_l = (call.sfa.ptr, 1) if call.discrete else (call.sfb.ptr, l)
        sfb = tiled(sfb_base, "uint32", (128, kt, nt, sfb_l), (ATOM_BYTES, kt * ATOM_BYTES, nt * kt * ATOM_BYTES),
                    box_sfb, 0)
        return {"tma_a": a, "tma_b": b, "tma_sfa": sfa, "tma_sfb": sfb}
