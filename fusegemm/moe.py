"""An MoE expert MLP for training, built from fusegemm ops (BF16 recipe, first cut).

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
data gradient with the grouped GEMM (both read the weights in place as N-major B on sm_90a; a
K-major copy elsewhere), and the weight
gradients (K-grouped: a reduction over each expert's tokens) with ``torch._grouped_mm``. Still
to come (issue 14): a K-grouped fusegemm family for the weight gradients and the MXFP8 recipe.

``backend="torch"`` runs the same structure with torch matmuls (any device, any float dtype):
the reference the tests hold the fusegemm backend to, and what ``gradcheck`` differentiates.
"""
from __future__ import annotations

import torch
from torch import Tensor

BLOCK = 32   # the seed's gate/up interleave (columns per block)


def interleave_gate_up(w_gate: Tensor, w_up: Tensor, block: int = BLOCK) -> Tensor:
    """(L, F, H) gate and up weights -> (L, 2F, H) with 32-row blocks alternating gate, up.

    Parameters
    ----------
    w_gate, w_up : (L, F, H) tensors
        The usual gate and up projections (F a multiple of ``block``).
    block : int
        Rows per block of the interleave (32, the seed's).
    """
    if w_gate.shape != w_up.shape or w_gate.dim() != 3 or w_gate.shape[1] % block:
        raise ValueError(f"w_gate/w_up: got {tuple(w_gate.shape)} and {tuple(w_up.shape)}; allowed: equal "
                         f"(L, F, H) shapes with F a multiple of {block}")
    l, f, h = w_gate.shape
    return torch.stack((w_gate.view(l, f // block, block, h), w_up.view(l, f // block, block, h)), 2).reshape(l, 2 * f, h)


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
    gate, up : (..., F) tensors
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


def _expert_rows(padded_offsets: Tensor) -> list[tuple[int, int]]:
    ends = padded_offsets.tolist()     # a host copy: the per-expert weight gradients need it
    return list(zip([0] + ends[:-1], ends))


class _Torch:
    """The layer's GEMMs with torch matmuls per expert (reference and CPU backend)."""

    @staticmethod
    def grouped(x: Tensor, rows: list, w: Tensor) -> Tensor:
        """y[rows_e] = x[rows_e] @ w[e]^T; rows past the last expert are 0."""
        y = x.new_zeros((x.shape[0], w.shape[1]))
        for e, (s, t) in enumerate(rows):
            if t > s:
                y[s:t] = (_acc(x[s:t]) @ _acc(w[e]).T).to(y.dtype)
        return y

    def fc1(self, x: Tensor, off: Tensor, rows: list, w1: Tensor, prob: Tensor) -> tuple[Tensor, Tensor]:
        """(g, h): the pre-activations (kept for the backward) and ``prob * silu(gate) * up``."""
        g = self.grouped(x, rows, w1)
        return g, _swiglu(g, prob).to(x.dtype)

    def gemm(self, x: Tensor, off: Tensor, rows: list, w: Tensor) -> Tensor:
        return self.grouped(x, rows, w)

    def dgrad(self, dg: Tensor, off: Tensor, rows: list, w1: Tensor) -> Tensor:
        return self.grouped(dg, rows, w1.transpose(1, 2))

    def dswiglu(self, dy: Tensor, off: Tensor, rows: list, w2: Tensor, g: Tensor, prob: Tensor) -> tuple[Tensor, Tensor]:
        """(dG interleaved, dprob) from dh = dy @ w2 (fc2's data gradient) and the saved g."""
        dh = self.grouped(dy, rows, w2.transpose(1, 2))
        dg, dprob = swiglu_backward(g, dh, prob)
        return dg.to(dy.dtype), dprob

    @staticmethod
    def wgrad(dy: Tensor, x: Tensor, off: Tensor, rows: list, like: Tensor) -> Tensor:
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

    def fc1(self, x: Tensor, off: Tensor, rows: list, w1: Tensor, prob: Tensor) -> tuple[Tensor, Tensor]:
        """One kernel: the SwiGLU epilogue stores h and, with generate_c, the pre-activations g."""
        from .torch_library import epilogue_gemm
        out = epilogue_gemm("grouped_gemm_swiglu", x, off, w1, inputs={"alpha": self._ones(w1), "prob": prob.float()},
                            d_dtype="bfloat16", generate_c=True, c_dtype="bfloat16")
        return out["c"], out["d"]

    def gemm(self, x: Tensor, off: Tensor, rows: list, w: Tensor, b_major: str = "k") -> Tensor:
        from .torch_library import epilogue_gemm
        return epilogue_gemm("grouped_gemm", x, off, w, inputs={"alpha": self._ones(w)}, b_major=b_major)["d"]

    def dgrad(self, dg: Tensor, off: Tensor, rows: list, w1: Tensor) -> Tensor:
        """fc1's data gradient dG @ w1: w1 read as an N-major B where the arch's kernel can."""
        return self.gemm(dg, off, rows, *_weight_as_b(w1))

    def dswiglu(self, dy: Tensor, off: Tensor, rows: list, w2: Tensor, g: Tensor, prob: Tensor) -> tuple[Tensor, Tensor]:
        """One kernel: fc2's data gradient with the dSwiGLU epilogue (specs/grouped_gemm_dswiglu_bf16.yaml)
        writes dG interleaved and accumulates dprob."""
        from .torch_library import epilogue_gemm
        b, major = _weight_as_b(w2)
        out = epilogue_gemm("grouped_gemm_dswiglu_bf16", dy, off, b,
                            inputs={"alpha": self._ones(w2), "prob": prob.float(), "c": g}, b_major=major)
        return out["d"], out["dprob"]

    @staticmethod
    def wgrad(dy: Tensor, x: Tensor, off: Tensor, rows: list, like: Tensor) -> Tensor:
        """The K-grouped weight gradient with torch._grouped_mm (BF16 in, FP32 accumulation): no
        fusegemm family for it yet (issue 14), and no host copy of the offsets."""
        return torch._grouped_mm(dy.t(), x, offs=off).to(like.dtype)


def _weight_as_b(w: Tensor) -> tuple[Tensor, str]:
    """A data gradient's weight (L, K, N) as the GEMM's B (L, N, K) and its ``b_major``: the view
    itself where the device's kernel reads N-major B (sm_90a), else a K-major copy."""
    if _b_major(w.device) == "n":
        return w.transpose(1, 2), "n"
    return w.transpose(1, 2).contiguous(), "k"


_B_MAJOR: dict[int, str] = {}


def _b_major(device: torch.device) -> str:
    """"n" when the device's arch implements N-major B for the grouped family (sm_90a), else "k"."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _B_MAJOR:
        from .generator import registry
        from .ops.device import device_arch
        row = registry.lookup("grouped_gemm", device_arch(index))
        _B_MAJOR[index] = "n" if row is not None and row.problem({"b_major": "n"}) is None else "k"
    return _B_MAJOR[index]


def _zero_tail(y: Tensor, off: Tensor) -> Tensor:
    """Rows at or past padded_offsets[-1] as zeros, without a sync; ``y`` (M, ...) of any rank."""
    valid = torch.arange(y.shape[0], device=y.device) < off[-1]
    return torch.where(valid.view(-1, *[1] * (y.dim() - 1)), y, torch.zeros((), dtype=y.dtype, device=y.device))


_BACKENDS = {"torch": _Torch(), "fusegemm": _Fusegemm()}


class ExpertMLPFunction(torch.autograd.Function):
    """``y = fc2(prob * silu(gate) * up)`` with ``(gate, up) = fc1(x)``, per expert (see the module
    docstring); differentiable in ``x``, ``prob``, ``w1`` and ``w2``."""

    @staticmethod
    def forward(ctx, x: Tensor, padded_offsets: Tensor, prob: Tensor, w1: Tensor, w2: Tensor,
                backend: str = "fusegemm") -> Tensor:
        """The layer's forward (``ExpertMLPFunction.apply(x, padded_offsets, prob, w1, w2, backend)``).

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
        """
        be = _BACKENDS[backend]
        rows = _expert_rows(padded_offsets) if backend == "torch" else None
        g, h = be.fc1(x, padded_offsets, rows, w1, prob)
        y = be.gemm(h, padded_offsets, rows, w2)
        ctx.save_for_backward(x, padded_offsets, prob, w1, w2, g, h)
        ctx.backend = backend
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, off, prob, w1, w2, g, h = ctx.saved_tensors
        be = _BACKENDS[ctx.backend]
        rows = _expert_rows(off) if ctx.backend == "torch" else None
        dy = dy.to(x.dtype)     # rows past the last expert are read by no kernel
        dg, dprob = be.dswiglu(dy, off, rows, w2, g, prob)
        dx = be.dgrad(dg, off, rows, w1)                               # (M, H)
        dw1, dw2 = be.wgrad(dg, x, off, rows, w1), be.wgrad(dy, h, off, rows, w2)
        return dx, None, _zero_tail(dprob.to(prob.dtype), off), dw1, dw2, None


class ExpertMLP(torch.nn.Module):
    """The expert MLP of an MoE layer (BF16 recipe): ``L`` experts, hidden size ``H``,
    intermediate size ``F`` (a multiple of 32). ``w1`` (L, 2F, H) gate/up interleaved, ``w2``
    (L, H, F). ``forward(x, padded_offsets, prob)`` as :class:`ExpertMLPFunction`.

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
    device : torch.device or str, optional
    generator : torch.Generator, optional
        Seeds the weights' initialisation (normal, scaled by fan-in ** -0.5).
    """

    def __init__(self, experts: int, hidden: int, intermediate: int, *, dtype: torch.dtype = torch.bfloat16,
                 backend: str = "fusegemm", device=None, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if backend not in _BACKENDS:
            raise ValueError(f"backend: got {backend!r}; allowed: {', '.join(_BACKENDS)}")
        if intermediate % BLOCK:
            raise ValueError(f"intermediate: got {intermediate}; allowed: a multiple of {BLOCK}")
        self.backend = backend
        w = lambda *s, fan: torch.randn(*s, generator=generator) * fan ** -0.5  # noqa: E731
        self.w1 = torch.nn.Parameter(w(experts, 2 * intermediate, hidden, fan=hidden).to(dtype=dtype, device=device))
        self.w2 = torch.nn.Parameter(w(experts, hidden, intermediate, fan=intermediate).to(dtype=dtype, device=device))

    def forward(self, x: Tensor, padded_offsets: Tensor, prob: Tensor) -> Tensor:
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
        """
        return ExpertMLPFunction.apply(x, padded_offsets, prob, self.w1, self.w2, self.backend)
