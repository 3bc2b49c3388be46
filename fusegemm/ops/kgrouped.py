"""``KGroupedGemm(spec, ...)``: :class:`fusegemm.Op` for the weight gradients of an MoE layer's
grouped GEMMs.

For each expert e, ``D_e = rule(dY_e^T @ X_e)`` where ``dY_e`` and ``X_e`` are the expert's token
rows ``[padded_offsets[e-1], padded_offsets[e])`` of ``dY`` (T, M) and ``X`` (T, N): the reduction
runs over the tokens, so each expert's K differs (an expert without tokens gets the rule of a
zero accumulator). Both operands stay token-major, as the layer stores them (no transposed copy).
Specs of kernel family ``grouped_gemm_wgrad`` (``specs/grouped_gemm_wgrad.yaml``):

    op = KGroupedGemm("grouped_gemm_wgrad")
    dw = op(dy, x, padded_offsets)["d"]           # (L, M, N): dW_e = dY_e^T X_e

``dy_tensor`` (T, M) and ``x_tensor`` (T, N) are bfloat16, row-major, T a multiple of 256; M a
multiple of the variant's ``tile_m``. Every row of an expert's range is reduced over, padding
rows included: they must hold zeros (as the MoE layer's do). D is allocated uninitialised: the
kernel stores every tile of every expert (zeros where an expert has no tokens).
"""
from __future__ import annotations

import functools

from .engine import Op

__all__ = ["KGroupedGemm", "wgrad_fits"]


class KGroupedGemm(Op):
    """:class:`fusegemm.Op` restricted to K-grouped specs: ``op(dy_tensor, x_tensor,
    padded_offsets, inputs={...})`` returns the outputs the epilogue declares, D and C as
    (L, M, N). sm_90a; sm_100a compiled and statically checked, behind the first-run
    verification.

    Parameters
    ----------
    spec : Spec, spec name or path to a YAML file
        A spec of kernel family ``grouped_gemm_wgrad``.
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


@functools.lru_cache(maxsize=256)
def wgrad_fits(n: int, k: int, m: int, arch: str) -> bool:
    """Whether specs/grouped_gemm_wgrad.yaml's kernel runs the weight gradient of (M, N) x (M, K)
    token rows on ``arch``: the registry has the family there and its kernel has run on that arch
    in the project's tests (sm_90a today; elsewhere the torch and JAX faces keep their framework's
    kernel rather than a first-run verification), N is whole tiles of it, K rows of 16 bytes and
    M a multiple of 256.

    Parameters
    ----------
    n, k, m : int
        The problem: dW (N, K) per expert over M rows.
    arch : str
        The device's arch.
    """
    from ..generator import registry
    if registry.lookup("grouped_gemm_wgrad", arch) is None or not registry.executed("grouped_gemm_wgrad", arch):
        return False
    return n % KGroupedGemm("grouped_gemm_wgrad", arch=arch).variant.tile_m == 0 and k % 8 == 0 and m % 256 == 0
