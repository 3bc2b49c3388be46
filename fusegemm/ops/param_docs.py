"""How the GPU ops' parameters differ from the numpy references' (fusegemm/base/docstrings.py
builds each op's ``Parameters`` section from the reference's, with these entries on top)."""
from __future__ import annotations

_STREAM = ("stream, optional\nWhere to launch: a raw ``CUstream`` int, a ``torch.cuda.Stream``, a cuda.core Stream "
           "or a cuda-bindings ``CUstream``; default torch's current stream on A's device.")

GPU = {
    "padded_offsets": "(L,) int32 device tensor, L <= 1024\nEach expert's end row: nondecreasing multiples of 256. "
                      "The values live on the device and are checked only with ``validate_offsets``: wrong values "
                      "give wrong rows, never an access outside the tensors.",
    "b_ptrs": "(L,) int64 tensor, optional\nDevice addresses of each expert's (N, K) K-major weights (discrete "
              "weights, instead of ``b_tensor``); ``n`` is then required.",
    "sfb_ptrs": "(L,) int64 tensor, optional\nDevice addresses of each expert's scale-factor buffer (discrete "
                "weights, with ``b_ptrs``).",
    "n": "int, optional\nN of discrete weights (device pointers carry no shape).",
    "num_experts": "int, optional\nL of discrete weights (a class built without ``sample_b``; ``execute`` takes "
                   "``b_ptrs``).",
    "b_shape": "(int, int), optional\n(N, K) of each expert's discrete weights (with ``num_experts``); for packed "
               "FP4, K in elements or the bytes of a row.",
    "current_stream": _STREAM,
    "stream": _STREAM,
    "mma_tiler_mn": "(int, int), optional\nMMA tile (M, N); default the arch kernel's (``fusegemm.grouped_gemm``: a "
                    "configuration ``fusegemm tune`` recorded for the call's shape first). ``fusegemm show SPEC`` lists "
                    "what each arch implements; another tile raises UnsupportedError with the reason.",
    "cluster_shape_mn": "(int, int), optional\nThread-block cluster (M, N); default the arch kernel's.",
    "use_dynamic_sched": "bool\nClaim tiles from an atomic counter (per-call scratch) instead of the static "
                         "persistent walk.",
    "cd_major": "\"n\"\nC and D are row-major (the layout the grouped kernels write).",
    "vector_f32": "bool\nPacked FP32 epilogue arithmetic: on sm_100a the epilogue evaluates pairs of accumulator "
                  "columns with FADD2/FMUL2/FFMA2 (each lane the same correctly rounded operation: the results "
                  "are bit-identical to False); sm_90a has no packed FP32 and runs the scalar kernel.",
    "m_aligned": "256\nRow padding of every expert (fixed by the kernels).",
    "arch": "str, optional\nThe arch to build for (``fusegemm.base.archs``); default the device's. A class built "
            "for another arch checks its support and compiles, and refuses to run on this device.",
    "validate_offsets": "bool, optional\nCopy ``padded_offsets`` to the host and check them before the launch (a "
                        "sync; never during graph capture); default ``FUSEGEMM_VALIDATE_OFFSETS``.",
}

# The torch custom ops' short names for the seed parameters.
TORCH_NAMES = {"a": "a_tensor", "b": "b_tensor", "c": "c_tensor", "sfa": "sfa_tensor", "sfb": "sfb_tensor",
               "alpha": "alpha_tensor", "beta": "beta_tensor", "bias": "bias_tensor", "prob": "prob_tensor",
               "norm_const": "norm_const_tensor", "row_scale": "row_scale_tensor"}


def outputs(names: dict[str, str]) -> dict[str, str]:
    """Entries for caller-owned outputs of a class API's ``execute`` (written in place)."""
    return {k: f"{v}\nOutput, written in place (its dtype and layout are the op's, fixed when it was built)."
            for k, v in names.items()}


_SFD_ROW = ("scale factors\nD's scales along rows (one per 32 or 16 columns): the physical atom buffer or its "
            "kernel-facing view, in sfa's dtype")
_SFD_COL = "scale factors\nd_col's scales (one per 32 or 16 rows), as ``sfd_row_tensor``"
_AMAX = "(L, 1) float32\nPer-expert max |D| of a bf16/fp16 D"
# The outputs of each block-scaled seed, by the seed's names (shapes as the wrappers return them).
OUTPUTS = {
    "grouped_gemm": {
        "c_tensor": "(M, N) or (M, N, 1), optional\nC = alpha * A B^T (+ prob * bias) in ``c_dtype`` (with generate_c)",
        "d_tensor": "(M, N) or (M, N, 1)\nD in ``d_dtype``"},
    "grouped_gemm_srelu": {
        "c_tensor": "(M, N) or (M, N, 1)\nC = alpha * A B^T (+ bias) in ``c_dtype``, before the activation",
        "d_tensor": "(M, N) or (M, N, 1)\nD = prob * relu(C)^2 in ``d_dtype`` (FP8/FP4: quantized with sfd_row)",
        "d_col_tensor": "(M, N) or (M, N, 1)\nFP8/FP4 D quantized along columns (with sfd_col)",
        "sfd_row_tensor": _SFD_ROW, "sfd_col_tensor": _SFD_COL, "amax_tensor": _AMAX},
    "grouped_gemm_quant": {
        "d_tensor": "(M, N) or (M, N, 1)\nD in ``d_dtype`` (FP8/FP4: quantized with sfd_row)",
        "d_col_tensor": "(M, N) or (M, N, 1)\nFP8/FP4 D quantized along columns (with sfd_col)",
        "sfd_row_tensor": _SFD_ROW, "sfd_col_tensor": _SFD_COL, "amax_tensor": _AMAX},
    "grouped_gemm_dswiglu": {
        "d_row_tensor": "(M, 2N) or (M, 2N, 1)\ndSwiGLU in the gate blocks, R * prob * swish(g) in the up blocks",
        "d_col_tensor": "(M, 2N) or (M, 2N, 1)\nFP8 D quantized along columns (with sfd_col)",
        "dprob_tensor": "(M,) or (M, 1, 1) float32\nsum(swish(g) * u * R) per row (the prob gradient)",
        "amax_tensor": "(L, 1, 1) float32\nPer-expert max |D| of a bf16 D",
        "sfd_row_tensor": _SFD_ROW, "sfd_col_tensor": _SFD_COL},
    "gemm_amax": {
        "c_tensor": "(M, N, L), or (M, N) for L = 1\nC in ``c_dtype``, N- or M-contiguous as ``sample_c``",
        "amax_tensor": "(1, 1, 1) float32\nmax |C| over everything"},
}


def class_api(source, outputs: dict[str, str]):
    """Parameters of a block-scaled class API: its constructor's ``sample_*`` (samples of the
    source's inputs and of the outputs: their dtypes and layouts choose the variant) and options
    in the class docstring, and ``execute``'s inputs and outputs (written in place)."""
    import inspect

    from ..base.docstrings import parameter_docs, shares_parameters
    src = parameter_docs(inspect.getdoc(source))

    def deco(cls):
        samples = {}
        for p in inspect.signature(cls).parameters:
            if not p.startswith("sample_"):
                continue
            base = p[len("sample_"):]
            key = next((k for k in (base + "_tensor", base) if k in outputs or k in src), None)
            what = (outputs.get(key) or src.get(key) or "").split("\n")[0]
            what = f" ({what})" if what else ""
            samples[p] = f"optional\nA sample of ``{key}``{what}: its dtype and layout choose the variant."
        shares_parameters(source, extra={**GPU, **samples})(cls)
        shares_parameters(source, extra={**GPU, **{k: f"{v}\nOutput, written in place." for k, v in outputs.items()}})(
            cls.execute)
        return cls
    return deco
