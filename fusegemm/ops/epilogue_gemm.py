"""``EpilogueGemm(spec, ...)``: :class:`fusegemm.Op` for specs of the BF16 grouped family.

For a spec of kernel family ``grouped_gemm`` (specs/grouped_gemm.yaml, a user spec such as
specs/grouped_gemm_swiglu.yaml, or one loaded from any path), the op runs the family's kernel with
the rule generated from the spec's epilogue, takes the epilogue's inputs by their spec names and
returns every output the epilogue declares. ``reference(...)`` computes the same outputs with
the numpy interpreter (fusegemm/interpret.py): a user-authored epilogue gets a reference for
free.

    op = EpilogueGemm("grouped_gemm_swiglu", d_dtype="float8_e4m3fn")
    out = op(a, padded_offsets, b, inputs={"alpha": alpha, "prob": prob, "norm_const": 0.01})
    out["d"], out["sfd_row"]
"""
from __future__ import annotations

from .engine import E5M2_RCP_MAX, RCP_MAX, Op

__all__ = ["EpilogueGemm", "E5M2_RCP_MAX", "RCP_MAX"]
FAMILY = "grouped_gemm"


class EpilogueGemm(Op):
    """:class:`fusegemm.Op` restricted to BF16 grouped specs: ``op(a_tensor, padded_offsets,
    b_tensor, inputs={...})`` (or ``b_ptrs=``, ``n=`` for discrete weights).

    Parameters
    ----------
    spec : Spec, spec name or path to a YAML file
        A spec of kernel family ``grouped_gemm``.
    arch : str, optional
        Default: the device's (``device``).
    device : int
        CUDA device ordinal (default 0).
    e5m2_rcp_max : {"page", "nvidia"}
        SFD convention of an e5m2 output.
    **axes
        Variant choices (``d_dtype="float8_e4m3fn"``, ``weight_mode="discrete"``, tiles...);
        the rest take the spec's and the arch's defaults.
    """

    FAMILIES = (FAMILY,)
    WHAT = "BF16 A/B"
