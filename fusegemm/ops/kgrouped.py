"""K-grouped GEMMs with a spec's epilogue: the weight gradients of an MoE layer's grouped GEMMs.

For each expert e, ``D_e = rule(dY_e^T @ X_e)`` where ``dY_e`` and ``X_e`` are the expert's token
rows ``[padded_offsets[e-1], padded_offsets[e])`` of ``dY`` (T, M) and ``X`` (T, N): the reduction
runs over the tokens, so each expert's K differs (an expert without tokens gets the rule of a
zero accumulator). Both operands stay token-major, as the layer stores them (no transposed copy).
Specs of kernel family ``grouped_gemm_wgrad`` (``specs/grouped_gemm_wgrad.yaml``):

    op = KGroupedGemm("grouped_gemm_wgrad")
    dw = op(dy, x, padded_offsets)["d"]           # (L, M, N): dW_e = dY_e^T X_e
"""
from __future__ import annotations

from typing import Any, Mapping

from .. import arguments as args
from ..base.dtypes import DTYPES
from ..base.errors import ArgumentError
from ..tupledict import TupleDict
from . import checks
from ..runtime import config
from .device import alloc_outputs, offsets_on_host
from .epilogue_gemm import SpecGemm
from .prepared import is_dry, persistent_grid


class _Call:
    """The validated operands, in the shape SpecGemm._inputs reads (m: output rows L * M)."""

    def __init__(self, a: Any, b: Any, offsets: Any, t: int, m: int, n: int, l: int) -> None:
        self.a, self.b, self.offsets = a, b, offsets
        self.t, self.m_out, self.n, self.l = t, m, n, l
        self.m = l * m    # rows of the (L * M, N) output the epilogue writes


def _token_major(x: Any, name: str, t: int | None) -> Any:
    """A (T, C) bfloat16 operand, C contiguous, 16-byte row pitch and base, T a multiple of 256."""
    v = args.tensor(x, name, ndims=(2,), dtypes=("bfloat16",))
    rows, cols = v.shape
    if t is not None and rows != t:
        raise ArgumentError(f"{name}.shape[0]", rows, f"{t} (the token rows of dy_tensor)")
    if rows % args.M_ALIGNED:
        raise ArgumentError(f"{name}.shape[0]", rows, f"a multiple of {args.M_ALIGNED} (padded token rows)")
    if cols < 8 or cols % 8:
        raise ArgumentError(f"{name}.shape[1]", cols, "a multiple of 8, at least 8 (16-byte rows)")
    if rows and (v.strides[1] != 1 or v.strides[0] < cols):
        raise ArgumentError(f"{name}.stride", v.strides, f"row-major: (at least {cols}, 1)")
    checks.row_pitch_aligned(v.strides[0], DTYPES[v.dtype].itemsize, name)
    return v


class KGroupedGemm(SpecGemm):
    """Compiled K-grouped BF16 GEMM with a spec's epilogue, for one variant (sm_90a; sm_100a
    compiled and statically checked, behind the first-run verification).

    Parameters
    ----------
    spec : Spec, spec name or path to a YAML file
        A spec of kernel family ``grouped_gemm_wgrad`` (``grouped_gemm_wgrad``).
    arch : str, optional
        Default: the device's (``device``).
    device : int
        CUDA device ordinal (default 0).
    e5m2_rcp_max : {"page", "nvidia"}
        SFD convention of an e5m2 output (K-grouped rules have none; accepted for symmetry).
    **axes
        Variant choices (``d_dtype="float32"``, tiles); the rest take the spec's and the arch's
        defaults.
    """

    FAMILIES = ("grouped_gemm_wgrad",)
    WHAT = "K-grouped BF16: weight gradients"

    def __call__(self, dy_tensor: Any, x_tensor: Any, padded_offsets: Any, *,
                 inputs: Mapping[str, Any] | None = None, current_stream: Any = None) -> TupleDict:
        """``D_e = rule(dY_e^T X_e)`` for every expert. Returns the outputs the epilogue declares,
        shaped (L, M, N) (d, c) or as the epilogue defines them (amax).

        Parameters
        ----------
        dy_tensor : (T, M) bfloat16
            The output gradient rows, grouped by expert like ``x_tensor``; M a multiple of the
            variant's ``tile_m`` (128 by default).
        x_tensor : (T, N) bfloat16
            The layer's input rows; N a multiple of 8.
        padded_offsets : (L,) int32
            Each expert's end row: nondecreasing multiples of 256, the last <= T. Every row of an
            expert's range is reduced over, padding rows included: they must hold zeros (as the
            MoE layer's do). Checked on the host only with FUSEGEMM_VALIDATE_OFFSETS=1 (the
            values live on the device).
        inputs : dict, optional
            The epilogue's inputs by spec name (``alpha`` defaults to 1).
        current_stream : stream, optional
            Where to launch (raw handle, torch.cuda.Stream, ...); default torch's current stream.
        """
        from ..runtime.load import thread_context
        from ..runtime.tensors import resolve_stream
        self.compile()
        dy = _token_major(dy_tensor, "dy_tensor", None)
        t, m = dy.shape
        x = _token_major(x_tensor, "x_tensor", t)
        n = x.shape[1]
        off, l = args.offsets(padded_offsets)
        tm = self.variant.tile_m
        if m % tm or m == 0:
            raise ArgumentError("dy_tensor.shape[1]", m, f"a positive multiple of {tm} (the tile's M: each "
                                                         f"expert's (M, N) block is whole tiles)")
        checks.unit_stride(off, "padded_offsets")
        call = _Call(dy, x, off, t, m, n, l)
        deferred: list = []
        values, keep = self._inputs(inputs or {}, call, n, deferred)
        if not is_dry():   # a fake implementation's trace has no device and launches nothing
            # Devices and addresses last (everything decidable from shapes and dtypes came first).
            checks.require_cuda(dy, "dy_tensor")
            checks.same_device([("x_tensor", x), ("padded_offsets", off)] + [(nm, v) for nm, v, _ in deferred],
                               dy.device)
            checks.aligned(dy, "dy_tensor")
            checks.aligned(x, "x_tensor")
            for nm, v, align in deferred:
                checks.aligned(v, nm, align)
        kind, index = dy.device
        # D uninitialised: the kernel stores every tile of every expert (zeros where an expert has
        # no tokens), so a fill first would only cost time: 3-22% on the H200 (bench/wgrad.py
        # --fill-ab, bench/results/wgrad_h200.json).
        out = alloc_outputs(self.epilogue, n, l * m, l, kind if index < 0 else f"{kind}:{index}",
                            rows_written=not is_dry())
        shaped = {k: (v.view(l, m, n) if k in ("c", "d") else v) for k, v in out.items()}
        if is_dry():
            return TupleDict(**shaped)
        thread_context(self.device)
        ln = self._launcher
        stream = resolve_stream(current_stream, self.device)
        if config.validate_offsets():
            host = offsets_on_host(padded_offsets, stream)   # None while a CUDA graph is captured
            if host is not None:
                args.offsets_values(host, t, "dy_tensor")
        c, tiled, item = ln.contract, ln.tmaps.tiled, DTYPES["bfloat16"].itemsize
        # No tokens at all (an expert-parallel rank that received none): every tile has an empty
        # K range and loads nothing, but a tensor map needs a real extent and address; D's
        # buffer (at least M x N elements) stands in for both operands.
        a_ptr, b_ptr, a_ld, b_ld, rows = dy.ptr, x.ptr, dy.strides[0], x.strides[0], t
        if t == 0:
            a_ptr = b_ptr = out["d"].data_ptr() if "d" in out else next(iter(out.values())).data_ptr()
            a_ld, b_ld, rows = m, n, 1
        values["tma_a"] = tiled(a_ptr, ln.tma_dtype, (m, rows), (a_ld * item,),
                                (c.box_a_inner, c.box_a_outer), c.swizzle_a)
        values["tma_b"] = tiled(b_ptr, ln.tma_dtype, (n, rows), (b_ld * item,),
                                (c.box_b_inner, c.box_b_outer), c.swizzle_b)
        values.update({"m_rows": m, "n": n, "k": t, "num_experts": l, "cluster_m": 1, "cluster_n": 1,
                       "offsets": off.ptr, "b_ptrs": 0, "rcp_max": self.rcp_max})
        values.update(self.epilogue.buffer_params({name: v.data_ptr() for name, v in out.items()}, n))
        grid = persistent_grid(l * m, n, ln.tile, ln.contract.ctas_per_tile, ln.cluster, ln.sms)  # (L * M, N) tiles
        ln.launch(values, grid, stream)
        del keep
        return TupleDict(**shaped)

    def reference(self, dy_tensor: Any, x_tensor: Any, padded_offsets: Any, *,
                  inputs: Mapping[str, Any] | None = None) -> Any:
        """The same call computed on the host: each expert's ``dY_e^T X_e`` in float64 rounded to
        FP32 (zero for an expert without tokens), then the numpy interpreter over the stacked
        (L * M, N) accumulator with expert e owning rows [e M, (e + 1) M). Outputs are (L * M, N)
        arrays (``.reshape(L, M, N)`` matches the kernel's).

        Parameters
        ----------
        dy_tensor : (T, M) bfloat16 (numpy or torch, on any device)
            The output gradient rows, grouped by expert.
        x_tensor : (T, N) bfloat16
            The layer's input rows.
        padded_offsets : (L,) int32
            Each expert's end row: nondecreasing multiples of 256.
        inputs : dict, optional
            The epilogue's inputs by spec name.
        """
        import numpy as np

        from ..formats.dtypes import to_numpy
        from ..interpret import interpret
        dy = to_numpy(dy_tensor).astype(np.float64)
        x = to_numpy(x_tensor).astype(np.float64)
        off = to_numpy(padded_offsets).astype(np.int64)
        args.offsets_values([int(v) for v in off], dy.shape[0], "dy_tensor")
        l, m, n = off.size, dy.shape[1], x.shape[1]
        acc = np.zeros((l * m, n), dtype=np.float32)
        start = 0
        for e, end in enumerate(off):
            acc[e * m:(e + 1) * m] = (dy[start:end].T @ x[start:end]).astype(np.float32)
            start = int(end)
        host = {k: (v if isinstance(v, (int, float)) else to_numpy(v)) for k, v in (inputs or {}).items()}
        return interpret(self.epilogue, acc, offsets=np.arange(1, l + 1, dtype=np.int64) * m, m_rows=l * m,
                         inputs=host, rcp_max=self.rcp_max or None)
