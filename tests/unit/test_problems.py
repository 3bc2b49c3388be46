"""Tests of fusegemm.problems: seeded grouped and batched problem makers."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fusegemm import formats as F
from fusegemm import reference as R
from fusegemm.problems import (
    BatchedProblem,
    GroupedProblem,
    make_batched_problem,
    make_grouped_problem,
    split_tokens,
)

OPS = ["grouped_gemm", "grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu"]


def small(op: str, **kw) -> GroupedProblem:
    args = dict(num_experts=3, tokens=500, n=64, k=64, seed=0)
    args.update(kw)
    return make_grouped_problem(op, **args)


def test_split_tokens_modes():
    rng = np.random.default_rng(0)
    assert split_tokens(10, 4, "balanced", rng) == [3, 3, 2, 2]
    skewed = split_tokens(10_000, 8, "skewed", rng)
    assert sum(skewed) == 10_000 and max(skewed) > 3 * min(skewed)
    empty = split_tokens(1000, 8, "with_empty", rng)
    assert sum(empty) == 1000 and empty.count(0) == 2
    with pytest.raises(ValueError, match=r"^skew='with_empty' needs num_experts >= 2"):
        split_tokens(10, 1, "with_empty", rng)
    with pytest.raises(ValueError, match=r"^skew='zipf' is not supported; allowed: 'balanced', 'skewed', 'with_empty'$"):
        split_tokens(10, 2, "zipf", rng)


@pytest.mark.parametrize("skew", ["balanced", "skewed", "with_empty"])
def test_offsets_are_padded_cumulative_multiples_of_256(skew):
    p = small("grouped_gemm_quant", num_experts=6, tokens=1300, skew=skew)
    padded = np.diff(np.concatenate([[0], p.padded_offsets]))
    assert p.padded_offsets.dtype == np.int32 and np.all(p.padded_offsets % 256 == 0)
    assert np.array_equal(padded, [-(-t // 256) * 256 for t in p.tokens]) and sum(p.tokens) == 1300
    assert p.a_tensor.shape == (p.valid_m, 64, 1) and p.prob_tensor.shape == (p.valid_m, 1, 1)


def test_seed_determinism():
    p1, p2, p3 = small("grouped_gemm_srelu"), small("grouped_gemm_srelu"), small("grouped_gemm_srelu", seed=1)
    for name in ("a_tensor", "b_tensor", "sfa_tensor", "sfb_tensor", "prob_tensor", "alpha_tensor"):
        a1, a2 = getattr(p1, name), getattr(p2, name)
        assert np.array_equal(a1.view(np.uint8) if a1.itemsize == 1 else a1, a2.view(np.uint8) if a2.itemsize == 1 else a2)
    assert not np.array_equal(p1.a_tensor.view(np.uint8), p3.a_tensor.view(np.uint8))


def test_nvidia_values_follow_nvidia_tests():
    p = small("grouped_gemm_quant", pad_rows="random")
    a = F.to_float32(p.a_tensor)
    assert np.all(np.abs(a) <= 2) and a.std() > 0.5
    sfa = F.unpack_sf(p.sfa_tensor, p.valid_m, 2)
    assert set(np.unique(F.to_float32(sfa)).tolist()) == {1.0, 2.0}
    assert set(np.unique(p.alpha_tensor).tolist()) <= {1.0, 2.0}
    assert set(np.unique(p.prob_tensor).tolist()) <= {1.0, 2.0}
    assert p.norm_const_tensor.tolist() == [np.float32(0.01)] and p.norm_const_tensor.dtype == np.float32
    nvfp4 = small("grouped_gemm_srelu", ab_dtype="float4_e2m1fn_x2")
    assert nvfp4.sf_dtype == "float8_e4m3fn" and nvfp4.sf_vec_size == 16 and nvfp4.a_tensor.dtype == np.uint8
    assert nvfp4.a_tensor.shape == (nvfp4.valid_m, 32, 1)  # packed: K/2 innermost


def test_pad_rows_zero_or_random():
    p = small("grouped_gemm_quant", tokens=[10, 0, 300])
    a = F.to_float32(p.a_tensor[:, :, 0])
    assert a[:10].any(axis=1).all() and not a[10:256].any()  # expert 0: 10 tokens, zero padding
    assert a[256:556].any(axis=1).all() and not a[556:768].any()
    assert F.to_float32(small("grouped_gemm_quant", tokens=[10, 0, 300], pad_rows="random").a_tensor)[100].any()


def test_realistic_values():
    p = small("grouped_gemm_quant", values="realistic")
    assert 0 <= p.prob_tensor.min() and p.prob_tensor.max() <= 1 and p.norm_const_tensor[0] == 1.0
    assert np.all((p.alpha_tensor >= 0.5) & (p.alpha_tensor <= 2))
    top = np.abs(F.to_float32(p.a_tensor[:256, :, 0])).reshape(256, 2, 32).max(-1)
    live = top > 0
    assert np.all(top[live] >= 224)  # block-quantized with amax scales: top element near 448
    bf = small("grouped_gemm", values="realistic")
    assert bf.a_tensor.dtype == np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("layout", ["kernel", "canonical"])
def test_problem_kwargs_run_the_reference(op, layout):
    p = small(op, layout=layout, skew="with_empty")
    out = getattr(R, op)(**p.kwargs())
    first = out[0]
    rows = first.shape[0]
    assert rows == p.valid_m and (first.ndim == 2) == (layout == "canonical")


def test_kernel_and_canonical_layouts_give_identical_results():
    kernel = small("grouped_gemm_dswiglu", layout="kernel")
    canon = small("grouped_gemm_dswiglu", layout="canonical")
    assert kernel.b_tensor.shape == (64, 64, 3) and canon.b_tensor.shape == (3, 64, 64)
    assert kernel.sfa_tensor.shape[:2] == (32, 4) and canon.sfa_tensor.shape[3:] == (32, 4, 4)
    r1, r2 = R.grouped_gemm_dswiglu(**kernel.kwargs()), R.grouped_gemm_dswiglu(**canon.kwargs())
    assert np.array_equal(r1["d_row_tensor"][:, :, 0].view(np.uint8), r2["d_row_tensor"].view(np.uint8))
    assert np.array_equal(r1["dprob_tensor"][:, 0, 0], r2["dprob_tensor"])


def test_discrete_problem_matches_dense():
    dense = small("grouped_gemm_quant", bias=True)
    discrete = small("grouped_gemm_quant", bias=True, discrete=True)
    assert discrete.b_tensor is None and len(discrete.b_list) == 3 and len(discrete.sfb_list) == 3
    assert discrete.bias_tensor.shape == (64, 3) and discrete.bias_tensor.strides == (2, 128)
    r1, r2 = R.grouped_gemm_quant(**dense.kwargs()), R.grouped_gemm_quant(**discrete.kwargs())
    assert np.array_equal(r1["d_tensor"], r2["d_tensor"])


def test_problem_arrays_are_read_only_and_options_pass_through():
    p = small("grouped_gemm_srelu", tanh_clamp_scale=8.0, discrete_col_sfd=True)
    with pytest.raises(ValueError):
        p.a_tensor[0, 0, 0] = 1
    assert p.kwargs()["tanh_clamp_scale"] == 8.0 and p.kwargs(d_dtype="float16")["d_dtype"] == "float16"
    with pytest.raises(TypeError):
        p.options["x"] = 1
    assert p.num_experts == 3 and p.valid_m == int(p.padded_offsets[-1])


def test_expert_count_limits():
    one = make_grouped_problem("grouped_gemm", num_experts=1, tokens=100, n=16, k=16)
    assert one.padded_offsets.tolist() == [256]
    many = make_grouped_problem("grouped_gemm_quant", num_experts=1024, tokens=2048, n=32, k=32, skew="skewed")
    assert many.padded_offsets.shape == (1024,) and many.sfb_tensor.shape[-1] == 1024
    with pytest.raises(ValueError, match=r"^num_experts=1025 exceeds the maximum 1024$"):
        make_grouped_problem("grouped_gemm", num_experts=1025, tokens=10, n=16, k=16)
    with pytest.raises(ValueError, match=r"^num_experts=0 must be an int >= 1$"):
        make_grouped_problem("grouped_gemm", num_experts=0, tokens=10, n=16, k=16)


def test_grouped_problem_errors():
    with pytest.raises(ValueError, match=r"^op='gemm' is not supported; allowed: 'grouped_gemm'"):
        make_grouped_problem("gemm", num_experts=2, tokens=10, n=16, k=16)
    with pytest.raises(ValueError, match=r"^tokens as a per-expert list needs len\(tokens\) == num_experts \(2\)"):
        make_grouped_problem("grouped_gemm", num_experts=2, tokens=[1, 2, 3], n=16, k=16)
    with pytest.raises(ValueError, match=r"^grouped_gemm_dswiglu needs n % 32 == 0"):
        make_grouped_problem("grouped_gemm_dswiglu", num_experts=2, tokens=10, n=48, k=32)
    with pytest.raises(ValueError, match=r"^ab_dtype \(grouped_gemm\)='float8_e4m3fn' is not supported; allowed: bfloat16$"):
        make_grouped_problem("grouped_gemm", num_experts=2, tokens=10, n=16, k=16, ab_dtype="float8_e4m3fn")
    with pytest.raises(ValueError, match=r"^sf_vec_size=16 is not allowed with ab_dtype='float8_e4m3fn'"):
        make_grouped_problem("grouped_gemm_quant", num_experts=2, tokens=10, n=16, k=32, sf_vec_size=16)
    with pytest.raises(ValueError, match=r"^values='random' is not supported; allowed: 'nvidia', 'realistic', 'integer'$"):
        make_grouped_problem("grouped_gemm", num_experts=2, tokens=10, n=16, k=16, values="random")


def test_batched_problem_layouts_and_reference():
    k_major = make_batched_problem(m=200, n=72, k=64, batch=2, seed=3)
    m_major = make_batched_problem(m=200, n=72, k=64, batch=2, seed=3, a_major="m")
    assert isinstance(k_major, BatchedProblem) and k_major.a_tensor.shape == (200, 64, 2)
    assert k_major.a_tensor.strides == (64, 1, 200 * 64) and m_major.a_tensor.strides == (1, 200, 200 * 64)
    assert k_major.sfa_tensor.shape == (32, 4, 2, 4, 1, 2)
    c1, amax1 = R.gemm_amax(**k_major.kwargs())
    c2, amax2 = R.gemm_amax(**m_major.kwargs())
    assert np.array_equal(c1, c2) and amax1[0, 0, 0] == np.abs(c1).max()
    canon = make_batched_problem(m=200, n=72, k=64, seed=3, layout="canonical", ab_dtype="float4_e2m1fn_x2")
    assert canon.a_tensor.shape == (200, 32) and canon.sf_vec_size == 16
    c, _ = R.gemm_amax(**canon.kwargs(c_dtype="bfloat16"))
    assert c.shape == (200, 72)
    with pytest.raises(ValueError, match=r"^a_major='m' needs FP8 A/B"):
        make_batched_problem(m=128, n=128, k=64, ab_dtype="float4_e2m1fn_x2", a_major="m")
    with pytest.raises(ValueError, match=r"^layout='canonical' \(2-D A/B\) needs batch=1; got batch=2$"):
        make_batched_problem(m=128, n=128, k=64, batch=2, layout="canonical")


def test_integer_values_make_exact_sums():
    """values="integer": A and B hold integers in [-2, 2], so the float32 and float64 references
    agree bit for bit (the GPU tests compare kernels to them exactly)."""
    from fusegemm import reference
    pb = make_grouped_problem("grouped_gemm_quant", num_experts=2, tokens=[256, 100], n=128, k=256,
                              values="integer", d_dtype="float8_e4m3fn", seed=3)
    a = np.asarray(pb.a_tensor).astype(np.float32)
    assert np.array_equal(a, np.rint(a)) and np.abs(a).max() <= 2
    r32 = reference.grouped_gemm_quant(**pb.kwargs(sf_vec_size=32))
    r64 = reference.grouped_gemm_quant(**pb.kwargs(sf_vec_size=32, acc_dtype="float64"))
    for key in ("d_tensor", "sfd_row_tensor", "sfd_col_tensor"):   # quantized bytes: equal
        assert np.array_equal(np.asarray(r32[key]).view(np.uint8), np.asarray(r64[key]).view(np.uint8)), key
