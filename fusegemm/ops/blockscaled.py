"""``BlockScaledGemm(spec, ...)``: :class:`fusegemm.Op` for block-scaled specs, the op under the
seed wrappers of grouped GEMM + sReLU, + quant, + dSwiGLU and batched GEMM + amax
(the rows of fusegemm/presets.py). Operands: fusegemm/ops/scaled_operands.py.

    op = BlockScaledGemm("grouped_gemm_srelu", d_dtype="float8_e4m3fn")
    out = op(a, sfa, padded_offsets, b, sfb, inputs={"alpha": alpha, "prob": prob, "norm_const": nc})
"""
from __future__ import annotations

from typing import Any

from ..base.errors import ArgumentError
from ..runtime.tensors import TensorView
from ..tupledict import TupleDict
from .engine import Op
from .scaled_operands import FAMILIES, ScaledCall


class BlockScaledGemm(Op):
    """:class:`fusegemm.Op` restricted to block-scaled specs: ``op(a_tensor, sfa_tensor,
    padded_offsets, b_tensor, sfb_tensor, inputs={...})`` for the grouped families (or
    ``b_ptrs=``, ``sfb_ptrs=``, ``n=`` for discrete weights), :meth:`batched` for ``gemm_amax``.

    Parameters
    ----------
    spec : Spec, spec name or path to a YAML file
        A spec of kernel family ``grouped_gemm_srelu``, ``grouped_gemm_quant``,
        ``grouped_gemm_dswiglu`` or ``gemm_amax``, or a user spec of one of them.
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
        if self.kind != "batched":
            raise ArgumentError("spec", self.spec.name, "a batched spec (problem: batched) for batched()")
        return self(a_tensor, b_tensor, sfa_tensor, sfb_tensor, current_stream=current_stream)

    # The pieces seed 004's class (scaled_seeds.execute_batched) calls one by one.
    def check_operands(self, call: ScaledCall) -> None:
        """The operands are of the format this op was built for."""
        from .engine import _check_format
        _check_format(self, call)

    def check_device(self, call: ScaledCall, more: list[tuple[str, TensorView, int]] = ()) -> int:
        """Every operand on this op's device at an aligned address; the device ordinal."""
        return self._check_devices(call, list(more))
