"""Parameter structs of the kernel families (the ABI every op launches with).

One superset struct serves every grouped op (seeds 000-003) so that the shared kernel pieces
(scheduler, TMA loads, epilogue) read the same field names on sm_90a and sm_100a; a field an op
does not use stays zero. The batched GEMM+amax family (seed 004) uses the same struct with
``num_experts`` = batch and no offsets.
"""
from __future__ import annotations

from .abi import Field, ParamStruct
from .registry import families

GROUPED_PARAMS = ParamStruct("Params", (
    # TMA descriptors, encoded on the host (runtime/tensormap.py).
    Field("tma_a", "tensormap", "A (rows, K) K-major; batched: (M, K, L)"),
    Field("tma_b", "tensormap", "B (N, K, L) dense; discrete: template for per-expert maps"),
    Field("tma_sfa", "tensormap", "SFA atoms (block-scaled ops)"),
    Field("tma_sfb", "tensormap", "SFB atoms (block-scaled ops)"),
    Field("tma_c_in", "tensormap", "dSwiGLU forward C input (rows, 2N)"),
    Field("tma_d", "tensormap", "D store (rows, N), when the epilogue stores through TMA"),
    # Device pointers (inputs).
    Field("offsets", "cptr", "padded_offsets int32 (L,): cumulative expert row ends"),
    Field("a_index", "cptr", "gathered A: int32 (m_rows,) the row of A each problem row reads (outside A: zeros)"),
    Field("b_index", "cptr", "K-grouped, gathered X: int32 (k,) the row of X each token row reads (outside X: zeros)"),
    Field("d_index", "cptr", "scattered outputs: int32 (m_rows,) the C/D row each problem row writes (outside "
          "[0, d_rows): none)"),
    Field("a_gather_ptr", "cptr", "gathered A (dY): the token-major matrix a_index reads, bfloat16 (the blockwise "
          "kernel: FP8)"),
    Field("b_gather_ptr", "cptr", "K-grouped, gathered X: the token-major matrix b_index reads, bfloat16"),
    Field("sfa_gather_ptr", "cptr", "gathered A's scales: blockwise recipe float (T, ceil(K/128)) of a_gather_ptr's "
          "rows, T-contiguous; MX: the scale atoms of its T rows"),
    Field("row_ends", "cptr", "optional int32 (L,): where each expert's tokens end in its padded range (tiles past it skipped)"),
    Field("b_ptrs", "cptr", "discrete weights: uint64 (L,) per-expert (N, K) pointers"),
    Field("sfb_ptrs", "cptr", "discrete weights: uint64 (L,) per-expert SFB pointers"),
    Field("sfb", "cptr", "blockwise recipe, dense weights: float (L, ceil(N/128), ceil(K/128)) B scales"),
    Field("alpha", "cptr", "float (L,) per-expert scale"),
    Field("beta", "cptr", "float (L,) per-expert C scale (dSwiGLU)"),
    Field("expert_in2", "cptr", "third per-expert input (L,)"),
    Field("prob", "cptr", "float (rows,) per-row gate; null means 1"),
    Field("row_scale", "cptr", "second per-row input (seed 003 row_scale)"),
    Field("row_in2", "cptr", "third per-row input (rows,)"),
    Field("row_in3", "cptr", "fourth per-row input (rows,)"),
    Field("bias", "cptr", "bias (N, L), expert stride N elements"),
    Field("col_in1", "cptr", "second column input (N, L), expert stride N elements"),
    Field("c_in", "cptr", "element input (dSwiGLU C), ld_c_in elements per row"),
    Field("norm_const", "cptr", "float (1,) output quantization constant"),
    Field("scalar_in1", "cptr", "second scalar input (1,)"),
    # Device pointers (outputs).
    Field("c_out", "ptr", "C (rows, N) row-major, ldc elements per row"),
    Field("d_out", "ptr", "D (rows, N) row-major, ldd elements per row"),
    Field("d_col_out", "ptr", "column-quantized D"),
    Field("sfd_row", "ptr", "row scale factors of D"),
    Field("sfd_col", "ptr", "column scale factors of D"),
    Field("amax", "ptr", "float amax per expert (L,...) or global (1,1,1)"),
    Field("dprob", "ptr", "float (rows,) dSwiGLU prob gradient, accumulated atomically"),
    Field("dbias", "ptr", "float (L, W) per-expert column sums (a bias gradient), accumulated atomically"),
    # Per-call scratch (owned by the call or the compiled op, never global: graph-safe).
    Field("sched_counter", "ptr", "uint32 tile counter for dynamic scheduling, zeroed per call"),
    Field("tmap_workspace", "ptr", "per-CTA tensor-map slots (discrete weights), 128 B each"),
    Field("sk_partials", "ptr", "stream-K: float per-CTA partial tiles (grid x TILE_M x TILE_N), written before read"),
    Field("sk_flags", "ptr", "stream-K: int32 (grid,) per-CTA partial-written flags, zeroed per call"),
    # Sizes.
    Field("m_rows", "i32", "rows of A's allocation (>= valid_m = offsets[L-1])"),
    Field("n", "i32", "N (output columns)"),
    Field("k", "i32", "K (reduction length, in elements)"),
    Field("num_experts", "i32", "L"),
    Field("ldc", "i64", "C row stride in elements"),
    Field("ldd", "i64", "D row stride in elements (D_col: the same)"),
    Field("ld_c_in", "i64", "element input row stride in elements"),
    Field("a_gather_ld", "i64", "gathered A: row stride of a_gather_ptr's matrix in elements"),
    Field("sfa_gather_ld", "i64", "gathered A: sfa_gather_ptr's pitch between 128-K blocks in floats (blockwise), "
          "between 128-row atom groups in 4-byte words (MX)"),
    Field("b_gather_ld", "i64", "gathered X: row stride of b_gather_ptr's matrix in elements"),
    Field("a_gather_rows", "i32", "gathered A: rows of a_gather_ptr's matrix (an index outside them reads zeros)"),
    Field("b_gather_rows", "i32", "gathered X: rows of b_gather_ptr's matrix"),
    Field("d_rows", "i32", "scattered outputs: rows of the C/D buffers d_index writes"),
    Field("rcp_max", "f32", "SFD: 1 / the FP8/FP4 output's largest value (e5m2: 1/57344 or 1/128)"),
    # Launch cluster shape (a launch attribute, not compiled in): rank r of the 1-D launch
    # cluster is CTA (r % cluster_m, r / cluster_m); 2-CTA pairs are ranks (2i, 2i+1) along M.
    # Zero (a host that predates these fields) means no multicast: pairs only.
    Field("cluster_m", "i32", "cluster M in CTAs (sm_100a TMA multicast of B along M); 0 = pairs only"),
    Field("cluster_n", "i32", "cluster N in CTAs (sm_100a TMA multicast of A along N); 0 = pairs only"),
    Field("sk_min_k_blocks", "i32", "stream-K: fewest k-blocks per CTA of the last wave's split (0: no split)"),
))


def params_for(kernel: str) -> ParamStruct:
    """The parameter struct of a kernel family (every current family shares one)."""
    if kernel not in families():
        raise ValueError(f"kernel: got {kernel!r}; allowed: {', '.join(families())}")
    return GROUPED_PARAMS


# The epilogue harness (templates/harness.cu.j2) takes the kernels' struct plus the accumulators
# it runs the rule on: the engine reads the same fields either way.
HARNESS_PARAMS = ParamStruct("Params", GROUPED_PARAMS.fields + (
    Field("acc", "cptr", "float (valid_m, N) accumulators the rule is applied to"),
    Field("ld_acc", "i64", "accumulator row stride in elements"),
))
