"""The blockwise FP8 recipe's quantizations on the GPU, one memory pass each
(``templates/include/fusegemm/quantize.cuh``), with the values of
:mod:`fusegemm.formats.torch_blockwise` bit for bit:

* :func:`quantize_1x128` and :func:`quantize_wgrad`: an activation or gradient for the
  recipe's GEMMs (1x128 along its rows) or for the FP8 weight gradient (transposed, 128 along
  the tokens); :func:`quantize_both` gives both from one read (the backward needs both of dY and
  of dG).
* :func:`quantize_128x128`: weights, optionally with the transposed copy the data gradients
  read (the same blocks: ``transposed_128x128``'s values).
* :func:`requantize_wgrad`: a 1x128-quantized FP8 matrix (fc1's ``h``) dequantized, rounded to
  bfloat16 and quantized along the tokens for the weight gradient.

torch's operations took a float32 copy, a min/max pass, a division and a cast per operand: on
the H200 the fp8_block MoE step ran at 0.22-0.61x torch's BF16 step with them, and at 0.93-1.59x
with these kernels (bench/results/moe_mlp_h200_fp8_block.json; each kernel 6-9.6x torch's
operations, bench/results/quantize_h200.json). Each function runs torch_blockwise's operations
instead where the kernel does not serve the tensor (the CPU, other dtypes, sizes not multiples of
16, unaligned strides, no NVRTC): the same values either way.

    from fusegemm import quantize as qz
    (xq, sx), (xt, sxt) = qz.quantize_both(x)         # x (T, H) bfloat16 on the GPU
    (wq, sw), (wt, swt) = qz.quantize_128x128(w, transposed=True)
"""
from __future__ import annotations

import struct
from typing import Any

import torch   # (torch_blockwise imports it too: the kernels serve torch tensors)

from .formats import torch_blockwise as bw
from .ops.small_kernels import SmallKernels

__all__ = ["quantize_1x128", "quantize_wgrad", "quantize_both", "quantize_128x128", "requantize_wgrad"]

_KERNELS = SmallKernels("fusegemm/quantize.cuh", "the blockwise quantization kernels",
                        "the fp8_block recipe quantizes with torch's operations")
_TILE = 128                 # kQuantizeTile
_THREADS = 256              # kQuantizeThreads
_POW2, _E5M2 = 1, 2         # kQuantizePow2, kQuantizeE5M2
# QuantizeParams: src, src_scales, q, s, qt, st; src_ld, src_batch, src_scales_ld, q_ld, q_batch, s_ld,
# s_batch, qt_ld, qt_batch, st_ld, st_batch; rows, cols, blocks, flags (152 bytes).
_PARAMS = struct.Struct("<6Q11q4i")
_SOURCES = {"torch.bfloat16": "fusegemm_quantize_bfloat16", "torch.float16": "fusegemm_quantize_float16",
            "torch.float8_e4m3fn": "fusegemm_quantize_float8_e4m3fn"}


def _flags(dtype: Any, scales: str) -> int:
    return (_POW2 if scales == "pow2" else 0) | (_E5M2 if dtype == torch.float8_e5m2 else 0)


def _served(x: Any, batched: bool = False) -> bool:
    """A CUDA matrix (or batch) the kernel reads: a 2-byte or e4m3 dtype, rows and columns
    multiples of 16, unit column stride, the row pitch and the start aligned for its vector loads."""
    if not getattr(x, "is_cuda", False) or str(x.dtype) not in _SOURCES or x.dim() != (3 if batched else 2):
        return False
    rows, cols = x.shape[-2:]
    es = x.element_size()
    grid_ok = rows // _TILE < 65535 and (not batched or x.shape[0] < 65536)
    return (rows % 16 == 0 and cols % 16 == 0 and rows > 0 and cols > 0 and grid_ok and x.stride(-1) == 1
            and (x.stride(-2) * es) % 16 == 0 and (not batched or (x.stride(0) * es) % 16 == 0)
            and x.data_ptr() % 16 == 0)


def _scale_buffer(lead: int, blocks: int, device: Any) -> tuple[Any, Any]:
    """(buffer (blocks, pitch) zeroed, the (lead, blocks) view with unit stride along ``lead``):
    the SFA layout of :func:`fusegemm.formats.blockwise_sfa_layout`."""
    buf = torch.zeros((blocks, -(-lead // 4) * 4), dtype=torch.float32, device=device)
    return buf, buf[:, :lead].t()


def _launch(x: Any, *, q: Any = None, s: Any = None, s_ld: int = 0, s_batch: int = 0, qt: Any = None, st: Any = None,
            st_ld: int = 0, st_batch: int = 0, blocks: bool = False, flags: int = 0, src_scales: Any = None,
            src_scales_ld: int = 0) -> bool:
    rows, cols = x.shape[-2:]
    batches = x.shape[0] if x.dim() == 3 else 1
    nil = 0
    raw = _PARAMS.pack(
        x.data_ptr(), src_scales.data_ptr() if src_scales is not None else nil,
        q.data_ptr() if q is not None else nil, s.data_ptr() if s is not None else nil,
        qt.data_ptr() if qt is not None else nil, st.data_ptr() if st is not None else nil,
        x.stride(-2), x.stride(0) if x.dim() == 3 else 0, src_scales_ld,
        cols, rows * cols if q is not None else 0, s_ld, s_batch,
        rows, rows * cols if qt is not None else 0, st_ld, st_batch,
        rows, cols, int(blocks), flags)
    grid = (-(-cols // _TILE), -(-rows // _TILE), batches)
    return _KERNELS.run_on(x, _SOURCES[str(x.dtype)], grid, (_THREADS, 1, 1), raw)


def quantize_1x128(x: Any, dtype: Any = torch.float8_e4m3fn, scales: str = "amax") -> tuple[Any, Any]:
    """:func:`fusegemm.formats.torch_blockwise.quantize_1x128` in one pass on the GPU: FP8 ``(M, K)``
    and float32 ``(M, ceil(K/128))`` scales in the SFA layout."""
    if _kernel_quantizes(x, dtype, scales):
        m, k = x.shape
        q = torch.empty((m, k), dtype=dtype, device=x.device)
        buf, s = _scale_buffer(m, -(-k // _TILE), x.device)
        if _launch(x, q=q, s=buf, s_ld=buf.shape[1], flags=_flags(dtype, scales)):
            return q, s
    return bw.quantize_1x128(x, dtype, scales)


def quantize_wgrad(y: Any, dtype: Any = torch.float8_e4m3fn, scales: str = "amax") -> tuple[Any, Any]:
    """:func:`fusegemm.formats.torch_blockwise.quantize_wgrad` in one pass on the GPU: FP8 ``y^T``
    (C, T), tokens contiguous, and float32 ``(C, ceil(T/128))`` scales in the SFA layout."""
    if _kernel_quantizes(y, dtype, scales):
        qt, st = _wgrad_outputs(y, dtype)
        if _launch(y, qt=qt, st=st[0], st_ld=st[0].shape[1], flags=_flags(dtype, scales)):
            return qt, st[1]
    return bw.quantize_wgrad(y, dtype, scales)


def quantize_both(y: Any, dtype: Any = torch.float8_e4m3fn, scales: str = "amax"
                  ) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """``(quantize_1x128(y), quantize_wgrad(y))`` from one read of ``y`` (T, C) on the GPU: the
    recipe's backward needs both of each gradient (its data gradient's A and its weight
    gradient's operand)."""
    if _kernel_quantizes(y, dtype, scales):
        t, c = y.shape
        q = torch.empty((t, c), dtype=dtype, device=y.device)
        buf, s = _scale_buffer(t, -(-c // _TILE), y.device)
        qt, st = _wgrad_outputs(y, dtype)
        if _launch(y, q=q, s=buf, s_ld=buf.shape[1], qt=qt, st=st[0], st_ld=st[0].shape[1],
                   flags=_flags(dtype, scales)):
            return (q, s), (qt, st[1])
    return bw.quantize_1x128(y, dtype, scales), bw.quantize_wgrad(y, dtype, scales)


def requantize_wgrad(q: Any, s: Any, dtype: Any = torch.float8_e4m3fn, scales: str = "amax", *,
                     via: Any = torch.bfloat16) -> tuple[Any, Any]:
    """``quantize_wgrad(dequantize_1x128(q, s).to(via))``: a 1x128-quantized e4m3 matrix (T, C)
    (fc1's FP8 ``h`` and its scales) as the FP8 weight gradient's operand, in one pass on the GPU
    (``via`` bfloat16, the default; any other rounding type takes torch's operations)."""
    if not isinstance(q, torch.Tensor) or q.dim() != 2 or q.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        got = f"{q.dtype} {tuple(q.shape)}" if isinstance(q, torch.Tensor) else type(q).__name__
        raise ValueError(f"q: got {got}; allowed: an FP8 (e4m3 or e5m2) tensor (T, C)")
    want = (q.shape[0], -(-q.shape[1] // _TILE))
    if not isinstance(s, torch.Tensor) or tuple(s.shape) != want or not s.is_floating_point():
        got = f"{s.dtype} {tuple(s.shape)}" if isinstance(s, torch.Tensor) else type(s).__name__
        raise ValueError(f"s: got {got}; allowed: q's float scales of shape {want} (one per row and 128 columns)")
    if (_served(q) and q.dtype == torch.float8_e4m3fn and via == torch.bfloat16 and _valid(dtype, scales)
            and s.is_cuda and s.dtype == torch.float32 and s.stride(0) == 1):
        qt, st = _wgrad_outputs(q, dtype)
        if _launch(q, qt=qt, st=st[0], st_ld=st[0].shape[1], flags=_flags(dtype, scales), src_scales=s,
                   src_scales_ld=s.stride(1)):
            return qt, st[1]
    return bw.quantize_wgrad(bw.dequantize_1x128(q, s).to(via), dtype, scales)


def quantize_128x128(w: Any, dtype: Any = torch.float8_e4m3fn, scales: str = "amax", *,
                     transposed: bool = False) -> Any:
    """:func:`fusegemm.formats.torch_blockwise.quantize_128x128` in one pass on the GPU: FP8
    ``(..., N, K)`` and float32 ``(..., ceil(N/128), ceil(K/128))`` scales; with ``transposed``,
    ``((q, scales), (q^T, scales^T))``, the second ``transposed_128x128``'s values (what the data
    gradients read), from the same read of ``w``."""
    w3 = w if w.dim() == 3 else (w.reshape(-1, *w.shape[-2:]) if w.dim() >= 2 and w.is_contiguous() else None)
    if w3 is not None and _kernel_quantizes(w3, dtype, scales, batched=True):
        *lead, n, k = w.shape
        nb, kb = -(-n // _TILE), -(-k // _TILE)
        q = torch.empty(w.shape, dtype=dtype, device=w.device)
        s = torch.empty((*lead, nb, kb), dtype=torch.float32, device=w.device)
        qt = torch.empty((*lead, k, n), dtype=dtype, device=w.device) if transposed else None
        st = torch.empty((*lead, kb, nb), dtype=torch.float32, device=w.device) if transposed else None
        if _launch(w3, q=q, s=s, s_ld=kb, s_batch=nb * kb, qt=qt, st=st, st_ld=nb, st_batch=nb * kb, blocks=True,
                   flags=_flags(dtype, scales)):
            return ((q, s), (qt, st)) if transposed else (q, s)
    q, s = bw.quantize_128x128(w, dtype, scales)
    return ((q, s), bw.transposed_128x128(q, s)) if transposed else (q, s)


def _valid(dtype: Any, scales: str) -> bool:
    """The element type and scale rule are ones the kernel has (others reach torch_blockwise's
    checks, which name them)."""
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and scales in bw.SCALES


def _kernel_quantizes(x: Any, dtype: Any, scales: str, batched: bool = False) -> bool:
    """The kernel quantizes ``x`` (a 2-byte source it serves) to ``dtype`` with ``scales``."""
    return _served(x, batched) and x.dtype != torch.float8_e4m3fn and _valid(dtype, scales)


def _wgrad_outputs(y: Any, dtype: Any) -> tuple[Any, tuple[Any, Any]]:
    """FP8 (C, T) and the (buffer, view) of its (C, ceil(T/128)) scales."""
    t, c = y.shape
    return torch.empty((c, t), dtype=dtype, device=y.device), _scale_buffer(c, -(-t // _TILE), y.device)
