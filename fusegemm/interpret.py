"""The numpy interpreter of any spec's epilogue: the generic reference and the GPU harness's oracle.

:func:`interpret` evaluates one variant's resolved epilogue (``Epilogue.resolve(choice)``,
generator/epilogue.py) on an FP32 accumulator and the spec's inputs, the way the generated C++
rule (generator/emit.py, templates/rule.cu.j2) and its engine
(templates/include/fusegemm/epilogue_block.cuh) compute it:

* every value is FP32; ``+ - * /`` are rounded once each (the C++ uses ``__fadd_rn``... and never
  contracts into an FMA); numbers are FP32; comparisons, ``isnan`` and ``where`` as in C++;
* each function is its row of generator/functions.py, whose ``numpy`` definition
  (:data:`NUMPY_FUNCTIONS`) has the C++'s NaN and signed-zero rules; transcendental functions are
  correctly rounded from float64: the C++ may differ by the function's ``ulp``;
* outputs are stored as a kernel stores them: bf16/fp16/fp32 round to nearest even (overflow to
  Inf); FP8/FP4 without quantization ``cvt.rn.satfinite``; FP8/FP4 with quantization per the
  output's SFD convention (E8M0 scales rounded up, the ``rcp.approx.ftz`` flushes, the FLT_MAX
  clamp, ``fl(x * scale)``, ``cvt.rn.satfinite``), restated here step by step from the engine;
* reductions: per-expert / global NaN-propagating ``max |x|`` (initialised to -inf), row sums and
  per-expert column sums (float64 then rounded once; the kernel's FP32 atomics differ by
  rounding); a paired output's column sums cover its interleaved columns.

This module is independent of :mod:`fusegemm.reference` (the hand-written references of the seed
ops, which the tests cross-check it with); it uses :mod:`fusegemm.formats` only for element
conversions (FP8/FP4/bf16 casts, FP4 packing) and the SF atom layouts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from .formats.blockwise import AMAX_FLOOR
from .formats.numpy_dtypes import FORMATS, to_numpy
from .formats.elements import to_float32, to_format
from .formats.scales import pack_sf, pack_sf_discrete_col
from .generator.epilogue import BoolConst, Resolved
from .generator.expr import BinOp, Call, Expr, Neg, Num, Ref
from .generator.functions import FUNCTIONS

__all__ = ["Interpreted", "interpret", "paired_col", "NUMPY_FUNCTIONS", "sfd_block_scales"]

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
BLOCK = 32                      # pairing block and SFD block (always 32)
WIDE = ("float32", "float16", "bfloat16")
NARROW = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2")
CONVENTIONS = ("quant", "srelu", "dswiglu")
VEC_1X128 = 128                 # quantize.vec of the blockwise recipe's 1x128 output scales


# --------------------------------------------------------------------------------------------
# The function table: each function's numpy definition is its row of generator/functions.py
# --------------------------------------------------------------------------------------------
def _f32(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=F32)


# name -> numpy function of FP32 arrays (float32 result, or bool for conditions).
NUMPY_FUNCTIONS: dict[str, Callable[..., np.ndarray]] = {name: f.numpy for name, f in FUNCTIONS.items()}
_fmin_nan, _fmax_nan = NUMPY_FUNCTIONS["min"], NUMPY_FUNCTIONS["max"]     # the engine's NaN-propagating min/max


# --------------------------------------------------------------------------------------------
# SFD (the engine's sfd_block, e8m0_up and sfd_rcp, bit by bit)
# --------------------------------------------------------------------------------------------
def _e8m0_up(s: np.ndarray, satfinite: bool) -> np.ndarray:
    """``cvt.rp[.satfinite].ue8m0x2.f32`` of float32 ``s`` (sign ignored) as uint8 codes."""
    return to_format(_f32(s), "float8_e8m0fnu", rounding="up", saturate=satfinite).view(np.uint8)


def _sfd_rcp(b: np.ndarray) -> np.ndarray:
    """``rcp.approx.ftz`` of a decoded E8M0 byte: 0x00 -> +Inf, 0xFF -> NaN, 0xFE -> 0."""
    b = b.astype(np.uint32)
    r = ((np.uint32(254) - np.minimum(b, np.uint32(254))) << np.uint32(23)).astype(np.uint32).view(F32)
    r = np.where(b == 0, F32(np.inf), r)
    r = np.where(b == 0xFE, F32(0), r)
    return np.where(b == 0xFF, F32(np.nan), r).astype(F32)


def sfd_block_scales(a: np.ndarray, nc: np.float32, rl: np.float32, convention: str,
                     col: bool) -> tuple[np.ndarray, np.ndarray]:
    """The scale and the stored E8M0 byte of SFD blocks with ``a = max|x|`` (the engine's sfd_block).

    Parameters
    ----------
    a : float32 array
        NaN-propagating ``max |x|`` of each 32-element block.
    nc : float32
        ``norm_const`` and ``rcp_max`` (1 / the output format's largest value).
    rl : float32
        ``norm_const`` and ``rcp_max`` (1 / the output format's largest value).
    convention : {"quant", "srelu", "dswiglu"}
        Operation order and saturation: quant ``s = fl(fl(a*rl)*nc)``, no saturation;
        srelu/dswiglu column blocks ``s = fl(a*fl(rl*nc))`` and ``scale = fl(nc*min(r, FLT_MAX))``
        (row blocks as quant); srelu saturates the scale byte only, dswiglu both bytes.
    col : bool
        Column blocks (SFD_col) rather than row blocks (SFD_row).

    Returns
    -------
    scale : float32 array
        What the block's values are multiplied by before conversion.
    stored : uint8 array
        The SFD byte written.
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"convention={convention!r}; allowed: {', '.join(CONVENTIONS)}")
    alt = col and convention != "quant"
    a, nc, rl = _f32(a), F32(nc), F32(rl)
    with np.errstate(all="ignore"):
        s = (a * (rl * nc)) if alt else ((a * rl) * nc)
        r = _sfd_rcp(_e8m0_up(s, satfinite=convention != "quant"))
        scale = (nc * _fmin_nan(r, FLT_MAX)) if alt else _fmin_nan(nc * r, FLT_MAX)
    return _f32(scale), _e8m0_up(s, satfinite=convention == "dswiglu")


def _quantize_rows(x: np.ndarray, nc, rl, convention: str, col: bool) -> tuple[np.ndarray, np.ndarray]:
    """Blocks of 32 consecutive columns of each row of ``x`` (R, C), zero padded past C.

    Returns ``fl(x * scale)`` (R, C) and the stored bytes (R, ceil(C / 32)).
    """
    rows, cols = x.shape
    nb = -(-cols // BLOCK)
    padded = np.zeros((rows, nb * BLOCK), dtype=F32)
    padded[:, :cols] = x
    blocks = padded.reshape(rows, nb, BLOCK)
    with np.errstate(all="ignore"):
        a = np.max(np.abs(blocks), axis=-1) if nb and rows else np.zeros((rows, nb), F32)  # NaN wins
        scale, stored = sfd_block_scales(a, nc, rl, convention, col)
        y = (blocks * scale[:, :, None]).astype(F32).reshape(rows, nb * BLOCK)[:, :cols]
    return np.ascontiguousarray(y), stored


def _pow2_up(s: np.ndarray) -> np.ndarray:
    """The smallest power of two >= each positive normal float32 (Inf and NaN stay), exactly."""
    b = _f32(s).view(np.uint32)
    up = np.where(((b & 0x7F800000) == 0x7F800000) | ((b & 0x007FFFFF) == 0), b, (b & 0x7F800000) + 0x00800000)
    return up.astype(np.uint32).view(F32)


def quantize_1x128_rows(x: np.ndarray, nc, dtype: str, pow2: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The fragment epilogue's 1x128 row quantization (``quantize.vec: 128``), step by step in
    float32: ``t = fl(nc * x)``; per block of 128 columns (zero padded past C) ``a = max|t|``
    (NaN wins), ``s = fl(max(a, 1e-4) / elem_max)`` (448 for e4m3, 57344 for e5m2, as
    :func:`fusegemm.formats.quantize_1x128`); the values are ``fl(t / s)``, converted with
    ``cvt.rn.satfinite``. Dequantized (``q * s``) they are ``nc * x``. ``pow2``: each ``s`` rounded
    up to a power of two (UE8M0: ``quantize_1x128(..., scales="pow2")``), so that ``t / s`` is exact.

    Returns ``fl(t / s)`` (R, C) float32 and the scales (R, ceil(C / 128)) float32.
    """
    rows, cols = x.shape
    nb = -(-cols // VEC_1X128)
    t = np.zeros((rows, nb * VEC_1X128), dtype=F32)
    with np.errstate(all="ignore"):
        t[:, :cols] = F32(nc) * _f32(x)
        blocks = t.reshape(rows, nb, VEC_1X128)
        a = np.max(np.abs(blocks), axis=-1) if nb and rows else np.zeros((rows, nb), F32)   # NaN wins
        s = (_fmax_nan(a, F32(AMAX_FLOOR)) / F32(FORMATS[dtype].max_finite)).astype(F32)
        if pow2:
            s = _pow2_up(s)
        y = (blocks / s[:, :, None]).astype(F32).reshape(rows, nb * VEC_1X128)[:, :cols]
    return np.ascontiguousarray(y), s


# --------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------
_KEYS = ("c", "d", "d_col", "sfd_row", "sfd_col", "amax", "dprob", "dbias")


@dataclass(frozen=True)
class Interpreted:
    """What one epilogue produces: the stored outputs, the reductions and the FP32 values.

    Attributes
    ----------
    c, d : numpy.ndarray or None
        Stored outputs (grouped: ``(m_rows, width)``; batched: ``(L, M, width)``), in the output
        dtype's storage (ml_dtypes arrays; packed FP4 as ``uint8`` with half the columns). ``d``
        is None when it is only column-quantized (``quantize.row: false``: the kernel writes
        ``d_col`` alone). Rows at or after valid_m are zero.
    d_col : numpy.ndarray or None
        Column-quantized D (``quantize.col: d_col``), same layout as ``d``.
    sfd_row, sfd_col : numpy.ndarray or None
        E8M0 bytes as ``uint8`` in the physical SF atom layout, ``(1, ceil(m_rows/128),
        ceil(nblk/4), 32, 4, 4)`` for ``sf[m, n // 32]`` and ``(1, ceil(width/128),
        ceil(ceil(m_rows/32)/4), 32, 4, 4)`` for ``sf[n, m // 32]`` (or the discrete_col_sfd order).
    amax : numpy.ndarray or None
        float32 ``(L, S)`` per expert (S = largest slot + 1), or ``(1,)`` global.
    dprob : numpy.ndarray or None
        float32 ``(m_rows,)`` row sums (zero at or after valid_m).
    dbias : numpy.ndarray or None
        float32 ``(L, W)`` column sums over each expert's rows (``scope: column``); ``(L, 2W)`` when
        the sum is a paired output's: ``dbias[e, j]`` sums column j of the output as stored (gate
        and up blocks interleaved), of the FP32 values before conversion.
    values : mapping
        Every live statement's FP32 value by name: ``(valid_m, W)`` (batched ``(L, M, W)``).
    out_values : mapping
        Each output's FP32 values by its name, in its layout (paired D interleaved, ``2W``
        columns), before conversion or SFD scaling; zero past valid_m.
    named : mapping
        Stored outputs whose spec names are not ``c`` / ``d`` (``result["h"]``), as ``c``/``d``.
    """

    c: np.ndarray | None = None
    d: np.ndarray | None = None
    d_col: np.ndarray | None = None
    sfd_row: np.ndarray | None = None
    sfd_col: np.ndarray | None = None
    amax: np.ndarray | None = None
    dprob: np.ndarray | None = None
    dbias: np.ndarray | None = None
    values: Mapping[str, np.ndarray] = field(default_factory=dict)
    out_values: Mapping[str, np.ndarray] = field(default_factory=dict)
    named: Mapping[str, np.ndarray] = field(default_factory=dict)   # outputs the spec names otherwise

    def __getitem__(self, key: str) -> Any:
        if key in self.named:
            return self.named[key]
        if key not in _KEYS + ("values", "out_values"):
            raise KeyError(f"{key!r}; allowed: {', '.join(self.keys() + ('values', 'out_values'))}")
        return getattr(self, key)

    def keys(self) -> tuple[str, ...]:
        """The output keys (``c, d, d_col, sfd_row, sfd_col, amax, dprob``, then the outputs a
        spec names otherwise)."""
        return _KEYS + tuple(self.named)

    def items(self) -> Iterator[tuple[str, Any]]:
        """``(key, value)`` of the output keys, None for inactive outputs."""
        return ((k, self[k]) for k in self.keys())


def paired_col(j: Any, role: int) -> Any:
    """Column of element column ``j`` of ``role`` (0 gate, 1 up) in a 32-column interleaved
    tensor: ``(j // 32) * 64 + j % 32 + 32 * role`` (fusegemm::epi::paired_col)."""
    return (j // BLOCK) * (2 * BLOCK) + j % BLOCK + BLOCK * role


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------
def _as_declared(name: str, x: Any, dtype: str) -> np.ndarray:
    """``x`` as float32 values, checked to be exactly what a ``dtype`` tensor holds.

    Arrays in the declared dtype (or raw ``uint8`` codes of a declared FP8 dtype) are decoded
    exactly; float64 is rounded to float32 first; values a ``dtype`` tensor cannot hold exactly
    are an error (the kernel would read a rounded value).
    """
    arr = to_numpy(x, argument=name)
    if arr.dtype == np.uint8 and dtype in ("float8_e4m3fn", "float8_e5m2"):
        return to_float32(arr, dtype=dtype)
    if arr.dtype.kind in "biu" or arr.dtype == np.float64:
        arr = arr.astype(F32)
    try:
        vals = to_float32(arr)
    except (TypeError, ValueError) as err:
        raise ValueError(f"input {name!r}: cannot read dtype {arr.dtype} as {dtype} ({err})") from None
    vals = np.asarray(vals, dtype=F32)
    if dtype != "float32":
        with np.errstate(all="ignore"):
            back = to_float32(to_format(vals, dtype))
        bad = ~((back == vals) | (np.isnan(back) & np.isnan(vals)))
        if np.any(bad):
            i = np.flatnonzero(bad.ravel())[0]
            raise ValueError(f"input {name!r} is declared {dtype}, but holds {vals.ravel()[i]!r}, which "
                             f"{dtype} cannot represent; pass the {dtype} values the kernel reads")
    return vals


def _shape_msg(inp, l: int, m_rows: int, n_acc: int, width: int) -> str:
    return {"scalar": "a float or a (1,) array", "expert": f"({l},)", "row": f"({m_rows},)",
            "column": f"({n_acc}, {l}) (column j of expert e at [j, e])",
            "element": f"({m_rows}, {width})"}[inp.per]


# --------------------------------------------------------------------------------------------
# The interpreter
# --------------------------------------------------------------------------------------------
def interpret(resolved: Resolved, acc: np.ndarray, *, offsets: np.ndarray | None, m_rows: int,
              inputs: Mapping[str, Any], rcp_max: float | None = None,
              discrete_col_sfd: bool = False, batched: bool = False) -> Interpreted:
    """Evaluate one variant's epilogue in numpy, as the generated kernel computes it.

    Parameters
    ----------
    resolved : Resolved
        ``spec.epilogue.resolve(variant.choices)``.
    acc : float32 array
        Grouped: ``(valid_m, N_acc)`` accumulator rows, ``valid_m = offsets[-1]`` (more rows are
        accepted and ignored). Batched (``batched=True``): ``(L, M, N_acc)``.
    offsets : int array (L,) or None
        Cumulative expert row ends (grouped); None when batched (the batch is the expert).
    m_rows : int
        Rows of the outputs (grouped: >= valid_m; batched: M).
    inputs : mapping
        The spec's inputs by name: expert ``(L,)``; row ``(m_rows,)``; scalar a float or
        ``(1,)``; column ``(N_acc, L)`` (column j of expert e; with a paired accumulator read at
        ``paired_col(j, role)``); element ``(m_rows, width)``, ``width = 2W`` when paired.
        Values must be exactly representable in the input's declared dtype (arrays of that dtype
        are). An input with a ``default`` may be None or left out; a missing required input is
        an error. Names the variant does not read are ignored.
    rcp_max : float, optional
        SFD ``rl`` (1/448 e4m3, 1/57344 or 1/128 e5m2, 1/6 e2m1); required when an output is
        SFD-quantized.
    discrete_col_sfd : bool
        SFD_col in the per-expert atom order (``formats.pack_sf_discrete_col``).
    batched : bool
        The batched dense problem (gemm_amax): no offsets, row inputs per batch row.

    Returns
    -------
    Interpreted
        Stored outputs, SFD bytes, reductions and FP32 values. The element space has width
        ``W = N_acc // 2`` when the accumulator is paired, else ``N_acc``.

    Raises
    ------
    ValueError
        Shapes, missing inputs, values a declared dtype cannot hold, a missing ``rcp_max``, or
        what the kernel engine does not define (SFD or row sums of a batched problem, mixed
        global/per-expert amax, paired widths not a multiple of 32).
    """
    with np.errstate(all="ignore"):      # Inf - Inf, 0 * Inf...: IEEE results, as on the GPU
        return _interpret(resolved, acc, offsets=offsets, m_rows=m_rows, inputs=inputs, rcp_max=rcp_max,
                          discrete_col_sfd=discrete_col_sfd, batched=batched)


def _interpret(resolved: Resolved, acc: np.ndarray, *, offsets, m_rows, inputs, rcp_max, discrete_col_sfd,
               batched) -> Interpreted:
    acc = np.asarray(acc)
    if acc.dtype != F32:
        raise ValueError(f"acc must be float32 (the FP32 accumulator); got {acc.dtype}")
    m_rows = int(m_rows)
    if batched:
        if acc.ndim != 3 or acc.shape[1] != m_rows:
            raise ValueError(f"batched acc must be (L, M={m_rows}, N); got shape {acc.shape}")
        if offsets is not None:
            raise ValueError("batched=True takes offsets=None (each batch is one expert)")
        l, n_acc = acc.shape[0], acc.shape[2]
        acc2 = acc.reshape(l * m_rows, n_acc)
        row_expert = np.repeat(np.arange(l), m_rows)
        in_row = np.tile(np.arange(m_rows), l)
        ranges = [(e * m_rows, (e + 1) * m_rows) for e in range(l)]
        valid_m = l * m_rows
        offs = None
    else:
        if offsets is None:
            raise ValueError("offsets (cumulative expert row ends) are required unless batched=True")
        offs = np.asarray(offsets).astype(np.int64).reshape(-1)
        starts = np.concatenate([[0], offs[:-1]])
        if offs.size == 0 or np.any(offs < starts):
            raise ValueError(f"offsets must be a nonempty nondecreasing list; got {offs.tolist()}")
        valid_m = int(offs[-1])
        if acc.ndim != 2 or acc.shape[0] < valid_m:
            raise ValueError(f"acc must be (valid_m={valid_m}, N_acc) float32; got shape {acc.shape}")
        if m_rows < valid_m:
            raise ValueError(f"m_rows={m_rows} is below valid_m={valid_m}")
        l, n_acc = offs.size, acc.shape[1]
        acc2 = acc[:valid_m]
        counts = offs - starts
        row_expert = np.repeat(np.arange(l), counts)
        in_row = np.arange(valid_m)
        ranges = [(int(a), int(b)) for a, b in zip(starts, offs)]

    paired_acc = resolved.paired_acc
    any_paired = resolved.paired_any
    if paired_acc and n_acc % (2 * BLOCK):
        raise ValueError(f"a paired accumulator needs N_acc % 64 == 0; got N_acc={n_acc}")
    width = n_acc // 2 if paired_acc else n_acc
    if any_paired and width % BLOCK:
        raise ValueError(f"paired values need an element width that is a multiple of 32; got {width}")
    roles = resolved.pairing.roles if resolved.pairing is not None else ()
    j = np.arange(width)
    role_cols = {r: paired_col(j, k) for k, r in enumerate(roles)}

    # ---- names -> FP32 values (broadcastable to (R, W))
    env: dict[tuple[str, str | None], Any] = {}
    if paired_acc:
        for r in roles:
            env[("acc", r)] = np.ascontiguousarray(acc2[:, role_cols[r]])
    else:
        env[("acc", None)] = acc2
    scalars: dict[str, np.float32] = {}
    for inp in resolved.inputs:
        x = inputs.get(inp.name)
        in_width = 2 * width if (inp.per == "element" and inp.paired) else width
        want = _shape_msg(inp, l, m_rows, n_acc, in_width)
        if x is None:
            if inp.default is None:
                raise ValueError(f"missing required input {inp.name!r} ({inp.per} input, {inp.dtype} "
                                 f"{want})")
            v = F32(inp.default)
            if inp.per == "scalar":
                scalars[inp.name] = v
            env[(inp.name, None)] = v
            continue
        vals = _as_declared(inp.name, x, inp.dtype)
        if inp.per == "scalar":
            if vals.size != 1:
                raise ValueError(f"input {inp.name!r}: got shape {vals.shape}; allowed: {want}")
            scalars[inp.name] = F32(vals.reshape(-1)[0])
            env[(inp.name, None)] = scalars[inp.name]
        elif inp.per == "expert":
            if vals.size != l or vals.ndim == 0 or vals.shape[0] != l:
                raise ValueError(f"input {inp.name!r}: got shape {vals.shape}; allowed: {want}")
            env[(inp.name, None)] = vals.reshape(l)[row_expert][:, None]
        elif inp.per == "row":
            if vals.size != m_rows or vals.ndim == 0 or vals.shape[0] != m_rows:
                raise ValueError(f"input {inp.name!r}: got shape {vals.shape}; allowed: {want}")
            env[(inp.name, None)] = vals.reshape(m_rows)[in_row][:, None]
        elif inp.per == "column":
            if vals.shape != (n_acc, l):
                raise ValueError(f"input {inp.name!r}: got shape {vals.shape}; allowed: {want}")
            per_row = vals.T[row_expert]                       # (R, N_acc)
            if paired_acc:
                for r in roles:
                    env[(inp.name, r)] = np.ascontiguousarray(per_row[:, role_cols[r]])
            else:
                env[(inp.name, None)] = per_row
        else:  # element
            if vals.ndim != 2 or vals.shape[1] != in_width or vals.shape[0] < m_rows:
                raise ValueError(f"input {inp.name!r}: got shape {vals.shape}; allowed: {want}")
            rows = vals[in_row]
            if inp.paired:
                for r in roles:
                    env[(inp.name, r)] = np.ascontiguousarray(rows[:, role_cols[r]])
            else:
                env[(inp.name, None)] = rows
    for c, value in resolved.constants.items():
        env[(c, None)] = F32(value)

    # ---- statements
    full = (valid_m, width)
    values: dict[str, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for st in resolved.statements:
            v = _eval(st.expr, env)
            if not isinstance(v, np.ndarray) or v.dtype != F32:
                v = _f32(v)
            v = np.ascontiguousarray(np.broadcast_to(v, full), dtype=F32)
            values[st.target] = v
            env[(st.target, None)] = v

    def shaped(x: np.ndarray) -> np.ndarray:            # (R, w) -> (m_rows, w) or (L, M, w)
        if batched:
            return x.reshape(l, m_rows, x.shape[1])
        out = np.zeros((m_rows,) + x.shape[1:], dtype=x.dtype)
        out[:valid_m] = x
        return out

    # ---- outputs
    result: dict[str, Any] = {}
    out_values: dict[str, np.ndarray] = {}
    for o in resolved.outputs:
        if o.paired is not None:
            x = np.zeros((valid_m, 2 * width), dtype=F32)
            for r, name in zip(roles, o.paired):
                x[:, role_cols[r]] = values[name]
        else:
            x = values[o.value]
        out_values[o.name] = shaped(x)
        if o.dtype not in WIDE + NARROW:
            raise ValueError(f"output {o.name!r} has dtype {o.dtype!r}; allowed: {', '.join(WIDE + NARROW)}")
        if o.dtype == "float4_e2m1fn_x2" and x.shape[1] % 2:
            raise ValueError(f"packed FP4 output {o.name!r} needs an even width; got {x.shape[1]}")
        q = o.quantize if o.dtype in NARROW else None
        if q is None:
            result[o.name] = shaped(_store(x, o.dtype))
            continue
        if batched:
            raise ValueError("SFD-quantized outputs are grouped outputs; the engine has none for batched problems")
        if rcp_max is None and q.vec != VEC_1X128:
            raise ValueError(f"output {o.name!r} is SFD-quantized ({o.dtype}): pass rcp_max (rl)")
        if q.norm_const not in scalars:
            raise ValueError(f"output {o.name!r} is SFD-quantized: its norm_const input "
                             f"{q.norm_const!r} is not among the resolved inputs")
        if q.vec == VEC_1X128:
            y, scales = quantize_1x128_rows(x, scalars[q.norm_const], o.dtype, pow2=bool(q.pow2))
            result[o.name] = shaped(_store(y, o.dtype))
            result["sfd_row"] = shaped(scales)
            continue
        nc, rl = scalars[q.norm_const], F32(rcp_max)
        if q.row:
            y, codes = _quantize_rows(x, nc, rl, q.convention, col=False)
            result[o.name] = shaped(_store(y, o.dtype))
            result["sfd_row"] = pack_sf(shaped(codes))
        if q.col is not None:
            y_t, codes_t = _quantize_rows(np.ascontiguousarray(x.T), nc, rl, q.convention, col=True)
            result[q.col] = shaped(_store(np.ascontiguousarray(y_t.T), o.dtype))
            sf = np.zeros((x.shape[1], -(-m_rows // BLOCK)), dtype=np.uint8)
            sf[:, : codes_t.shape[1]] = codes_t
            result["sfd_col"] = (pack_sf_discrete_col(sf, offs, rows=m_rows) if discrete_col_sfd
                                 else pack_sf(sf))

    # ---- reductions
    amax_reds = [r for r in resolved.reductions if r.kind == "amax"]
    if amax_reds:
        scopes = {r.scope for r in amax_reds}
        if len(scopes) > 1:
            raise ValueError("amax reductions of both scopes (expert and global) in one epilogue: the "
                             "kernel ABI has one amax buffer")
        if scopes == {"global"}:
            amax = np.full((1,), -np.inf, dtype=F32)
            for r in amax_reds:
                v = values[r.of]
                if v.size:
                    amax[0] = _fmax_nan(amax[0], np.max(np.abs(v)))
        else:
            slots = max(r.slot for r in amax_reds) + 1
            amax = np.full((l, slots), -np.inf, dtype=F32)
            for r in amax_reds:
                v = values[r.of]
                if v.shape[1] == 0:
                    continue
                row_max = np.max(np.abs(v), axis=1)            # NaN propagates
                for e, (a, b) in enumerate(ranges):
                    if b > a:
                        amax[e, r.slot] = _fmax_nan(amax[e, r.slot], np.max(row_max[a:b]))
        result["amax"] = amax
    colsums = [r for r in resolved.reductions if r.scope == "column"]
    if colsums:
        if batched:
            raise ValueError("column sums of a batched problem are not defined (the engine sums each expert's rows)")
        red = colsums[0]
        if red.paired is not None:       # the paired output's columns, interleaved as it stores them
            v = np.zeros((valid_m, 2 * width), dtype=np.float64)
            for r, name in zip(roles, red.paired):
                v[:, role_cols[r]] = values[name]
        else:
            v = values[red.of].astype(np.float64)
        dbias = np.zeros((l, v.shape[1]), dtype=F32)
        for e, (a, b) in enumerate(ranges):
            if b > a:
                dbias[e] = np.sum(v[a:b], axis=0).astype(F32)
        result["dbias"] = dbias
    sums = [r for r in resolved.reductions if r.scope == "row"]
    if sums:
        if batched:
            raise ValueError("row sums of a batched problem are not defined (the engine indexes dprob by row)")
        if len(sums) > 1:
            raise ValueError("more than one row-sum reduction; the kernel ABI has one dprob buffer")
        v = values[sums[0].of]
        result["dprob"] = shaped(np.sum(v.astype(np.float64), axis=1).astype(F32))

    shaped_values = {k: (v.reshape(l, m_rows, width) if batched else v) for k, v in values.items()}
    return Interpreted(**{k: v for k, v in result.items() if k in _KEYS}, values=shaped_values, out_values=out_values,
                       named={k: v for k, v in result.items() if k not in _KEYS})


def _store(x: np.ndarray, dtype: str) -> np.ndarray:
    """FP32 values as a kernel stores them: RNE with overflow to Inf for bf16/fp16/fp32,
    ``cvt.rn.satfinite`` for FP8/FP4 (packed FP4: uint8, even element in the low nibble)."""
    if dtype in WIDE:
        with np.errstate(over="ignore"):
            return x.astype(FORMATS[dtype].storage)
    return to_format(x, dtype, saturate=True)


def _eval(e: Expr, env: dict[tuple[str, str | None], Any]) -> Any:
    if isinstance(e, Num):
        return F32(e.value)
    if isinstance(e, Ref):
        try:
            return env[(e.name, e.role)]
        except KeyError:
            raise ValueError(f"name {e.name}{'.' + e.role if e.role else ''} has no value "
                             f"(an input the variant does not resolve?)") from None
    if isinstance(e, BoolConst):
        return np.bool_(e.value)
    if isinstance(e, Neg):
        return np.negative(_f32(_eval(e.arg, env)))
    if isinstance(e, BinOp):
        a, b = _eval(e.lhs, env), _eval(e.rhs, env)
        a, b = _f32(a), _f32(b)
        op = e.op
        if op == "+":
            return np.add(a, b, dtype=F32)
        if op == "-":
            return np.subtract(a, b, dtype=F32)
        if op == "*":
            return np.multiply(a, b, dtype=F32)
        if op == "/":
            return np.divide(a, b, dtype=F32)
        return {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
                "==": np.equal, "!=": np.not_equal}[op](a, b)
    if isinstance(e, Call):
        if e.fn == "where":
            cond = np.asarray(_eval(e.args[0], env), dtype=bool)
            return np.where(cond, _f32(_eval(e.args[1], env)), _f32(_eval(e.args[2], env))).astype(F32)
        if e.fn not in NUMPY_FUNCTIONS:
            raise ValueError(f"function {e.fn!r} has no numpy definition in fusegemm/interpret.py")
        return NUMPY_FUNCTIONS[e.fn](*(_eval(a, env) for a in e.args))
    raise TypeError(f"unexpected node {type(e).__name__}")
