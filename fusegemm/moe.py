"""An MoE expert MLP for training, built from fusegemm ops (BF16, MXFP8 and blockwise FP8 recipes).

Tokens arrive grouped by expert: ``x`` (M, H) bfloat16 where expert e owns rows
``[padded_offsets[e-1], padded_offsets[e])`` (multiples of 256; rows between an expert's last
token and its boundary hold zeros), ``prob`` (M,) the routing weight of each row.

    mlp = ExpertMLP(experts=8, hidden=1024, intermediate=2048).cuda()
    y = mlp(x, padded_offsets, prob)            # (M, H); rows at/past padded_offsets[-1] are 0
    y.float().square().mean().backward()        # grads of x, prob, mlp.w1, mlp.w2

Forward: fc1 with the fused SwiGLU epilogue (``specs/grouped_gemm_swiglu.yaml``:
``h = prob * silu(gate) * up`` straight out of the GEMM) then fc2 (``fusegemm.grouped_gemm``).
``w1`` is (L, 2F, H) in the seed's 32-column interleave (gate and up blocks alternate;
:func:`interleave_gate_up` converts from the usual ``[gate; up]`` stacking), ``w2`` (L, H, F).

The forward keeps fc1's pre-activations ``g`` (the same kernel stores them: ``generate_c``)
and ``h`` for the backward. Backward: fc2's data gradient with the dSwiGLU epilogue
(``specs/grouped_gemm_dswiglu_bf16.yaml``: ``dG`` and ``dprob`` straight out of the GEMM), fc1's
data gradient with the grouped GEMM (both read the weights in place as N-major B where the
device's kernel implements it: sm_90a and sm_100a), and the weight
gradients (K-grouped: a reduction over each expert's tokens) with fusegemm's K-grouped family
(:class:`fusegemm.KGroupedGemm`, ``specs/grouped_gemm_wgrad.yaml``) where the device's arch has
it and the shapes fit, else ``torch._grouped_mm`` (``wgrad="auto"``; see :data:`fusegemm.torch_library.WGRAD_KERNELS`).
The MXFP8 and blockwise FP8 recipes (``recipe="mxfp8"``, ``"fp8_block"``) are described at
:class:`ExpertMLP`.

``backend="torch"`` runs the same structure with torch matmuls (any device, any float dtype):
the reference the tests hold the fusegemm backend to, and what ``gradcheck`` differentiates.

:class:`MoEBlock` is the whole layer around it: router logits and token-major ``x`` in,
token-major output out. It routes (:func:`fusegemm.routing.route`: top-k and the padded
expert-sorted permutation on the device, no host synchronisation), runs the expert MLP on those
rows (each row's routing weight applied by the fused SwiGLU; on sm_90a its GEMMs read the token
rows through the routing's index, elsewhere a gather kernel permutes them first), and sums each
token's k rows back (:func:`fusegemm.routing.combine`). Autograd carries the gradients of ``x``,
of the logits (through dprob, the softmax and top-k) and of both weights. The gather and combine
are one-pass permutation kernels (fusegemm/permute.py), each the other's backward
(deterministic, no atomics). The routing's row ends (where each expert's tokens end inside its
256-row padded range) reach every GEMM: the sm_90a kernels leave the padding's tiles out of their
tile walk and the weight gradients its k-blocks. :class:`RoutedMLPFunction` is the same layer with
the permutation inside the GEMMs as well (gathered operands): bit-equal, what the block runs by
default where it can below an intermediate size of 4096 (``loads="auto"``; 1.06x the permuted step
at a qwen3-like layer on an H100, level at the dsv3-like ones, and a lower peak at every layer
measured; at a mixtral-like layer the permuted step is 1.05x faster, and auto takes it). The whole
layer's forward + backward step against a plain torch layer in the same run, both CUDA-graphed, on
an H100 with the rounds rotating the methods' order (bench/results/moe_layer_h100_rotated_headline.json):
1.46x (dsv3, 8 experts), 1.44x (dsv3, 32), 1.46x (mixtral), 1.80x (qwen3, 128 experts) on permuted
rows; with the gathered loads 1.44x / 1.45x / 1.43x / 1.92x (bench/results/moe_layer_h100_fair_peaks.json,
the permuted block 1.50x / 1.44x / 1.46x / 1.82x in the same rounds). Rounds that also balance which
method runs before which (a Williams design; the rotation had always run the null control right after
the torch layer, 4-5% slower) gave 1.47x / 1.40x / 1.41x / 1.93x with the gathered loads, and with
``loads="auto"`` 1.48x at mixtral (bench/results/moe_layer_h100_williams*.json). (The H200's
1.46x / 1.40x / 1.38x / 1.96x of 2026-12-03 came from rounds in a fixed order, which favoured the
block by about 4% at the big layers.)
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from . import quantize as qz
from .base.errors import ArgumentError
from .formats import torch_blockwise as bw
from .formats.torch_mx import dequantize_mx, kernel_view, pack_sf, quantize_mx, unpack_sf
from .routing import check_choice, combine, gather, route, row_probs, token_rows

__all__ = ["ExpertMLP", "ExpertMLPFunction", "MoEBlock", "RECIPES", "RoutedMLPFunction", "interleave_gate_up",
           "split_gate_up", "join_gate_up", "swiglu_backward"]

BLOCK = 32   # the seed's gate/up interleave (columns per block)


def interleave_gate_up(w_gate: Tensor, w_up: Tensor, block: int = BLOCK) -> Tensor:
    """(L, F, H) gate and up weights -> (L, 2F, H) with 32-row blocks alternating gate, up.

    Parameters
    ----------
    w_gate : (L, F, H) tensors
        The usual gate and up projections (F a multiple of ``block``).
    w_up : (L, F, H) tensors
        The usual gate and up projections (F a multiple of ``block``).
    block : int
        Rows per block of the interleave (32, the seed's).
    """
    if w_gate.shape != w_up.shape or w_gate.dim() != 3 or w_gate.shape[1] % block:
        raise ValueError(f"w_gate/w_up: got {tuple(w_gate.shape)} and {tuple(w_up.shape)}; allowed: equal "
                         f"(L, F, H) shapes with F a multiple of {block}")
    l, f, h = w_gate.shape
    pair = (w_gate.view(l, f // block, block, h), w_up.view(l, f // block, block, h))
    return torch.stack(pair, 2).reshape(l, 2 * f, h)


def split_gate_up(t: Tensor, block: int = BLOCK) -> tuple[Tensor, Tensor]:
    """The inverse along the last dimension: (..., 2F) interleaved -> gate (..., F), up (..., F).

    Parameters
    ----------
    t : (..., 2F) tensor
        Interleaved gate/up columns (a GEMM output against an interleaved ``w1``).
    block : int
        Columns per block (32).
    """
    pairs = t.unflatten(-1, (t.shape[-1] // (2 * block), 2, block))
    return pairs[..., 0, :].flatten(-2), pairs[..., 1, :].flatten(-2)


def join_gate_up(gate: Tensor, up: Tensor, block: int = BLOCK) -> Tensor:
    """gate, up (..., F) -> (..., 2F) interleaved (the inverse of :func:`split_gate_up`).

    Parameters
    ----------
    gate : (..., F) tensors
    up : (..., F) tensors
    block : int
        Columns per block (32).
    """
    g, u = gate.unflatten(-1, (-1, block)), up.unflatten(-1, (-1, block))
    return torch.stack((g, u), -2).flatten(-3)


def _swiglu(g: Tensor, prob: Tensor) -> Tensor:
    """``prob * silu(gate) * up`` of interleaved pre-activations, in accumulation precision."""
    gate, up = split_gate_up(_acc(g))
    return torch.nn.functional.silu(gate) * up * _acc(prob)[:, None]


def swiglu_backward(g: Tensor, dh: Tensor, prob: Tensor) -> tuple[Tensor, Tensor]:
    """Gradients of ``h = prob * silu(gate) * up`` (``g``: interleaved pre-activations (M, 2F),
    ``dh`` (M, F)): (dG interleaved (M, 2F), dprob (M,)), in float32 (or the inputs' dtype if wider).

    Parameters
    ----------
    g : (M, 2F) tensor
        fc1's pre-activations, gate/up interleaved.
    dh : (M, F) tensor
        Gradient of the activation output ``h``.
    prob : (M,) tensor
        Routing weight of each row.
    """
    dt = torch.promote_types(g.dtype, torch.float32)
    gate, up = (t.to(dt) for t in split_gate_up(g))
    dh, p = dh.to(dt), prob.to(dt)[:, None]
    sig = torch.sigmoid(gate)
    silu = gate * sig
    dgate = dh * p * up * sig * (1 + gate * (1 - sig))
    dup = dh * p * silu
    dprob = (dh * silu * up).sum(-1)
    return join_gate_up(dgate, dup), dprob


def _acc(t: Tensor) -> Tensor:
    """``t`` in its accumulation precision: float32, or wider when ``t`` is (gradcheck's float64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _expert_rows(padded_offsets: Tensor, m: int | None = None) -> list[tuple[int, int]]:
    """Each expert's [start, end) rows, from a host copy of the offsets (the per-expert weight
    gradients need it), checked: nondecreasing and, given ``m``, within the ``m`` rows of x
    (ArgumentError)."""
    ends = padded_offsets.tolist()
    prev = 0
    for e, end in enumerate(ends):
        if end < prev:
            raise ArgumentError(f"padded_offsets[{e}]", end, f"at least padded_offsets[{e - 1}] = {prev} "
                                "(nondecreasing)" if e else "at least 0")
        if m is not None and end > m:
            raise ArgumentError(f"padded_offsets[{e}]", end, f"at most {m}, the rows of x")
        prev = end
    return list(zip([0] + ends[:-1], ends))


def _check_like_weights(x: Tensor, w1: Tensor) -> None:
    """``x``'s dtype and device against the expert weights' (MoEBlock's tokens, the MLP's rows)."""
    if x.dtype != w1.dtype:
        raise ArgumentError("x.dtype", x.dtype, f"{w1.dtype}: the expert weights' dtype")
    if x.device != w1.device:
        raise ArgumentError("x.device", x.device, f"{w1.device}: the expert weights' device")


def block_rows(x: object, logits: object, w1: Tensor, experts: int) -> tuple[Tensor, Tensor, tuple]:
    """An MoE block's tokens x (..., H) and router logits (..., E) as token rows (T, H) and (T, E)
    and the tokens' leading shape (:func:`fusegemm.routing.token_rows`, which checks the shapes),
    checked against the expert weights w1 (L, 2F, H): x's dtype and device, then the logits'
    device. MoEBlock and ExpertParallelMoEBlock call it before they route, so a mismatch is named,
    not an error from inside the top-k or a matmul."""
    x2, logits2, lead = token_rows(x, logits, w1.shape[2], experts)
    _check_like_weights(x2, w1)
    if logits2.device != x2.device:
        raise ArgumentError("logits.device", logits2.device, f"{x2.device}: x's device")
    return x2, logits2, lead


def _check_inputs(x: Tensor, padded_offsets: Tensor, prob: Tensor, w1: Tensor, w2: Tensor,
                  row_ends: Tensor | None = None) -> None:
    """The shapes, dtype and devices of the layer's inputs against its weights (no host copy, no sync): a mistake
    is an ArgumentError naming the argument, not an error from inside a matmul or a kernel."""
    experts, two_f, hidden = w1.shape
    if w2.shape != (experts, hidden, two_f // 2):
        raise ArgumentError("w2.shape", tuple(w2.shape), f"({experts}, {hidden}, {two_f // 2}): (L, H, F) of w1's "
                            f"(L, 2F, H) = {tuple(w1.shape)}")
    if x.dim() != 2 or x.shape[1] != hidden:
        raise ArgumentError("x.shape", tuple(x.shape), f"(M, {hidden}): {hidden} is the layer's hidden size")
    _check_like_weights(x, w1)
    if isinstance(prob, Tensor) and prob.device != x.device:
        raise ArgumentError("prob.device", prob.device, f"{x.device}: x's device")
    if padded_offsets.shape != (experts,):
        raise ArgumentError("padded_offsets.shape", tuple(padded_offsets.shape),
                            f"({experts},): one end row per expert")
    if padded_offsets.dtype.is_floating_point or padded_offsets.dtype.is_complex or padded_offsets.dtype == torch.bool:
        raise ArgumentError("padded_offsets.dtype", padded_offsets.dtype, "an integer dtype (torch.int32)")
    if prob.shape != (x.shape[0],):
        raise ArgumentError("prob.shape", tuple(prob.shape), f"({x.shape[0]},): one weight per row of x")
    if row_ends is not None and (not isinstance(row_ends, Tensor) or row_ends.shape != (experts,)
                                 or row_ends.dtype != torch.int32):
        got = (tuple(row_ends.shape), row_ends.dtype) if isinstance(row_ends, Tensor) else type(row_ends).__name__
        raise ArgumentError("row_ends", got, f"an int32 tensor of shape ({experts},): one row end per expert")


ALIGN = 256   # rows each expert's range is padded to (the kernels' tile rows)


def _check_aligned(padded_offsets: Tensor) -> None:
    """Every offset a multiple of ALIGN (a host copy: the torch backend takes one anyway)."""
    for e, end in enumerate(padded_offsets.tolist()):
        if end % ALIGN:
            raise ArgumentError(f"padded_offsets[{e}]", end, f"a multiple of {ALIGN} (each expert's rows are "
                                f"padded to {ALIGN})")


class _Torch:
    """The layer's GEMMs with torch matmuls per expert (reference and CPU backend). Row ends
    (``ends``) change nothing here: the matmuls read every row, and the padding rows are zero."""

    @staticmethod
    def grouped(x: Tensor, rows: list, w: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """y[rows_e] = x[rows_e] @ w[e]^T (in ``dtype``, default x's); rows past the last expert are 0."""
        y = x.new_zeros((x.shape[0], w.shape[1]), dtype=dtype or x.dtype)
        for e, (s, t) in enumerate(rows):
            if t > s:
                y[s:t] = (_acc(x[s:t]) @ _acc(w[e]).T).to(y.dtype)
        return y

    def fc1(self, x: Tensor, off: Tensor, rows: list, w1: Tensor, prob: Tensor, ends: Tensor | None = None
            ) -> tuple[Tensor, Tensor]:
        """(g, h): the pre-activations (kept for the backward) and ``prob * silu(gate) * up``."""
        g = self.grouped(x, rows, w1)
        return g, _swiglu(g, prob).to(x.dtype)

    def gemm(self, x: Tensor, off: Tensor, rows: list, w: Tensor, ends: Tensor | None = None) -> Tensor:
        return self.grouped(x, rows, w)

    def dgrad(self, dg: Tensor, off: Tensor, rows: list, w1: Tensor, ends: Tensor | None = None) -> Tensor:
        return self.grouped(dg, rows, w1.transpose(1, 2))

    def dswiglu(self, dy: Tensor, off: Tensor, rows: list, w2: Tensor, g: Tensor, prob: Tensor,
                ends: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(dG interleaved, dprob) from dh = dy @ w2 (fc2's data gradient) and the saved g."""
        dh = self.grouped(dy, rows, w2.transpose(1, 2))
        dg, dprob = swiglu_backward(g, dh, prob)
        return dg.to(dy.dtype), dprob

    # MXFP8 recipe: the kernels' quantization points, emulated with torch.formats-exact rounding.
    def fc1_mx(self, x: Tensor, off: Tensor, rows: list, w1: Tensor, prob: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(g in x's dtype, h as MXFP8 (M, F) and its logical scales (M, F/32)): the SwiGLU is
        taken on the FP32 accumulator, as the kernel's epilogue does."""
        g32 = self.grouped(x, rows, w1, torch.promote_types(x.dtype, torch.float32))
        hq, sfh = quantize_mx(_swiglu(g32, prob))
        return g32.to(x.dtype), hq, sfh

    def gemm_mx(self, aq: Tensor, sfa: Tensor, off: Tensor, rows: list, wq: Tensor, sfw: Tensor,
                dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(D = dequant(A) @ dequant(W_e)^T in ``dtype``, amax (L, 1) of each expert's rows)."""
        d = self.grouped(dequantize_mx(aq, sfa), rows, dequantize_mx(wq, sfw), dtype)
        amax = torch.stack([_acc(d[s:t]).abs().amax() if t > s else d.new_tensor(float("-inf"), dtype=torch.float32)
                            for s, t in rows]).float()[:, None]
        return d, amax

    def dswiglu_mx(self, dyq: Tensor, sfdy: Tensor, off: Tensor, rows: list, w2tq: Tensor, sfw2t: Tensor,
                   g: Tensor, prob: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(dG row-quantized, its scales (M, 2F/32), dG column-quantized (M, 2F), its scales
        (2F, M/32), dprob (M,)) from dh = dequant(dy) @ dequant(w2^T) and the saved g."""
        dh = self.grouped(dequantize_mx(dyq, sfdy), rows, dequantize_mx(w2tq, sfw2t), torch.float32)
        dg, dprob = swiglu_backward(g, dh, prob)
        rq, rsf = quantize_mx(dg)
        cq, csf = quantize_mx(dg.t())
        return rq, rsf, cq.t(), csf, dprob

    # Blockwise FP8 recipe: the same quantization points, with the recipe's own quantizers
    # (fusegemm.formats.torch_blockwise: the kernels' rounding) and exact dequantization.
    def fc1_bw(self, xq: Tensor, sx: Tensor, off: Tensor, rows: list, w1q: Tensor, sw1: Tensor, prob: Tensor,
               dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """(g in ``dtype``, h as FP8 (M, F) with its 1x128 scales (M, F/128)): the SwiGLU on the FP32
        accumulator of the 1x128-quantized x (``xq``, ``sx``) and the 128x128-quantized w1
        (``w1q``, ``sw1``), quantized as the kernel's epilogue does."""
        g32 = self.gemm_bw(xq, sx, off, rows, w1q, sw1, torch.float32)
        hq, sh = bw.quantize_1x128(_swiglu(g32, prob).float())
        return g32.to(dtype), hq, sh

    def gemm_bw(self, aq: Tensor, sa: Tensor, off: Tensor, rows: list, wq: Tensor, sw: Tensor,
                dtype: torch.dtype) -> Tensor:
        """dequant(A) @ dequant(W_e)^T in ``dtype`` (A 1x128, W 128x128; FP32 products, exact)."""
        return self.grouped(bw.dequantize_1x128(aq, sa), rows, bw.dequantize_128x128(wq, sw), dtype)

    def dswiglu_bw(self, dyq: Tensor, sdy: Tensor, off: Tensor, rows: list, w2tq: Tensor, sw2t: Tensor,
                   g: Tensor, prob: Tensor) -> tuple[Tensor, Tensor]:
        """(dG interleaved in g's dtype, dprob (M,)) from dh = dequant(dy) @ dequant(w2^T)."""
        dh = self.gemm_bw(dyq, sdy, off, rows, w2tq, sw2t, torch.float32)
        dg, dprob = swiglu_backward(g, dh, prob)
        return dg.to(g.dtype), dprob

    def wgrad_bw(self, a: Tensor, sa: Tensor, b: Tensor, sb: Tensor, off: Tensor, rows: list, like: Tensor,
                 ends: Tensor | None = None) -> Tensor:
        """dW[e] = dequant(a)[:, rows_e] @ dequant(b)[:, rows_e]^T: the FP8 weight gradient's
        operands (dY^T and X^T quantized along the tokens, :func:`fusegemm.quantize.quantize_wgrad`);
        ``ends`` changes nothing (the padding's tokens are zero)."""
        return self.wgrad(bw.dequantize_1x128(a, sa).t(), bw.dequantize_1x128(b, sb).t(), off, rows, like)

    @staticmethod
    def wgrad(dy: Tensor, x: Tensor, off: Tensor, rows: list, like: Tensor, kernel: str = "auto",
              ends: Tensor | None = None) -> Tensor:
        """dW[e] = dy[rows_e]^T @ x[rows_e] (a reduction over each expert's rows)."""
        dw = torch.zeros_like(like)
        for e, (s, t) in enumerate(rows):
            if t > s:
                dw[e] = (_acc(dy[s:t]).T @ _acc(x[s:t])).to(like.dtype)
        return dw


class _Fusegemm:
    """The layer's GEMMs on fusegemm kernels (CUDA, bfloat16). Every output is a spec op's, so
    rows at or past padded_offsets[-1] come back zero (EpilogueGemm zero-fills its outputs)."""

    @staticmethod
    def _ones(w: Tensor) -> Tensor:
        return torch.ones(w.shape[0], device=w.device)

    # ``tail`` (the BF16 GEMMs): False leaves the output rows no tile writes unzeroed (past the
    # last offset, and the padding tiles the row ends skip): ExpertMLPFunction's ``tail``.
    def fc1(self, x: Tensor, off: Tensor, rows: list, w1: Tensor, prob: Tensor, ends: Tensor | None = None,
            tail: bool = True) -> tuple[Tensor, Tensor]:
        """One kernel: the SwiGLU epilogue stores h and, with generate_c, the pre-activations g."""
        from .torch_library import epilogue_gemm
        out = epilogue_gemm("grouped_gemm_swiglu", x, off, w1, inputs={"alpha": self._ones(w1), "prob": prob.float()},
                            row_ends=ends, tail=tail, d_dtype="bfloat16", generate_c=True, c_dtype="bfloat16")
        return out["c"], out["d"]

    def gemm(self, x: Tensor, off: Tensor, rows: list, w: Tensor, b_major: str = "k", ends: Tensor | None = None,
             tail: bool = True) -> Tensor:
        from .torch_library import epilogue_gemm
        return epilogue_gemm("grouped_gemm", x, off, w, inputs={"alpha": self._ones(w)}, row_ends=ends, tail=tail,
                             b_major=b_major)["d"]

    def dgrad(self, dg: Tensor, off: Tensor, rows: list, w1: Tensor, ends: Tensor | None = None,
              tail: bool = True) -> Tensor:
        """fc1's data gradient dG @ w1: w1 read as an N-major B where the arch's kernel can."""
        from .torch_library import weight_as_b
        return self.gemm(dg, off, rows, *weight_as_b(w1), ends=ends, tail=tail)

    def dswiglu(self, dy: Tensor, off: Tensor, rows: list, w2: Tensor, g: Tensor, prob: Tensor,
                ends: Tensor | None = None, tail: bool = True) -> tuple[Tensor, Tensor]:
        """One kernel: fc2's data gradient with the dSwiGLU epilogue (specs/grouped_gemm_dswiglu_bf16.yaml)
        writes dG interleaved and accumulates dprob."""
        from .torch_library import device_ordinal, epilogue_gemm, weight_as_b
        b, major = weight_as_b(w2)
        tile = _dswiglu_tile("bf16", device_ordinal(dy.device), g.shape[1] // 2)
        out = epilogue_gemm("grouped_gemm_dswiglu_bf16", dy, off, b,
                            inputs={"alpha": self._ones(w2), "prob": prob.float(), "c": g}, row_ends=ends,
                            tail=tail, b_major=major, **dict(tile))
        return out["d"], out["dprob"]

    # MXFP8 recipe
    def fc1_mx(self, x: Tensor, off: Tensor, rows: list, w1: Tensor, prob: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One kernel: SwiGLU with an MXFP8 D (row scales for fc2, whose K runs along D's rows)
        and the BF16 pre-activations g (generate_c) for the backward."""
        from .torch_library import epilogue_gemm
        out = epilogue_gemm("grouped_gemm_swiglu", x, off, w1, inputs={"alpha": self._ones(w1), "prob": prob.float(),
                                                                     "norm_const": _one(x)},
                            d_dtype="float8_e4m3fn", generate_c=True, c_dtype="bfloat16")
        f = out["d"].shape[1]
        return out["c"], out["d"].view(torch.float8_e4m3fn), unpack_sf(out["sfd_row"], x.shape[0], f // 32)[0]

    def gemm_mx(self, aq: Tensor, sfa: Tensor, off: Tensor, rows: list, wq: Tensor, sfw: Tensor,
                dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Seed 003 (grouped GEMM + quant) with MXFP8 operands and a BF16 D, and its amax."""
        from .torch_library import grouped_gemm_quant
        d, _, amax, _, _ = grouped_gemm_quant(aq[..., None], kernel_view(pack_sf(sfa)), off, self._ones(wq),
                                              wq.permute(1, 2, 0), kernel_view(pack_sf(sfw)), d_dtype=dtype,
                                              sf_vec_size=32, generate_amax=True)
        return d[..., 0], amax

    def dswiglu_mx(self, dyq: Tensor, sfdy: Tensor, off: Tensor, rows: list, w2tq: Tensor, sfw2t: Tensor,
                   g: Tensor, prob: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Seed 000 (grouped GEMM + dSwiGLU) with MXFP8 operands: dG row- and column-quantized
        (for fc1's data gradient and weight gradient) and dprob, in one kernel."""
        from .torch_library import grouped_gemm_dswiglu
        ones = self._ones(w2tq)
        m, n2 = g.shape
        d_row, d_col, dprob, _, sfd_row, sfd_col = grouped_gemm_dswiglu(
            dyq[..., None], w2tq.permute(1, 2, 0), g[..., None], kernel_view(pack_sf(sfdy)),
            kernel_view(pack_sf(sfw2t)), off, ones, ones, prob.float().view(-1, 1, 1), norm_const=_one(g),
            d_dtype=torch.float8_e4m3fn, sf_vec_size=32)
        return (d_row[..., 0], unpack_sf(sfd_row, m, n2 // 32)[0], d_col[..., 0], unpack_sf(sfd_col, n2, m // 32)[0],
                dprob.view(-1))

    # Blockwise FP8 recipe (sm_90a): each GEMM a spec's torch op (fusegemm.torch_library.register).
    def fc1_bw(self, xq: Tensor, sx: Tensor, off: Tensor, rows: list, w1q: Tensor, sw1: Tensor, prob: Tensor,
               dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """One kernel on the 1x128-quantized x (``xq``, ``sx``) and the 128x128-quantized w1
        (``w1q``, ``sw1``): the SwiGLU with an FP8 D quantized per row and 128 columns (fc2's A as
        it is) and the BF16 pre-activations g (generate_c; ``dtype`` bfloat16)."""
        out = _recipe_op("fc1")(xq, sx, off, w1q, sw1,
                                inputs={"alpha": self._ones(w1q), "prob": prob.float(), "norm_const": _one(sx)})
        return out["c"], out["d"].view(torch.float8_e4m3fn), out["sfd_row"]

    def gemm_bw(self, aq: Tensor, sa: Tensor, off: Tensor, rows: list, wq: Tensor, sw: Tensor,
                dtype: torch.dtype) -> Tensor:
        """Seed 003's kernel (grouped GEMM + quant) on blockwise operands with a BF16 D."""
        return _recipe_op("gemm")(aq, sa, off, wq, sw, inputs={"alpha": self._ones(wq)})["d"].to(dtype)

    def dswiglu_bw(self, dyq: Tensor, sdy: Tensor, off: Tensor, rows: list, w2tq: Tensor, sw2t: Tensor,
                   g: Tensor, prob: Tensor) -> tuple[Tensor, Tensor]:
        """One kernel: fc2's data gradient with the dSwiGLU epilogue (specs/grouped_gemm_dglu_mx.yaml)
        on blockwise operands: dG (BF16, interleaved) and dprob."""
        from .torch_library import device_ordinal
        ones = self._ones(w2tq)
        # (meta tensors when traced: no device, the spec's tile)
        tile = _dswiglu_tile("fp8_block", device_ordinal(dyq.device), g.shape[1] // 2) if dyq.is_cuda else ()
        out = _recipe_op("dswiglu", tile)(
            dyq, sdy, off, w2tq, sw2t, inputs={"alpha": ones, "beta": ones, "prob": prob.float(), "c": g})
        return out["d"], out["dprob"].view(-1)

    def wgrad_bw(self, a: Tensor, sa: Tensor, b: Tensor, sb: Tensor, off: Tensor, rows: list, like: Tensor,
                 ends: Tensor | None = None) -> Tensor:
        """The FP8 weight gradient (specs/grouped_gemm_wgrad_fp8.yaml) on operands quantized along
        the tokens, stored in the weights' dtype by the kernel (a float32 D and a cast after it
        cost 0.49 ms of the dsv3-8 step on the H200). ``ends`` (the routing's row ends): the
        kernel skips each expert's 128-token blocks past its tokens (zeros there: the same sums)."""
        step = "wgrad_bf16" if like.dtype == torch.bfloat16 else "wgrad"
        return _recipe_op(step)(a, sa, b, sb, off, row_ends=ends)["d"].to(like.dtype)

    @staticmethod
    def wgrad(dy: Tensor, x: Tensor, off: Tensor, rows: list, like: Tensor, kernel: str = "auto",
              ends: Tensor | None = None) -> Tensor:
        """dW_e = dy_e^T x_e (:func:`fusegemm.torch_library.grouped_wgrad`). Both kernels reduce over
        the rows of an expert's range (fusegemm's up to the k-block of its row end): the layer's
        padding rows of x and h are zero."""
        from .torch_library import grouped_wgrad
        return grouped_wgrad(dy, x, off, kernel, row_ends=ends).to(like.dtype)


def _one(t: Tensor) -> Tensor:
    return torch.ones(1, device=t.device)


# The blockwise FP8 recipe's GEMMs: (spec, variant) of each, registered as torch ops on first use.
_BW = {"sf_dtype": "float32", "sf_vec_size": 128}
_RECIPE_OPS = {
    "fc1": ("grouped_gemm_glu_mx", {**_BW, "d_dtype": "float8_e4m3fn", "sfd_vec_size": 128, "generate_c": True,
                                    "c_dtype": "bfloat16", "tile_n": 256}),
    "gemm": ("grouped_gemm_quant", {**_BW, "d_dtype": "bfloat16"}),
    "dswiglu": ("grouped_gemm_dglu_mx", {**_BW, "d_dtype": "bfloat16"}),
    "wgrad": ("grouped_gemm_wgrad_fp8", {"d_dtype": "float32"}),
    "wgrad_bf16": ("grouped_gemm_wgrad_fp8", {"d_dtype": "bfloat16"}),
}


def _recipe_op(step: str, over: tuple = ()):
    """The torch op of the blockwise recipe's ``step`` (fusegemm.torch_library.register; the same
    registration on every later call), with ``over`` ((axis, value) pairs) over its axes: an op of
    its own name."""
    from .torch_library import register
    spec, axes = _RECIPE_OPS[step]
    name = "_".join([f"moe_fp8_block_{step}", *(f"{a}{v}" for a, v in over)])
    return register(spec, name=name, **{**axes, **dict(over)})


# The dSwiGLU GEMM's tile per recipe and arch, a function of the intermediate size f (an arch
# not listed: the spec's default, cooperative 128 x 256 on sm_90a).
# bf16: ping-pong 64-row tiles (two consumer warpgroups in turn, so the heavy epilogue of one
# overlaps the other's mainloop), 128 columns for a narrow intermediate. H200, same run
# (bench/results/pingpong_h200.json, balanced), ms against the default cooperative 128 x 256:
# dsv3 (F 2048) 1.013 / 1.101 and mixtral (F 14336) 3.89 / 4.36 at 64 x 256; qwen3-like (F 768)
# 0.356 / 0.384 at 64 x 128 (0.367 at 64 x 256).
# fp8_block: the blockwise kernel's ping-pong tiles (64 x 128) for a narrow intermediate. H200,
# 2026-12-05, same run (bench/results/moe_mlp_h200_pingpong.json, bench/moe_mlp.py
# --fp8-dswiglu-ab, two rounds), the whole fp8_block step against the default cooperative tile:
# dsv3-8 6.14 / 6.46 ms, dsv3-32 8.24 / 8.54 ms (F 2048); mixtral 22.74 / 22.60 ms (F 14336: kept).
_DSWIGLU_TILE: dict[str, dict[str, Callable[[int], dict]]] = {
    "bf16": {"sm_90a": lambda f: {"tile_m": 64, "tile_n": 128 if f <= 1024 else 256}},
    "fp8_block": {"sm_90a": lambda f: {"tile_m": 64, "tile_n": 128} if f <= 2048 else {}},
}


@torch.compiler.assume_constant_result
def _dswiglu_tile(recipe: str, index: int, f: int) -> tuple:
    """The dSwiGLU GEMM's tile choices under ``recipe``, as (axis, value) pairs, for device
    ``index``'s arch and intermediate size ``f`` (none: the spec's default); a constant for
    torch.compile."""
    from .ops.device import device_arch
    pick = _DSWIGLU_TILE[recipe].get(device_arch(index))
    return tuple(sorted(pick(f).items())) if pick is not None else ()


# Whether MoEBlock lets its BF16 GEMMs leave the padding rows that no tile writes unzeroed
# (ExpertMLPFunction's ``tail=False``, where _padding_unread allows it): the tail-zeroing launches
# cost 0.11 ms of the graphed dsv3-32 step on the H200 (bench/results/moe_layer_h200_graph_gaps.json,
# four fusegemm_zero_tail launches). Bit for bit the zeroed layer on a NaN-filled allocator
# (tests/gpu/test_moe_layer_gpu.py, H100, 2026-12-06). Off: the graphed step with it was not
# measurably faster (dsv3-32: 15.29 / 15.46 / 15.41 ms against 15.67 / 15.13 / 15.36 in three runs,
# mixtral 14.58 against 14.78, dsv3-8 14.26 against 14.00; bench/results/moe_layer_h100_flags_*.json:
# run-to-run noise of 2-3% hides its 0.7%; a fourth run, 5 interleaved rounds of all four layers,
# bench/results/moe_layer_h100_unzeroed_5rounds.json: 1% faster at dsv3-32 and mixtral, 6% at qwen3,
# 2% slower at dsv3-8, as in the first runs), and its rule rests on tile invariants (_padding_unread).
UNZEROED_PADDING = False


def _padding_unread(backend: str, wgrad: str, row_ends: Tensor | None, x: Tensor, w1: Tensor) -> bool:
    """Whether the BF16 layer's kernels read none of the padding rows its GEMMs leave unwritten
    when they skip the tail zeroing, so that those may hold anything.

    The rows in question: past the last offset (read by no kernel: every one walks the offsets),
    and each expert's 64-row blocks after the one holding its last token, whose tiles the sm_90a
    kernels skip with the row ends. Every GEMM of the layer is row-wise (an output row reads its
    own input row), and every sm_90a M tile is a multiple of 64 rows from the expert's first row,
    so the rows of the blocks that hold a token are written (zero in the padding: x's padding is)
    and the rest may be arbitrary in every output after them too. What reads padding rows beyond
    that: the weight gradients. fusegemm's K-grouped kernel reduces over 64-row k-blocks up to the
    last token's (scheduler.cuh kgrouped_k_range, kTileK 64), written rows only; torch's
    ``_grouped_mm`` reads each expert's whole range. So: the fusegemm backend's BF16 recipe on
    sm_90a, with row ends, and both weight gradients on the K-grouped kernel (``wgrad`` fusegemm,
    or auto where it fits). The combine and the gather's backward read the routed rows only."""
    if (backend != "fusegemm" or row_ends is None or x.device.type != "cuda" or wgrad == "torch"
            or torch.compiler.is_compiling()):    # (traced: the zeroing kept, no device queries)
        return False
    from .ops.device import device_arch
    from .torch_library import _kgrouped_fits, device_ordinal
    dev = device_ordinal(x.device)
    if device_arch(dev) != "sm_90a":
        return False
    m, hidden, f2 = x.shape[0], x.shape[1], w1.shape[1]
    return wgrad == "fusegemm" or (_kgrouped_fits(f2, hidden, m, dev) and _kgrouped_fits(hidden, f2 // 2, m, dev))


def _zero_tail(y: Tensor, off: Tensor) -> Tensor:
    """Rows at or past padded_offsets[-1] as zeros, without a sync; ``y`` (M, ...) of any rank."""
    valid = torch.arange(y.shape[0], device=y.device) < off[-1]
    return torch.where(valid.view(-1, *[1] * (y.dim() - 1)), y, torch.zeros((), dtype=y.dtype, device=y.device))


_BACKENDS = {"torch": _Torch(), "fusegemm": _Fusegemm()}


RECIPES = ("bf16", "mxfp8", "fp8_block")


def _quantized_weights(w1: Tensor, w2: Tensor) -> tuple:
    """The fp8_block recipe's weights: ``((w1q, sw1), (w1q^T, sw1^T), (w2q, sw2), (w2q^T, sw2^T))``,
    each weight's 128x128 quantization and its transposed copy (the data gradients' B) from one read."""
    return (*qz.quantize_128x128(w1, transposed=True), *qz.quantize_128x128(w2, transposed=True))


def _dequant_col(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` (M, N) as a K-grouped MXFP8 weight gradient reads it: quantized along M (32-row
    blocks; experts start at multiples of 256, so no block spans two), dequantized to ``dtype``."""
    q, sf = quantize_mx(t.t())
    return dequantize_mx(q, sf).t().to(dtype)


class ExpertMLPFunction(torch.autograd.Function):
    """``y = fc2(prob * silu(gate) * up)`` with ``(gate, up) = fc1(x)``, per expert (see the module
    docstring); differentiable in ``x``, ``prob``, ``w1`` and ``w2``."""

    @staticmethod
    def forward(ctx, x: Tensor, padded_offsets: Tensor, prob: Tensor, w1: Tensor, w2: Tensor,
                backend: str = "fusegemm", recipe: str = "bf16", stats: dict | None = None,
                wgrad: str = "auto", row_ends: Tensor | None = None, weights_q: tuple | None = None,
                tail: bool = True) -> Tensor:
        """The layer's forward (``ExpertMLPFunction.apply(x, padded_offsets, prob, w1, w2, backend, recipe,
        stats, wgrad, row_ends, weights_q, tail)``).

        Parameters
        ----------
        x : (M, H) tensor
            Tokens grouped by expert (bfloat16 for the fusegemm backend), M a multiple of 256.
        padded_offsets : (L,) int32 tensor
            Each expert's end row: nondecreasing multiples of 256.
        prob : (M,) float32 tensor
            Routing weight of each row.
        w1 : (L, 2F, H) tensor
            Gate/up weights in the 32-row interleave.
        w2 : (L, H, F) tensor
            Down weights.
        backend : {"fusegemm", "torch"}
            The GEMMs' implementation (torch: the reference structure, any device and float dtype).
        recipe : {"bf16", "mxfp8", "fp8_block"}
            Operand precision (see :class:`ExpertMLP`).
        stats : dict, optional
            The MXFP8 recipe writes per-expert amax tensors (L, 1) into it: ``"y"`` in the
            forward, ``"dx"`` in the backward.
        wgrad : {"auto", "torch", "fusegemm"}
            The fusegemm backend's weight-gradient kernel: fusegemm's K-grouped family
            (:class:`fusegemm.KGroupedGemm`, sm_90a; the hidden size and 2F whole multiples of
            128), ``torch._grouped_mm``, or (``auto``, the default) the first where it fits, else
            the second.
        row_ends : (L,) int32 tensor, optional
            Where each expert's tokens end inside its padded range (the routing's,
            :attr:`fusegemm.routing.Routing.row_ends`; the rows after it zero in ``x``): the BF16
            recipe's kernels skip the padding's row tiles and k-blocks, the fp8_block recipe's
            weight gradients its 128-token blocks (the same values).
        weights_q : tuple, optional
            fp8_block: w1's and w2's quantizations made beforehand, ``((w1q, sw1), (w1q^T,
            sw1^T), (w2q, sw2), (w2q^T, sw2^T))`` as :func:`fusegemm.quantize.quantize_128x128`
            with ``transposed=True`` gives them (:class:`ExpertMLP`'s ``weight_cache``); None:
            quantized here.
        tail : bool
            False: the BF16 GEMMs may leave their output rows in the padding that no tile writes
            unzeroed, where no kernel after them reads those rows (:func:`_padding_unread`): the
            rows past the last offset and the padding tiles the row ends skip. The output ``y``
            and the x gradient then hold arbitrary values there (:class:`MoEBlock` reads only
            its routed rows). True (default): those rows are zero.
        """
        be = _BACKENDS[backend]
        from .torch_library import WGRAD_KERNELS
        if wgrad not in WGRAD_KERNELS:
            raise ValueError(f"wgrad: got {wgrad!r}; allowed: {', '.join(WGRAD_KERNELS)}")
        # (meta tensors: shape inference, through the ops' fake implementations)
        if backend == "fusegemm" and x.device.type not in ("cuda", "meta"):
            raise ValueError(f"x: got a tensor on {x.device}; allowed: a CUDA tensor for backend 'fusegemm' "
                             f"(backend='torch' runs the same layer with torch matmuls on any device)")
        _check_inputs(x, padded_offsets, prob, w1, w2, row_ends)
        rows = _expert_rows(padded_offsets, x.shape[0]) if backend == "torch" else None
        ctx.backend, ctx.recipe, ctx.stats = backend, recipe, stats
        ctx.wgrad = wgrad
        if recipe == "bf16":
            ctx.tail = {} if tail or not _padding_unread(backend, wgrad, row_ends, x, w1) else {"tail": False}
            g, h = be.fc1(x, padded_offsets, rows, w1, prob, ends=row_ends, **ctx.tail)
            y = be.gemm(h, padded_offsets, rows, w2, ends=row_ends, **ctx.tail)
            ctx.save_for_backward(x, padded_offsets, prob, w1, w2, g, h, row_ends)
            return y
        if recipe == "fp8_block":
            # One quantization of each weight per step: the FP8 copy and its transpose (the data
            # gradients' B, the same blocks) from one read. x's weight-gradient operand (along the
            # tokens) is made with its 1x128 copy and kept instead of x.
            if weights_q is None:
                weights_q = _quantized_weights(w1, w2)
            w1q, w1t, w2q, w2t = weights_q
            (xq, sx), xt = qz.quantize_both(x)
            g, hq, sh = be.fc1_bw(xq, sx, padded_offsets, rows, *w1q, prob, x.dtype)
            y = be.gemm_bw(hq, sh, padded_offsets, rows, *w2q, x.dtype)
            ctx.save_for_backward(x, padded_offsets, prob, w1, w2, g, hq, sh, *w1t, *w2t, *xt, row_ends)
            return y
        g, hq, sfh = be.fc1_mx(x, padded_offsets, rows, w1, prob)
        y, amax = be.gemm_mx(hq, sfh, padded_offsets, rows, *quantize_mx(w2), x.dtype)
        if stats is not None:
            stats["y"] = amax
        ctx.save_for_backward(x, padded_offsets, prob, w1, w2, g, hq, sfh)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        # rest: bf16 (h, row_ends); mxfp8 (hq, sfh); fp8_block (hq, sh, w1q^T, sw1^T, w2q^T, sw2^T, xt, sxt,
        # row_ends)
        x, off, prob, w1, w2, g, *rest = ctx.saved_tensors
        be = _BACKENDS[ctx.backend]
        rows = _expert_rows(off, x.shape[0]) if ctx.backend == "torch" else None
        dy = dy.to(x.dtype)     # rows past the last expert are read by no kernel
        if ctx.recipe == "bf16":
            h, ends = rest
            # (with row ends, dy's padding rows are read as zeros: the combine's gradient has none)
            dg, dprob = be.dswiglu(dy, off, rows, w2, g, prob, ends=ends, **ctx.tail)
            dx = be.dgrad(dg, off, rows, w1, ends=ends, **ctx.tail)
            dw1 = be.wgrad(dg, x, off, rows, w1, ctx.wgrad, ends=ends)
            dw2 = be.wgrad(dy, h, off, rows, w2, ctx.wgrad, ends=ends)
        elif ctx.recipe == "fp8_block":
            # Data gradients on the recipe's kernels (dy and dG 1x128, the weights' transposed
            # 128x128 copies); weight gradients on the FP8 K-grouped kernel with both operands
            # quantized along the tokens (dy and dG in the same pass as their 1x128 copies, h
            # requantized from its FP8 forward copy through bfloat16).
            hq, sh, w1t, sw1t, w2t, sw2t, xt, sxt, ends = rest
            (dyq, sdy), (dyt, sdyt) = qz.quantize_both(dy)
            dg, dprob = be.dswiglu_bw(dyq, sdy, off, rows, w2t, sw2t, g, prob)
            (dgq, sdg), (dgt, sdgt) = qz.quantize_both(dg)
            dx = be.gemm_bw(dgq, sdg, off, rows, w1t, sw1t, x.dtype)
            # (the row ends reach the weight gradients only: the blockwise M-grouped kernel
            # walks every row tile)
            dw1 = be.wgrad_bw(dgt, sdgt, xt, sxt, off, rows, w1, ends=ends)
            dw2 = be.wgrad_bw(dyt, sdyt, *qz.requantize_wgrad(hq, sh, via=x.dtype), off, rows, w2, ends=ends)
        else:
            # Data gradients on MXFP8 kernels (operands quantized along their K); the weight
            # gradients with every operand quantized along M, as a K-grouped MXFP8 GEMM reads them.
            dg_q, dg_sf, dgc_q, dgc_sf, dprob = be.dswiglu_mx(*quantize_mx(dy), off, rows,
                                                             *quantize_mx(w2.transpose(1, 2)), g, prob)
            dx, amax = be.gemm_mx(dg_q, dg_sf, off, rows, *quantize_mx(w1.transpose(1, 2)), x.dtype)
            if ctx.stats is not None:
                ctx.stats["dx"] = amax
            dg = dequantize_mx(dgc_q.t(), dgc_sf).t().to(x.dtype)
            h = dequantize_mx(*rest).to(x.dtype)
            dw1 = be.wgrad(dg, _dequant_col(x, x.dtype), off, rows, w1, ctx.wgrad)
            dw2 = be.wgrad(_dequant_col(dy, x.dtype), _dequant_col(h, x.dtype), off, rows, w2, ctx.wgrad)
        return dx, None, _zero_tail(dprob.to(prob.dtype), off), dw1, dw2, None, None, None, None, None, None, None


class ExpertMLP(torch.nn.Module):
    """The expert MLP of an MoE layer: ``L`` experts, hidden size ``H``, intermediate size ``F``
    (a multiple of 32). ``w1`` (L, 2F, H) gate/up interleaved, ``w2`` (L, H, F), kept in ``dtype``
    (the master weights). ``forward(x, padded_offsets, prob, row_ends=None)`` as
    :class:`ExpertMLPFunction`.

    Recipes: ``"bf16"`` runs every GEMM on BF16 operands. ``"mxfp8"`` quantizes to MXFP8 (E4M3
    elements, one E8M0 scale per 32 along K): fc1's SwiGLU epilogue writes ``h`` as MXFP8 for
    fc2 (block-scaled, seed 003's kernel); the backward quantizes ``dy`` and the weights each step
    (:mod:`fusegemm.formats.torch_mx`), runs fc2's data gradient with seed 000's dSwiGLU kernel
    (``dG`` row- and column-quantized) and fc1's on the row-quantized ``dG``. fc1's forward
    mainloop stays BF16 (the SwiGLU spec's family). The weight gradients run on
    ``torch._grouped_mm`` with every operand quantized along M and dequantized, the values a
    K-grouped MXFP8 kernel would read (no such fusegemm family yet). After each step
    ``self.amax`` holds the per-expert amax (L, 1) of ``y`` and of ``dx``.

    ``"fp8_block"`` is the blockwise FP8 recipe (DeepSeek-V3's; sm_90a kernels): activations and
    gradients quantized per row and 128 along K with FP32 scales, weights per 128 x 128 block
    (:mod:`fusegemm.quantize`'s kernels, each step). fc1 runs the blockwise SwiGLU kernel
    (``grouped_gemm_glu_mx``), whose epilogue writes ``h`` in FP8 with 1x128 scales, fc2's A as it
    is, and the BF16 pre-activations; fc2 and fc1's data gradient the blockwise GEMM (seed 003's
    kernel, BF16 D) with the weights' 128 x 128 quantization transposed (the same blocks: exact);
    fc2's data gradient the blockwise dSwiGLU (``grouped_gemm_dglu_mx``, BF16 dG and dprob); both
    weight gradients the FP8 K-grouped kernel (``grouped_gemm_wgrad_fp8``) on operands quantized
    along the tokens (``quantize_wgrad``; ``h`` requantized from its FP8 copy). Needs H a
    multiple of 128 and F of 64. On the H200: within 2% of its torch emulation, 1.17x / 0.93x /
    1.59x torch's BF16 step on dsv3-8 / dsv3-32 / mixtral (bench/moe_mlp.py; 1.37x / 1.36x /
    1.74x with ``weight_cache``), a 200-step training run tracking BF16 within 6.8%
    (examples/moe_training.py).

    ``weight_cache=True`` (fp8_block, fusegemm backend) keeps each step's quantized weights (and
    their transposed copies) and reuses them while ``w1`` and ``w2`` are unchanged, as their
    autograd version counters and addresses tell: micro-batches of gradient accumulation and
    evaluation pay the weights' quantization once per optimizer step (0.75 ms of the dsv3-8
    step). Off by default: a write through ``w.data`` (``p.data.copy_(...)``) does not advance
    the version counter, and would leave the cache stale; torch.optim's updates do advance it.
    Under torch.compile and inside a CUDA-graph capture the cache is not used (a replay runs no
    Python to look at the versions): the weights are quantized in the step, as without it.

    Parameters
    ----------
    experts : int
        L, the local experts.
    hidden : int
        H, the model dimension.
    intermediate : int
        F, each expert's intermediate size (a multiple of 32).
    dtype : torch.dtype
        Weight dtype (bfloat16 for the fusegemm backend).
    backend : {"fusegemm", "torch"}
        The GEMMs' implementation.
    recipe : {"bf16", "mxfp8", "fp8_block"}
        Operand precision of the GEMMs (``mxfp8`` needs H a multiple of 32; ``fp8_block`` H a
        multiple of 128 and F of 64).
    wgrad : {"auto", "torch", "fusegemm"}
        The weight gradients' kernel with the fusegemm backend (see :class:`ExpertMLPFunction`).
    weight_cache : bool
        Reuse the fp8_block recipe's quantized weights while the weights are unchanged (above).
    device : torch.device or str, optional
    generator : torch.Generator, optional
        Seeds the weights' initialisation (normal, scaled by fan-in ** -0.5).
    """

    def __init__(self, experts: int, hidden: int, intermediate: int, *, dtype: torch.dtype = torch.bfloat16,
                 backend: str = "fusegemm", recipe: str = "bf16", wgrad: str = "auto", weight_cache: bool = False,
                 device=None, generator: torch.Generator | None = None) -> None:
        super().__init__()
        for name, value in (("experts", experts), ("hidden", hidden), ("intermediate", intermediate)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ArgumentError(name, repr(value), "a positive integer")
        if backend not in _BACKENDS:
            raise ArgumentError("backend", repr(backend), ", ".join(_BACKENDS))
        if recipe not in RECIPES:
            raise ArgumentError("recipe", repr(recipe), ", ".join(RECIPES))
        from .torch_library import WGRAD_KERNELS
        if wgrad not in WGRAD_KERNELS:
            raise ArgumentError("wgrad", repr(wgrad), ", ".join(WGRAD_KERNELS))
        if intermediate % BLOCK:
            raise ArgumentError("intermediate", intermediate, f"a multiple of {BLOCK}")
        if recipe == "fp8_block" and (hidden % 128 or intermediate % 64):
            raise ArgumentError("hidden / intermediate", f"{hidden} / {intermediate}", "a multiple of 128 / of 64 "
                                "with recipe 'fp8_block' (the weight gradients' 128-row tiles: H and 2F rows)")
        if recipe == "mxfp8" and hidden % BLOCK:
            raise ArgumentError("hidden", hidden, f"a multiple of {BLOCK} with recipe 'mxfp8'")
        if not isinstance(weight_cache, bool):
            raise ArgumentError("weight_cache", repr(weight_cache), "True or False")
        self.backend, self.recipe, self.wgrad, self.amax = backend, recipe, wgrad, {}
        self.weight_cache = weight_cache
        self._cached: tuple | None = None     # (key, quantized weights) of weight_cache
        w = lambda *s, fan: torch.randn(*s, generator=generator) * fan ** -0.5  # noqa: E731
        self.w1 = torch.nn.Parameter(w(experts, 2 * intermediate, hidden, fan=hidden).to(dtype=dtype, device=device))
        self.w2 = torch.nn.Parameter(w(experts, hidden, intermediate, fan=intermediate).to(dtype=dtype, device=device))

    def forward(self, x: Tensor, padded_offsets: Tensor, prob: Tensor, row_ends: Tensor | None = None) -> Tensor:
        """The layer on tokens grouped by expert; rows at or past ``padded_offsets[-1]`` give 0.

        Parameters
        ----------
        x : (M, H) tensor
            Tokens grouped by expert, M a multiple of 256; rows between an expert's last token and
            its boundary hold zeros.
        padded_offsets : (L,) int32 tensor
            Each expert's end row: nondecreasing multiples of 256.
        prob : (M,) float32 tensor
            Routing weight of each row.
        row_ends : (L,) int32 tensor, optional
            Where each expert's tokens end inside its padded range (the routing's row ends; the
            rows after it hold zeros): the BF16 recipe's kernels skip the padding, the fp8_block
            recipe's weight gradients its 128-token blocks (same values).

        Raises
        ------
        ArgumentError
            A shape that does not match the layer (``x``'s hidden size, one offset per expert, one
            ``prob`` per row, one int32 row end per expert); with the torch backend (which copies
            the offsets to the host anyway) also offsets that are not nondecreasing multiples of
            256 within ``x``'s rows.
            The fusegemm backend's kernels check the values with FUSEGEMM_VALIDATE_OFFSETS.
        """
        return self._apply(x, padded_offsets, prob, row_ends)

    def _apply(self, x: Tensor, padded_offsets: Tensor, prob: Tensor, row_ends: Tensor | None,
               tail: bool = True) -> Tensor:
        """:meth:`forward`; ``tail`` as :class:`ExpertMLPFunction`'s (MoEBlock's rows)."""
        _check_inputs(x, padded_offsets, prob, self.w1, self.w2, row_ends)
        if self.backend == "torch":
            _check_aligned(padded_offsets)
        return ExpertMLPFunction.apply(x, padded_offsets, prob, self.w1, self.w2, self.backend, self.recipe,
                                       self.amax, self.wgrad, row_ends, self._weights_q(), tail)

    def _weights_q(self) -> tuple | None:
        """weight_cache: the fp8_block quantizations of w1 and w2 (each with its transposed copy),
        made again when either weight's address, version or layout changed; None otherwise (the
        function quantizes them itself)."""
        if not (self.weight_cache and self.recipe == "fp8_block" and self.backend == "fusegemm"
                and self.w1.is_cuda) or torch.compiler.is_compiling():
            return None
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            # A graph's replays run no Python: the quantization kernels go into the graph, so
            # each replay quantizes the weights as they are then.
            return None
        key = tuple((w.data_ptr(), w._version, tuple(w.shape), w.stride(), w.dtype) for w in (self.w1, self.w2))
        if self._cached is None or self._cached[0] != key:
            with torch.no_grad():
                self._cached = (key, _quantized_weights(self.w1, self.w2))
        return self._cached[1]


# ---------------------------------------------------------------- the whole layer: routing in, tokens out
_GATHER_OPS: dict = {}


def _gather_op(spec: str, device: int, **axes) -> "Op":  # noqa: F821
    """One fusegemm.Op per (spec, device, axes), built on first use: the gathered GEMMs' engines."""
    key = (spec, device, tuple(sorted(axes.items())))
    op = _GATHER_OPS.get(key)
    if op is None:
        from .ops.engine import Op
        op = _GATHER_OPS[key] = Op(spec, device=device, **axes)
    return op


# Whether RoutedMLPFunction reads x's and dy's token rows through the index inside the GEMMs
# (gathered operands) or permutes them first with the one-pass gather kernel. H200, 2026-12-04
# (bench/results/gathered_h200_early.json): the gathered fc1 ran at 0.96-1.00x of the kernel on
# pre-permuted rows (1.00-1.10x of gather + GEMM) and the gathered K-grouped weight gradient at
# 0.84-0.93x, and the layer's step with every GEMM gathered (bench/moe_layer.py --also, same run)
# was 5-6% slower than the permuted path (bench/results/moe_layer_h200_gathered_loads.json), in
# rounds of a fixed order that favoured the permuted block by about 4%. This flag is the function's
# default when a call passes no ``loads``; MoEBlock passes its own (``loads="auto"`` by default:
# gathered below PERMUTED_MIN_INTERMEDIATE, where it is level with the permuted step on an H100 at
# the dsv3 layers, 1.06x at qwen3's, with a lower peak). (Both bit-equal: tests/gpu/test_moe_layer_gpu.py.)
GATHERED_LOADS = False
# With GATHERED_LOADS: fc1's weight gradient as the swapped product dW1_e = (X_e^T dG_e)^T, X's
# token rows gathered as A (half the gathered bytes of b_gather's stage) and D stored M-major
# (specs/grouped_gemm_wgrad.yaml cd_major m), where the K-grouped kernel fits. The products are
# b_gather's, summed with the WGMMA roles swapped: equal within the FP32 accumulation's bound, not
# bit for bit (tests/gpu/test_moe_layer_gpu.py, H100, 2026-12-06). Off: with its M-major store it
# ran at 0.88x (dsv3-8) and 0.79x (mixtral) of the weight gradient on pre-permuted rows, where
# b_gather ran 1.00x and 0.84x in the same run (bench/results/gathered_h100_swapped.json; the
# M-major store itself 1.01x and 0.90x of the N-major one). With the M-major store staged by the
# whole tile (FUSEGEMM_SM90_DT_TILE_STORE; the store itself 0.99x / 1.01x / 0.91x of the N-major
# one at mixtral / dsv3-8 / qwen3): 0.87x / 0.90x / 0.89x, b_gather 0.88x / 0.94x / 0.86x in the
# same rounds (H100, 2026-12-06, bench/results/gathered_h100_dt_tile_store.json). Still off.
SWAPPED_WGRAD = False
# Stored gathers (a_gather_store): fc1 reads x's token rows through the index and stores the rows it
# gathered (the op's a_rows, in problem order), and the backward's dSwiGLU GEMM does the same for dy;
# the weight gradients read the stored rows, so no permutation kernel runs and no GEMM reads gathered
# K-grouped operands (the slow gathered mode). Takes precedence over GATHERED_LOADS. "forward": fc1's
# only (the backward permutes dy with the gather kernel). Bit-equal to the permuted path
# (tests/gpu/test_moe_layer_gpu.py); off: on an H100 (2026-12-06, bench/moe_layer.py --graph, same
# rounds, bench/results/moe_layer_h100_stored_profile.json) the step ran 0.93x (dsv3, 32 experts) and
# 0.92x (mixtral) of the block's, fc1 only 0.98x / 0.99x: at 32 experts the stored fc1 took 3.06-3.35
# ms against 2.89 on permuted rows (the rows' store is what costs) and the gathered ping-pong dSwiGLU
# 2.75 against 1.77, more than the 0.67 ms of gathers saved (README, "The gathered rows stored as well").
# With the gathered dSwiGLU on the cooperative tile (below), still off: two processes of 15 rounds (H100,
# 2026-12-06, bench/results/moe_layer_h100_gathered_coop_{1,2}.json), against the block in the same
# rounds, stored 0.98x / 0.98x at dsv3-32 and 0.97x / 0.97x at mixtral, GATHERED_LOADS 0.98x / 0.98x and
# 0.95x / 0.96x; this function on permuted rows itself 0.97x / 0.96x and 0.96x / 0.95x. (Those rounds ran
# the methods in a fixed order, which put any variant about 4% behind the block: the block timed twice
# gave 0.96x. With rotating rounds, 12 of them, bench/results/moe_layer_h100_rotated_variants.json: stored
# 0.99x / 0.98x / 0.99x / 1.03x at dsv3-8 / dsv3-32 / mixtral / qwen3, the null control 1.01x / 0.98x /
# 0.97x / 1.01x: level, a little ahead at qwen3.)
STORED_GATHERS: bool | str = False
# The dSwiGLU GEMM with dy gathered (GATHERED_LOADS, STORED_GATHERS) runs the spec's cooperative
# 128 x 256 tile, not the block's 64-row ping-pong one. H100, 2026-12-06 (bench/gathered.py --dswiglu,
# same run, three rounds, bench/results/gathered_h100_dswiglu.json): gathered, the ping-pong tile ran
# 2.66 / 2.35 ms at mixtral / dsv3-8 (0.74x / 0.68x of itself on permuted rows), the cooperative one
# 2.38 / 1.83 ms (0.93x / 1.00x). Nsight Compute on the ping-pong pair (mixtral): the consumers wait
# on a stage's full barrier in 64% of their mainloop samples (40% on permuted rows) while the copying
# warps find the next stage still in use before 70% of their k-blocks: every stage is in flight and
# the copies land later than the consumers come back for them. Publishing the copies sooner did not
# cure it (the same run, bench/results/gathered_h100_dswiglu_lag.json, mixtral / dsv3-8 / qwen3, of the
# ping-pong tile on permuted rows): one stage late (the default) 0.71x / 0.70x / 0.89x; cp.async's own
# mbarrier arrivals (FUSEGEMM_SM90_GATHER_LAG=0) 0.74x / 0.74x / 1.01x; two or three stages late
# without the early publication 0.73x / 0.73x / 0.97x and 0.67x / 0.65x / 0.90x.
def _routed_dswiglu_tile(gathered: bool, device: int, f: int) -> dict:
    """The dSwiGLU GEMM's tile axes in :class:`RoutedMLPFunction` (intermediate size ``f`` on
    device ``device``): none (the spec's cooperative tile) with dy gathered, else the block's."""
    return {} if gathered else dict(_dswiglu_tile("bf16", device, f))


class RoutedMLPFunction(torch.autograd.Function):
    """The expert MLP of a routed batch on token-major tensors. With ``GATHERED_LOADS`` the
    permutation happens inside the GEMMs' loads: fc1 reads x's token rows through the routing's
    index (``a_gather``) and fc1's weight gradient reads them again (``b_gather``); the
    backward's dSwiGLU GEMM and fc2's weight gradient read the output gradient's token rows the
    same way, and neither x nor the output gradient is permuted into (R, H) rows (without it,
    both are, by the one-pass gather kernel; in token order with ``routing.TOKEN_ORDER``). With
    ``SWAPPED_WGRAD`` as well, fc1's weight gradient reads x as A instead (the module's note on
    it). With ``STORED_GATHERS`` fc1 and the dSwiGLU GEMM gather their token rows and store them
    (``a_gather_store``), and both weight gradients read the stored rows. Every GEMM takes the
    routing's ``row_ends`` and skips the tiles (and K-grouped k-blocks)
    of the 256-row padding. Output: (T, H), each token's
    sum over its k expert rows (fusegemm/permute.py's combine), equal to :class:`ExpertMLPFunction`
    on the gathered rows followed by :func:`fusegemm.routing.combine` (the same kernels on the
    same values); the x gradient likewise sums fc1's data-gradient rows. Eager CUDA (sm_90a)
    only: the ops are called directly, without custom-op faces.

    :class:`MoEBlock` runs the same row ends on its permuted rows, and this function with the
    gathered loads when built with ``loads="gathered"``. On permuted rows this function is the
    block's step (1.000x / 1.002x at qwen3 / dsv3-32 on an H100 with rotating rounds, 2026-12-06;
    the H200 figures of 2026-12-03, 15.71 against 15.53 ms at dsv3-32, came from fixed-order
    rounds, which favoured the block). The row ends skip the padding's tiles through a
    compacted tile walk (fusegemm/scheduler.cuh); skipping them inside the full walk had made the
    step slower (16.39 against 15.44 ms), most likely because the CTAs that skipped ran ahead
    into later raster bands.
    """

    @staticmethod
    def forward(ctx, x: Tensor, token_of_row: Tensor, row_of: Tensor, padded_offsets: Tensor, row_ends: Tensor,
                prob: Tensor, w1: Tensor, w2: Tensor, wgrad: str = "auto", loads: str | None = None) -> Tensor:
        """The layer's (T, H) output (``RoutedMLPFunction.apply(x, token_of_row, row_of,
        padded_offsets, row_ends, prob, w1, w2, wgrad, loads)``).

        Parameters
        ----------
        x : (T, H) bfloat16 CUDA tensor
            The tokens, token-major.
        token_of_row, row_of, padded_offsets, row_ends : tensors
            The routing's (:class:`fusegemm.routing.Routing`).
        prob : (R,) float32 tensor
            Each row's routing weight (:func:`fusegemm.routing.row_probs`).
        w1, w2 : tensors
            As :class:`ExpertMLPFunction`'s.
        wgrad : {"auto", "torch", "fusegemm"}
            The weight gradients' kernel (as :class:`ExpertMLPFunction`).
        loads : {None, "permuted", "gathered"}
            None: as the module's ``GATHERED_LOADS`` and ``STORED_GATHERS`` stand; "gathered": the
            gathered operands (``GATHERED_LOADS``) for this call; "permuted": neither.
        """
        from .routing import _sum_rows, _token_rows
        if loads not in (None, "permuted", "gathered"):
            raise ArgumentError("loads", loads, "None, 'permuted' or 'gathered'")
        gathered = GATHERED_LOADS if loads is None else loads == "gathered"
        stored = STORED_GATHERS if loads is None else False
        dev = x.device.index or 0
        idx = token_of_row.to(torch.int32)
        ones = torch.ones(w1.shape[0], device=x.device)
        fc1 = _gather_op("grouped_gemm_swiglu", dev, a_gather=gathered or bool(stored), d_dtype="bfloat16",
                         generate_c=True, c_dtype="bfloat16", **({"a_gather_store": True} if stored else {}))
        if gathered or stored:
            out = fc1(x, padded_offsets, w1, a_index=idx, row_ends=row_ends, inputs={"alpha": ones, "prob": prob})
            if stored:   # the rows fc1 gathered, kept for fc1's weight gradient in place of x
                x = out["a_rows"]
        else:   # x's rows permuted first (kept for fc1's weight gradient in place of x)
            x = _token_rows(x, token_of_row, row_of)
            out = fc1(x, padded_offsets, w1, row_ends=row_ends, inputs={"alpha": ones, "prob": prob})
        g, h = out["c"], out["d"]
        y = _gather_op("grouped_gemm", dev)(h, padded_offsets, w2, row_ends=row_ends, inputs={"alpha": ones})["d"]
        ctx.save_for_backward(x, idx, token_of_row, row_of, padded_offsets, row_ends, prob, w1, w2, g, h)
        ctx.wgrad, ctx.stored, ctx.gathered = wgrad, stored is True, gathered
        return _sum_rows(y, row_of)

    @staticmethod
    def backward(ctx, dy: Tensor):
        from .routing import _sum_rows, _token_rows
        from .torch_library import _kgrouped_fits, grouped_wgrad, weight_as_b
        x, idx, token_of_row, row_of, off, ends, prob, w1, w2, g, h = ctx.saved_tensors
        dev = x.device.index or 0
        ones = torch.ones(w1.shape[0], device=x.device)
        # dy (T, H): read through idx (padding rows: -1, zeros), or permuted first
        stored = ctx.stored
        gathered = ctx.gathered and not stored
        through_index = gathered or stored   # the dSwiGLU GEMM reads dy's token rows itself
        dy = dy.to(x.dtype).contiguous() if through_index else _token_rows(dy.to(x.dtype), token_of_row, row_of)
        through = {"a_index": idx} if through_index else {}
        b2, major2 = weight_as_b(w2)
        dsw = _gather_op("grouped_gemm_dswiglu_bf16", dev, a_gather=through_index, b_major=major2,
                         **_routed_dswiglu_tile(through_index, dev, g.shape[1] // 2),
                         **({"a_gather_store": True} if stored else {}))
        out = dsw(dy, off, b2, row_ends=ends, inputs={"alpha": ones, "prob": prob, "c": g}, **through)
        dg, dprob = out["d"], out["dprob"]
        if stored:
            dy = out["a_rows"]   # the rows the dSwiGLU GEMM gathered, for fc2's weight gradient
        b1, major1 = weight_as_b(w1)
        dx = _sum_rows(_gather_op("grouped_gemm", dev, b_major=major1)(dg, off, b1, row_ends=ends,
                                                                       inputs={"alpha": ones})["d"], row_of)

        def wgrad(a: Tensor, b: Tensor, like: Tensor, a_gathered: bool, b_gathered: bool) -> Tensor:
            if ctx.wgrad != "torch" and _kgrouped_fits(a.shape[1], b.shape[1], g.shape[0], dev):
                op = _gather_op("grouped_gemm_wgrad", dev, a_gather=a_gathered, b_gather=b_gathered)
                index = {**({"dy_index": idx} if a_gathered else {}), **({"x_index": idx} if b_gathered else {})}
                return op(a, b, off, row_ends=ends, **index)["d"].to(like.dtype)
            # torch's kernel reads permuted rows
            a = _token_rows(a, token_of_row, row_of) if a_gathered else a
            b = _token_rows(b, token_of_row, row_of) if b_gathered else b
            return grouped_wgrad(a, b, off, ctx.wgrad).to(like.dtype)
        if gathered and SWAPPED_WGRAD and ctx.wgrad != "torch" and _kgrouped_fits(x.shape[1], dg.shape[1],
                                                                                  g.shape[0], dev):
            op = _gather_op("grouped_gemm_wgrad", dev, a_gather=True, cd_major="m")
            dw1 = op(x, dg, off, row_ends=ends, dy_index=idx)["d"].to(w1.dtype)
        else:
            dw1 = wgrad(dg, x, w1, False, gathered)
        dw2 = wgrad(dy, h, w2, gathered, False)
        return dx, None, None, None, None, _zero_tail(dprob.to(prob.dtype), off), dw1, dw2, None, None


# MoEBlock(loads="auto"): the permuted path from this intermediate size F up. The permutation copies
# R x H rows of x forward and of dy backward, while the GEMMs' work per row grows with F; where F is
# wide the copies cost less than what the gathered kernels lose (the K-grouped gathered operand,
# 0.86-0.95x of pre-permuted rows, and the dSwiGLU GEMM's cooperative tile instead of the ping-pong
# one). H100, 2026-12-06, graphed, rounds in a Williams design (bench/results/moe_layer_h100_williams.json):
# permuted / gathered 1.047x at F 14336 (mixtral-like), 1.027x and 0.997x at F 2048 (dsv3-like, 32 and
# 8 experts; nulls 1.015x and 1.010x), 0.940x at F 768 (qwen3-like). (4096 lies between the level
# F 2048 and the F 14336 that gains; no layer in between was measured.)
PERMUTED_MIN_INTERMEDIATE = 4096


class MoEBlock(torch.nn.Module):
    """An MoE layer of ``experts`` SwiGLU experts, ``top_k`` per token.

    Parameters
    ----------
    hidden : int
        H, the model dimension.
    intermediate : int
        F, each expert's intermediate size (a multiple of 32).
    experts : int
        E, the experts (all local).
    top_k : int
        Experts per token, 1 <= top_k <= experts.
    normalize : bool
        Renormalize each token's k routing weights to sum to 1.
    dtype, backend, recipe, wgrad, device, generator
        As :class:`fusegemm.moe.ExpertMLP` (``backend="torch"`` runs on any device).
    loads : {"auto", "gathered", "permuted"}
        How the expert GEMMs read the tokens. "gathered": the GEMMs read the token rows through
        the routing's index themselves (:class:`RoutedMLPFunction` with gathered operands: no
        permuted copies) where that path runs: the fusegemm backend, the bf16 recipe, an sm_90a
        GPU, eager or CUDA-graphed; elsewhere, and under ``torch.compile``, the block runs its
        permuted path. "permuted": a gather kernel permutes x (and the output gradient) into
        expert-sorted rows first, always. "auto" (default): "permuted" where the intermediate
        size is at least :data:`PERMUTED_MIN_INTERMEDIATE`, else "gathered". Every choice gives
        the same values bit for bit (the logits' gradient within 1e-5: dprob's atomic sums).
        Measured on an H100 (2026-12-06, graphed, each round's order a row of a Williams design,
        bench/moe_layer.py --also block-again,block-permuted,
        bench/results/moe_layer_h100_williams.json): the permuted step 1.047x the gathered one at
        a mixtral-like layer (intermediate 14336, top-k 2; the null control 0.997x), 0.94x at a
        qwen3-like one (128 experts, top-k 8, intermediate 768), level at the dsv3-like ones
        (intermediate 2048); the gathered step peaks lower (3.98 against 4.71 GiB at qwen3, 9.10
        against 10.68 at dsv3 with 32 experts, 3.07 against 4.41 with 8, 9.49 against 9.70 at
        mixtral: bench/results/moe_layer_h100_fair_peaks.json).
    """

    def __init__(self, hidden: int, intermediate: int, experts: int, top_k: int, *, normalize: bool = False,
                 dtype: torch.dtype = torch.bfloat16, backend: str = "fusegemm", recipe: str = "bf16",
                 wgrad: str = "auto", device=None, generator: torch.Generator | None = None,
                 loads: str = "auto") -> None:
        super().__init__()
        check_choice(top_k, experts, normalize)
        if loads not in ("auto", "permuted", "gathered"):
            raise ArgumentError("loads", loads, "'auto', 'permuted' or 'gathered'")
        self.top_k, self.normalize, self.loads = top_k, normalize, loads
        self.mlp = ExpertMLP(experts, hidden, intermediate, dtype=dtype, backend=backend, recipe=recipe,
                             wgrad=wgrad, device=device, generator=generator)

    def forward(self, x: Tensor, logits: Tensor) -> Tensor:
        """The layer on the tokens ``x``.

        Parameters
        ----------
        x : (T, H) tensor, or (..., H)
            The tokens, in the expert weights' dtype; leading dimensions (e.g. batch, sequence)
            are flattened into T, and the output has x's shape.
        logits : (T, E) float tensor, or (..., E)
            The router's logits for each token (the same leading shape as x).
        """
        x2, logits2, lead = block_rows(x, logits, self.mlp.w1, self.mlp.w1.shape[0])
        return self._rows(x2, logits2).reshape(*lead, x2.shape[1])

    def _rows(self, x: Tensor, logits: Tensor) -> Tensor:
        """The layer on token rows x (T, H) and their logits (T, E)."""
        r = route(logits, self.top_k, normalize=self.normalize)
        if self.resolved_loads() == "gathered" and self._gathered_runs(x):
            return RoutedMLPFunction.apply(x, r.token_of_row, r.row_of, r.padded_offsets, r.row_ends, row_probs(r),
                                           self.mlp.w1, self.mlp.w2, self.mlp.wgrad, "gathered")
        # The row ends let the GEMMs skip the 256-row padding's tiles. The combine reads the routed
        # rows only, so with UNZEROED_PADDING the padding rows no tile writes are left as they are
        # where nothing reads them.
        rows = self.mlp._apply(gather(x, r), r.padded_offsets, row_probs(r), r.row_ends, tail=not UNZEROED_PADDING)
        return combine(rows, r)

    def resolved_loads(self) -> str:
        """The loads the block asks for: its ``loads``, with "auto" resolved by the intermediate size
        (``"permuted"`` from :data:`PERMUTED_MIN_INTERMEDIATE` up, else ``"gathered"``)."""
        if self.loads != "auto":
            return self.loads
        return "permuted" if self.mlp.w2.shape[2] >= PERMUTED_MIN_INTERMEDIATE else "gathered"

    def _gathered_runs(self, x: Tensor) -> bool:
        """Whether ``loads="gathered"`` runs its path for ``x``: RoutedMLPFunction's kernels are
        sm_90a's BF16 ones, called directly (no custom-op faces for torch.compile to trace)."""
        from .ops.device import device_arch
        mlp = self.mlp
        return (mlp.backend == "fusegemm" and mlp.recipe == "bf16" and x.is_cuda and x.dtype == torch.bfloat16
                and mlp.w1.dtype == torch.bfloat16 and not torch.compiler.is_compiling()
                and device_arch(x.device.index or 0) == "sm_90a")
