"""Bad input to the block-scaled seed wrappers (srelu, quant, dswiglu) on CPU tensors.

Each case starts from a valid call (a seeded problem's arguments as CPU torch tensors, which the
wrappers validate completely and then refuse at the device check) and breaks one thing; the
wrapper must raise an ArgumentError / UnsupportedError / SpecError naming that argument before
anything is compiled or launched. The unbroken call must reach the device check.
"""
from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.base.errors import FusegemmError  # noqa: E402
from fusegemm.problems import make_grouped_problem  # noqa: E402

FAMILIES = ("grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu")
_BYTES = ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")


def _cpu(x):
    if not isinstance(x, np.ndarray):
        return x
    name = x.dtype.name
    if name in _BYTES:
        return torch.from_numpy(np.array(x.view(np.uint8))).view(getattr(torch, name))
    if name == "bfloat16":
        return torch.from_numpy(np.array(x.view(np.uint16))).view(torch.bfloat16)
    return torch.from_numpy(np.array(x))


def base(family, **over):
    pb = make_grouped_problem(family, num_experts=3, tokens=[256, 0, 300], n=256, k=256,
                              d_dtype="float8_e4m3fn", seed=0)
    kw = {k: _cpu(v) for k, v in pb.kwargs(sf_vec_size=32).items()}
    kw.update(over)
    return kw


def call(family, kw):
    return getattr(fusegemm, family)(**kw)


def test_valid_call_reaches_the_device_check():
    for family in FAMILIES:
        with pytest.raises(FusegemmError, match=r"^a_tensor\.device: got cpu; allowed: a CUDA device"):
            call(family, base(family))


def _set(**changes):
    return lambda kw: kw.update({k: (v(kw) if callable(v) else v) for k, v in changes.items()})


def _sf_with_extra_atom(name, axis):
    """A scale view with one more 512-byte atom along ``axis`` of the kernel-facing view."""
    def mutate(kw):
        v = kw[name]
        shape = list(v.shape)
        shape[axis] += 1
        phys_shape = [shape[i] for i in (5, 2, 4, 0, 1, 3)]
        kw[name] = torch.zeros(phys_shape, dtype=torch.uint8).view(v.dtype).permute(3, 4, 1, 5, 2, 0)
    return mutate


def _non_dense_sfa(kw):
    v = kw["sfa_tensor"]
    kw["sfa_tensor"] = v.contiguous()  # same shape, C-contiguous view strides: not the atom layout


def _b_not_k_major(kw):
    b = kw["b_tensor"]                     # (N, K, L) view; make K strided
    kw["b_tensor"] = b.permute(2, 0, 1).contiguous().permute(1, 2, 0).transpose(0, 1).contiguous().transpose(0, 1)


def _a_not_k_major(kw):
    a = kw["a_tensor"][:, :, 0]
    kw["a_tensor"] = a.t().contiguous().t().unsqueeze(-1)


# (families, id, mutation, message regex). "*": all three.
ALL = FAMILIES
SR, QU, DS = ("grouped_gemm_srelu",), ("grouped_gemm_quant",), ("grouped_gemm_dswiglu",)
CASES = [
    (ALL, "a_bf16", _set(a_tensor=lambda kw: kw["a_tensor"].to(torch.bfloat16)), r"^a_tensor\.dtype: got bfloat16"),
    (ALL, "a_4d", _set(a_tensor=lambda kw: kw["a_tensor"].unsqueeze(-1)), r"^a_tensor\.shape: got"),
    (ALL, "a_batch_2", _set(a_tensor=lambda kw: kw["a_tensor"].expand(-1, -1, 2)), r"^a_tensor\.shape: got"),
    (ALL, "a_rows_not_256", _set(a_tensor=lambda kw: kw["a_tensor"][:700]), r"^a_tensor\.shape\[0\]: got 700"),
    (ALL, "a_not_k_major", _a_not_k_major, r"^a_tensor\.stride: got"),
    (ALL, "k_not_16", _set(a_tensor=lambda kw: kw["a_tensor"][:, :24]), r"^a_tensor\.shape\[1\] \(K bytes\): got 24"),
    (ALL, "b_other_fp8", _set(b_tensor=lambda kw: kw["b_tensor"].view(torch.float8_e5m2)), r"^b_tensor\.dtype: got float8_e5m2"),
    (ALL, "b_wrong_k", _set(b_tensor=lambda kw: kw["b_tensor"][:, :128]), r"^b_tensor\.shape: got \(256, 128, 3\)"),
    (ALL, "b_wrong_l", _set(b_tensor=lambda kw: kw["b_tensor"][:, :, :2]), r"^b_tensor\.shape: got \(256, 256, 2\)"),
    (ALL, "b_2d", _set(b_tensor=lambda kw: kw["b_tensor"][:, :, 0]), r"^b_tensor\.shape: got \(256, 256\)"),
    (ALL, "b_not_k_major", _b_not_k_major, r"^b_tensor\.stride: got"),
    (ALL, "sfa_missing", _set(sfa_tensor=None), r"^sfa_tensor: got None"),
    (ALL, "sfa_float32", _set(sfa_tensor=lambda kw: kw["sfa_tensor"].float()), r"^sfa_tensor\.dtype: got float32"),
    (ALL, "sfa_extra_m_atom", _sf_with_extra_atom("sfa_tensor", 2), r"^sfa_tensor\.shape: got \(32, 4, 7, 4, 2, 1\)"),
    (ALL, "sfa_extra_k_atom", _sf_with_extra_atom("sfa_tensor", 4), r"^sfa_tensor\.shape: got \(32, 4, 6, 4, 3, 1\)"),
    (ALL, "sfa_not_atom_layout", _non_dense_sfa, r"^sfa_tensor\.stride: got"),
    (ALL, "sfa_flat_wrong_size", _set(sfa_tensor=lambda kw: torch.zeros(1000, dtype=torch.uint8)), r"^sfa_tensor\.shape: got \(1000,\)"),
    (ALL, "sfb_extra_n_atom", _sf_with_extra_atom("sfb_tensor", 2), r"^sfb_tensor\.shape: got \(32, 4, 3, 4, 2, 3\)"),
    (ALL, "sfb_extra_l", _sf_with_extra_atom("sfb_tensor", 5), r"^sfb_tensor\.shape: got \(32, 4, 2, 4, 2, 4\)"),
    (ALL, "sfb_e4m3_scales", _set(sfb_tensor=lambda kw: kw["sfb_tensor"].view(torch.float8_e4m3fn)), r"^sfb_tensor\.dtype: got float8_e4m3fn"),
    (ALL, "sfb_missing", _set(sfb_tensor=None), r"^sfb_tensor: got None"),
    (ALL, "offsets_int64", _set(padded_offsets=lambda kw: kw["padded_offsets"].long()), r"^padded_offsets\.dtype: got int64"),
    (ALL, "offsets_2d", _set(padded_offsets=lambda kw: kw["padded_offsets"][None]), r"^padded_offsets\.shape: got \(1, 3\)"),
    (ALL, "offsets_too_many", _set(padded_offsets=torch.zeros(1025, dtype=torch.int32)), r"^padded_offsets\.shape: got \(1025,\)"),
    (ALL, "offsets_vs_b", _set(padded_offsets=lambda kw: kw["padded_offsets"][:2]), r"^b_tensor\.shape: got \(256, 256, 3\)"),
    (ALL, "alpha_short", _set(alpha_tensor=lambda kw: kw["alpha_tensor"][:2]), r"^alpha_tensor\.shape: got \(2,\)"),
    (ALL, "alpha_fp16", _set(alpha_tensor=lambda kw: kw["alpha_tensor"].half()), r"^alpha_tensor\.dtype: got float16"),
    (ALL, "alpha_missing", _set(alpha_tensor=None), r"^alpha_tensor: got None"),
    (ALL, "prob_short", _set(prob_tensor=lambda kw: kw["prob_tensor"][:256]), r"^prob_tensor\.shape: got \(256, 1, 1\)"),
    (ALL, "prob_2wide", _set(prob_tensor=lambda kw: kw["prob_tensor"].expand(-1, 2, 1)), r"^prob_tensor\.shape: got"),
    (ALL, "prob_int", _set(prob_tensor=lambda kw: kw["prob_tensor"].int()), r"^prob_tensor\.dtype: got int32"),
    (ALL, "norm_const_missing", _set(norm_const_tensor=None), r"^norm_const_tensor: got None"),
    (ALL, "norm_const_two", _set(norm_const_tensor=torch.ones(2)), r"^norm_const_tensor\.shape: got \(2,\)"),
    (ALL, "norm_const_f16", _set(norm_const_tensor=torch.ones(1, dtype=torch.float16)), r"^norm_const_tensor\.dtype: got float16"),
    (ALL, "sf_vec_16_fp8", _set(sf_vec_size=16), r"sf_vec_size"),
    (ALL, "sf_vec_64", _set(sf_vec_size=64), r"^sf_vec_size: got 64"),
    (ALL, "sf_vec_bool", _set(sf_vec_size=True), r"^sf_vec_size: got True"),
    (ALL, "acc_fp16", _set(acc_dtype=torch.float16), r"^acc_dtype: got"),
    (ALL, "cd_major_m", _set(cd_major="m"), r"^cd_major: got 'm'"),
    (ALL, "m_aligned_128", _set(m_aligned=128), r"^m_aligned: got 128"),
    (ALL, "vector_f32_str", _set(vector_f32="yes"), r"^vector_f32: got 'yes'; allowed: True or False$"),
    (ALL, "vector_f32_int", _set(vector_f32=1), r"^vector_f32: got 1"),
    (ALL, "tiler_triple", _set(mma_tiler_mn=(1, 2, 3)), r"^mma_tiler_mn: got"),
    (ALL, "tiler_m100", _set(mma_tiler_mn=(100, 256)), r"tile_m"),
    (ALL, "tiler_n512", _set(mma_tiler_mn=(256, 512)), r"tile_n"),
    (ALL, "cluster_str", _set(cluster_shape_mn="x"), r"^cluster_shape_mn: got 'x'"),
    (ALL, "cluster_3", _set(cluster_shape_mn=(3, 1)), r"cluster_m"),
    (ALL, "discrete_col_sfd_str", _set(discrete_col_sfd="yes"), r"^discrete_col_sfd: got 'yes'"),
    (ALL, "rcp_max_bad", _set(e5m2_rcp_max="both"), r"^e5m2_rcp_max: got 'both'"),
    (ALL, "d_int8", _set(d_dtype=torch.int8), r"^d_dtype: got"),
    (ALL, "d_float64", _set(d_dtype="float64"), r"^d_dtype: got 'float64'"),
    (ALL, "a_int8", _set(a_tensor=lambda kw: kw["a_tensor"].view(torch.int8)), r"^a_tensor\.dtype: got int8"),
    (ALL, "a_fp4_with_fp8_b", _set(a_tensor=lambda kw: kw["a_tensor"].view(torch.uint8)), r"d_dtype='float8_e4m3fn' but FP4 inputs"),
    (ALL, "n_not_8", _set(b_tensor=lambda kw: kw["b_tensor"][:100]), r"^n \(N\): got 100"),
    (ALL, "n_128_sfb_for_256", _set(b_tensor=lambda kw: kw["b_tensor"][:128]), r"^sfb_tensor\.shape: got \(32, 4, 2, 4, 2, 3\)"),
    # srelu and quant: options of theirs
    (SR + QU, "b_and_ptrs", _set(b_ptrs=torch.zeros(3, dtype=torch.int64)), r"^b_tensor/b_ptrs: got both"),
    (SR, "ptrs_without_sfb_ptrs", lambda kw: (kw.pop("b_tensor"), kw.pop("sfb_tensor"),
                                                  kw.update(b_ptrs=torch.zeros(3, dtype=torch.int64), n=256)),
     r"^sfb_ptrs: got None"),
    (SR, "ptrs_without_n", lambda kw: (kw.pop("b_tensor"), kw.pop("sfb_tensor"),
                                           kw.update(b_ptrs=torch.zeros(3, dtype=torch.int64),
                                                     sfb_ptrs=torch.zeros(3, dtype=torch.int64))), r"^n: got None"),
    (SR, "ptrs_short", lambda kw: (kw.pop("b_tensor"), kw.pop("sfb_tensor"),
                                       kw.update(b_ptrs=torch.zeros(2, dtype=torch.int64),
                                                 sfb_ptrs=torch.zeros(3, dtype=torch.int64), n=256)),
     r"^b_ptrs\.shape: got \(2,\)"),
    (SR, "ptrs_float", lambda kw: (kw.pop("b_tensor"), kw.pop("sfb_tensor"),
                                       kw.update(b_ptrs=torch.zeros(3), sfb_ptrs=torch.zeros(3, dtype=torch.int64),
                                                 n=256)), r"^b_ptrs\.dtype: got float32"),
    (SR, "ptrs_with_sfb_tensor", lambda kw: (kw.pop("b_tensor"),
                                                 kw.update(b_ptrs=torch.zeros(3, dtype=torch.int64),
                                                           sfb_ptrs=torch.zeros(3, dtype=torch.int64), n=256)),
     r"^sfb_tensor: got a tensor"),
    (QU, "discrete_weights", lambda kw: (kw.pop("b_tensor"), kw.pop("sfb_tensor"),
                                        kw.update(b_ptrs=torch.zeros(3, dtype=torch.int64),
                                                  sfb_ptrs=torch.zeros(3, dtype=torch.int64), n=256)),
     r"^weight_mode: got 'discrete'; spec grouped_gemm_quant allows: dense"),
    (SR + QU, "b_dtype_mismatch", _set(b_dtype=torch.float8_e5m2), r"^b_dtype: got"),
    (SR + QU, "b_major_x", _set(b_major="x"), r"^b_major: got 'x'"),
    (SR + QU, "dynamic_str", _set(use_dynamic_sched="no"), r"^use_dynamic_sched: got 'no'"),
    (SR + QU, "bias_wrong_shape", _set(bias_tensor=torch.zeros(256, 2, dtype=torch.bfloat16)), r"^bias_tensor\.shape: got \(256, 2\)"),
    (SR + QU, "bias_float64", _set(bias_tensor=torch.zeros(256, 3, dtype=torch.float64)), r"bias_dtype"),
    (SR, "c_int32", _set(c_dtype=torch.int32), r"^c_dtype: got"),
    (SR, "clamp_negative", _set(tanh_clamp_scale=-1.0), r"^tanh_clamp_scale: got -1\.0"),
    (SR, "clamp_nan", _set(tanh_clamp_scale=float("nan")), r"^tanh_clamp_scale: got nan"),
    (SR, "clamp_bool", _set(tanh_clamp_scale=True), r"^tanh_clamp_scale: got True"),
    (SR + DS, "prob_missing", _set(prob_tensor=None), r"^prob_tensor: got None"),
    (QU, "row_scale_short", _set(row_scale_tensor=torch.ones(10)), r"^row_scale_tensor\.shape: got \(10,\)"),
    (QU, "generate_amax_str", _set(generate_amax="x"), r"^generate_amax: got 'x'"),
    (DS, "epilogue_op_gelu", _set(epilogue_op="gelu"), r"^epilogue_op: got 'gelu'"),
    (DS, "c_missing", _set(c_tensor=None), r"^c_tensor: got None"),
    (DS, "c_narrow", _set(c_tensor=lambda kw: kw["c_tensor"][:, :256]), r"^c_tensor\.shape: got \(768, 256, 1\)"),
    (DS, "c_int", _set(c_tensor=lambda kw: kw["c_tensor"].view(torch.int16)), r"c_dtype|c_tensor\.dtype"),
    (DS, "beta_short", _set(beta_tensor=torch.ones(2)), r"^beta_tensor\.shape: got \(2,\)"),
    (DS, "b_missing", _set(b_tensor=None), r"^b_tensor: got None"),
    (DS, "d_bf16_with_fp8", _set(d_dtype=torch.bfloat16), r"d_dtype"),
]

PARAMS = [pytest.param(fam, mutate, pattern, id=f"{fam.split('_')[-1]}-{cid}")
          for fams, cid, mutate, pattern in CASES for fam in fams]


@pytest.mark.parametrize("family,mutate,pattern", PARAMS)
def test_bad_input_is_refused_before_launch(family, mutate, pattern):
    kw = base(family)
    mutate(kw)
    with pytest.raises(FusegemmError) as info:
        call(family, kw)
    msg = str(info.value)
    assert re.search(pattern, msg), msg
    assert "a_tensor.device" not in msg or "device" in pattern, msg


def test_compat_names_are_ours():
    from fusegemm import compat
    for family in FAMILIES:
        assert getattr(compat, f"{family}_wrapper_sm100") is getattr(fusegemm, family)
        with pytest.raises(FusegemmError, match=r"^a_tensor\.device: got cpu"):
            getattr(compat, f"{family}_wrapper_sm100")(**base(family))


# ---- seed 004: gemm_amax -----------------------------------------------------------------
def amax_base():
    from fusegemm.problems import make_batched_problem
    pb = make_batched_problem(m=200, n=256, k=256, batch=2, seed=0)
    return {k: _cpu(v) for k, v in pb.kwargs().items()}


def _amax_sf(name, axis):
    return _sf_with_extra_atom(name, axis)


def _strided_k(name):
    def mutate(kw):
        x = kw[name]                              # (rows, K, L) with K contiguous
        kw[name] = x.permute(2, 0, 1).contiguous().permute(1, 2, 0).transpose(0, 1).contiguous().transpose(0, 1)
    return mutate


AMAX_CASES = [
    ("a_bf16", _set(a_tensor=lambda kw: kw["a_tensor"].to(torch.bfloat16)), r"^a_tensor\.dtype: got bfloat16"),
    ("a_fp16", _set(a_tensor=lambda kw: kw["a_tensor"].to(torch.float16)), r"^a_tensor\.dtype: got float16"),
    ("a_fp32", _set(a_tensor=lambda kw: kw["a_tensor"].float()), r"^a_tensor\.dtype: got float32"),
    ("a_int8", _set(a_tensor=lambda kw: kw["a_tensor"].view(torch.int8)), r"^a_tensor\.dtype: got int8"),
    ("a_4d", _set(a_tensor=lambda kw: kw["a_tensor"].unsqueeze(-1)), r"^a_tensor\.shape: got"),
    ("a_1d", _set(a_tensor=lambda kw: kw["a_tensor"].reshape(-1)), r"^a_tensor\.shape: got"),
    ("a_missing", _set(a_tensor=None), r"^a_tensor: got None"),
    ("a_not_k_major", _strided_k("a_tensor"), r"^a_tensor\.stride: got"),
    ("k_not_16", _set(a_tensor=lambda kw: kw["a_tensor"][:, :24]), r"^a_tensor\.shape\[1\] \(K bytes\): got 24"),
    ("a_fp4_vs_fp8_b", _set(a_tensor=lambda kw: kw["a_tensor"].view(torch.uint8)), r"c_dtype|b_tensor\.dtype"),
    ("b_other_fp8", _set(b_tensor=lambda kw: kw["b_tensor"].view(torch.float8_e5m2)), r"^b_tensor\.dtype: got float8_e5m2"),
    ("b_bf16", _set(b_tensor=lambda kw: kw["b_tensor"].to(torch.bfloat16)), r"^b_tensor\.dtype: got bfloat16"),
    ("b_int8", _set(b_tensor=lambda kw: kw["b_tensor"].view(torch.int8)), r"^b_tensor\.dtype: got int8"),
    ("b_wrong_k", _set(b_tensor=lambda kw: kw["b_tensor"][:, :128]), r"^b_tensor\.shape: got \(256, 128, 2\)"),
    ("b_wrong_l", _set(b_tensor=lambda kw: kw["b_tensor"][:, :, :1]), r"^b_tensor\.shape: got \(256, 256, 1\)"),
    ("b_2d_with_l2", _set(b_tensor=lambda kw: kw["b_tensor"][:, :, 0]), r"^b_tensor\.shape: got \(256, 256\)"),
    ("b_4d", _set(b_tensor=lambda kw: kw["b_tensor"].unsqueeze(-1)), r"^b_tensor\.shape: got"),
    ("b_missing", _set(b_tensor=None), r"^b_tensor: got None"),
    ("b_not_k_major", _strided_k("b_tensor"), r"^b_tensor\.stride: got"),
    ("n_not_8", _set(b_tensor=lambda kw: kw["b_tensor"][:100]), r"^b_tensor\.shape\[0\] \(N\): got 100"),
    ("n_128_vs_sfb", _set(b_tensor=lambda kw: kw["b_tensor"][:128]), r"^sfb_tensor\.shape: got \(32, 4, 2, 4, 2, 2\)"),
    ("sfa_missing", _set(sfa_tensor=None), r"^sfa_tensor: got None"),
    ("sfa_float32", _set(sfa_tensor=lambda kw: kw["sfa_tensor"].float()), r"^sfa_tensor\.dtype: got float32"),
    ("sfa_int16", _set(sfa_tensor=lambda kw: kw["sfa_tensor"].view(torch.uint8).to(torch.int16)), r"^sfa_tensor\.dtype: got int16"),
    ("sfa_extra_m_atom", _amax_sf("sfa_tensor", 2), r"^sfa_tensor\.shape: got \(32, 4, 3, 4, 2, 2\)"),
    ("sfa_extra_k_atom", _amax_sf("sfa_tensor", 4), r"^sfa_tensor\.shape: got \(32, 4, 2, 4, 3, 2\)"),
    ("sfa_extra_batch", _amax_sf("sfa_tensor", 5), r"^sfa_tensor\.shape: got \(32, 4, 2, 4, 2, 3\)"),
    ("sfa_5d", _set(sfa_tensor=lambda kw: kw["sfa_tensor"][..., 0]), r"^sfa_tensor\.shape: got"),
    ("sfa_not_atom_layout", _set(sfa_tensor=lambda kw: kw["sfa_tensor"].contiguous()), r"^sfa_tensor\.stride: got"),
    ("sfa_flat_wrong_size", _set(sfa_tensor=torch.zeros(1000, dtype=torch.uint8)), r"^sfa_tensor\.shape: got \(1000,\)"),
    ("sfb_missing", _set(sfb_tensor=None), r"^sfb_tensor: got None"),
    ("sfb_fp16", _set(sfb_tensor=lambda kw: kw["sfb_tensor"].view(torch.uint8).half()), r"^sfb_tensor\.dtype: got float16"),
    ("sfb_e4m3", _set(sfb_tensor=lambda kw: kw["sfb_tensor"].view(torch.float8_e4m3fn)), r"^sfb_tensor\.dtype: got float8_e4m3fn"),
    ("sfb_extra_n_atom", _amax_sf("sfb_tensor", 2), r"^sfb_tensor\.shape: got \(32, 4, 3, 4, 2, 2\)"),
    ("sfb_extra_batch", _amax_sf("sfb_tensor", 5), r"^sfb_tensor\.shape: got \(32, 4, 2, 4, 2, 3\)"),
    ("sfb_2d", _set(sfb_tensor=lambda kw: kw["sfb_tensor"].reshape(64, -1)), r"^sfb_tensor\.shape: got"),
    ("sfb_not_atom_layout", _set(sfb_tensor=lambda kw: kw["sfb_tensor"].contiguous()), r"^sfb_tensor\.stride: got"),
    ("c_major_x", _set(c_major="x"), r"^c_major: got 'x'"),
    ("c_major_none", _set(c_major=None), r"^c_major: got None"),
    ("c_int32", _set(c_dtype=torch.int32), r"^c_dtype: got"),
    ("c_float64", _set(c_dtype="float64"), r"^c_dtype: got 'float64'"),
    ("c_name_typo", _set(c_dtype="e4m3"), r"^c_dtype: got 'e4m3'"),
    ("c_none", _set(c_dtype=None), r"^c_dtype: got None"),
    ("c_fp8_with_fp8_ab", _set(c_dtype=torch.float8_e4m3fn), r"c_dtype"),
    ("c_fp4_with_fp8_ab", _set(c_dtype="float4_e2m1fn_x2"), r"c_dtype"),
    ("acc_fp16", _set(acc_dtype=torch.float16), r"^acc_dtype: got"),
    ("acc_bf16", _set(acc_dtype="bfloat16"), r"^acc_dtype: got 'bfloat16'"),
    ("acc_float64", _set(acc_dtype="float64"), r"^acc_dtype: got 'float64'"),
    ("tiler_triple", _set(mma_tiler_mn=(1, 2, 3)), r"^mma_tiler_mn: got"),
    ("tiler_str", _set(mma_tiler_mn="128x128"), r"^mma_tiler_mn: got '128x128'"),
    ("tiler_m256", _set(mma_tiler_mn=(256, 128)), r"tile_m"),
    ("tiler_n64", _set(mma_tiler_mn=(128, 64)), r"tile_n"),
    ("tiler_n512", _set(mma_tiler_mn=(128, 512)), r"tile_n"),
    ("cluster_str", _set(cluster_shape_mn="x"), r"^cluster_shape_mn: got 'x'"),
    ("cluster_3", _set(cluster_shape_mn=(3, 1)), r"cluster_m"),
    ("cluster_n3", _set(cluster_shape_mn=(1, 3)), r"cluster_n"),
    ("cluster_0", _set(cluster_shape_mn=(0, 1)), r"cluster_m"),
    ("cluster_8", _set(cluster_shape_mn=(8, 1)), r"cluster_m"),
    ("sf_vec_16_fp8", _set(sf_vec_size=16), r"sf_vec_size"),
    ("sf_vec_64", _set(sf_vec_size=64), r"^sf_vec_size: got 64"),
    ("sf_vec_bool", _set(sf_vec_size=True), r"^sf_vec_size: got True"),
    ("sf_vec_str", _set(sf_vec_size="32"), r"^sf_vec_size: got '32'"),
]


def test_gemm_amax_valid_call_reaches_the_device_check():
    with pytest.raises(FusegemmError, match=r"^a_tensor\.device: got cpu; allowed: a CUDA device"):
        fusegemm.gemm_amax(**amax_base())


# Parameters of gemm_amax no call on CPU tensors can get wrong, each with the reason (checked to
# be parameters still).
AMAX_NOT_HERE = {"stream": "read at launch, after the device check every CPU call stops at"}
_ABSENT = object()


def _broken(mutate) -> set[str]:
    """The arguments a case's mutation changes (replaced, added or set to None)."""
    kw = amax_base()
    before = dict(kw)
    mutate(kw)
    return {k for k in kw.keys() | before.keys() if kw.get(k, _ABSENT) is not before.get(k, _ABSENT)}


def test_gemm_amax_cases_break_every_parameter():
    """Every parameter of fusegemm.gemm_amax (its signature, not a count) is broken by at least
    one case below; a parameter added to the wrapper without a case fails here."""
    params = set(inspect.signature(fusegemm.gemm_amax).parameters)
    assert set(AMAX_NOT_HERE) <= params
    broken = set().union(*(_broken(mutate) for _, mutate, _ in AMAX_CASES))
    assert sorted(params - broken - set(AMAX_NOT_HERE)) == []
    assert len({case_id for case_id, _, _ in AMAX_CASES}) == len(AMAX_CASES)


@pytest.mark.parametrize("mutate,pattern", [pytest.param(m, p, id=i) for i, m, p in AMAX_CASES])
def test_gemm_amax_bad_input(mutate, pattern):
    kw = amax_base()
    mutate(kw)
    with pytest.raises(FusegemmError) as info:
        fusegemm.gemm_amax(**kw)
    msg = str(info.value)
    assert re.search(pattern, msg), msg
    assert "a_tensor.device" not in msg, msg


# ---- class APIs: outputs the caller passes ------------------------------------------------
def _class_call(over=None):
    """A GroupedGemmSrelu built from samples and executed with CPU outputs shaped as the wrapper
    returns them (FP8 D: d, d_col, sfd_row, sfd_col; bf16 C)."""
    kw = base("grouped_gemm_srelu")
    m, n = kw["a_tensor"].shape[0], kw["b_tensor"].shape[0]
    sfd_row = torch.zeros(1, m // 128, 2, 32, 4, 4, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    sfd_col = torch.zeros(1, n // 128, (m // 32 + 3) // 4, 32, 4, 4, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    outs = dict(c_tensor=torch.zeros(m, n, 1, dtype=torch.bfloat16),
                d_tensor=torch.zeros(m, n, 1, dtype=torch.uint8).view(torch.float8_e4m3fn),
                d_col_tensor=torch.zeros(m, n, 1, dtype=torch.uint8).view(torch.float8_e4m3fn),
                sfd_row_tensor=sfd_row.permute(3, 4, 1, 5, 2, 0), sfd_col_tensor=sfd_col.permute(3, 4, 1, 5, 2, 0))
    outs.update(over or {})
    op = fusegemm.GroupedGemmSrelu(kw["a_tensor"], kw["b_tensor"], outs["c_tensor"], outs["d_tensor"],
                                   kw["sfa_tensor"], kw["sfb_tensor"], sf_vec_size=32)
    ins = {k: kw[k] for k in ("a_tensor", "b_tensor", "sfa_tensor", "sfb_tensor", "padded_offsets", "alpha_tensor",
                              "prob_tensor", "norm_const_tensor")}
    return op, ins, outs


def test_class_execute_reaches_the_device_check():
    op, ins, outs = _class_call()
    with pytest.raises(FusegemmError, match=r"^a_tensor\.device: got cpu"):
        op.execute(**ins, **outs)


CLASS_CASES = [
    ("c_missing", lambda o, i: o.update(c_tensor=None), r"^c_tensor: got None"),
    ("d_wrong_dtype", lambda o, i: o.update(d_tensor=torch.zeros_like(o["c_tensor"])), r"^d_tensor\.dtype: got bfloat16"),
    ("d_wrong_shape", lambda o, i: o.update(d_tensor=o["d_tensor"][:256]), r"^d_tensor\.shape: got \(256, 256, 1\)"),
    ("c_not_dense", lambda o, i: o.update(c_tensor=torch.zeros(256, 768, 1, dtype=torch.bfloat16).transpose(0, 1)),
     r"^c_tensor\.stride: got"),
    ("sfd_row_missing", lambda o, i: o.update(sfd_row_tensor=None), r"^sfd_row_tensor: got None"),
    ("sfd_col_wrong_atoms", lambda o, i: o.update(sfd_col_tensor=o["sfd_row_tensor"]), r"^sfd_col_tensor\.shape"),
    ("d_col_aliases_d", lambda o, i: o.update(d_col_tensor=o["d_tensor"]), r"^d_tensor: got memory shared with d_col_tensor"),
    ("d_aliases_a", lambda o, i: o.update(d_tensor=i["a_tensor"]), r"^d_tensor: got memory shared with an input"),
]


@pytest.mark.parametrize("mutate,pattern", [pytest.param(m, p, id=i) for i, m, p in CLASS_CASES])
def test_class_execute_checks_outputs(mutate, pattern):
    op, ins, outs = _class_call()
    mutate(outs, ins)
    with pytest.raises(FusegemmError) as info:
        op.execute(**ins, **outs)
    assert re.search(pattern, str(info.value)), str(info.value)


def test_class_compat_names():
    from fusegemm import compat
    assert compat.GroupedGemmSreluSm100 is fusegemm.GroupedGemmSrelu
    assert compat.GroupedGemmQuantSm100 is fusegemm.GroupedGemmQuant
    assert compat.GroupedGemmDswigluSm100 is fusegemm.GroupedGemmDswiglu


def _amax_class(c=None, sample_c=None):
    kw = amax_base()
    m, n, l = kw["a_tensor"].shape[0], kw["b_tensor"].shape[0], kw["a_tensor"].shape[2]
    c = c if c is not None else torch.zeros(l, m, n).permute(1, 2, 0)          # (M, N, L), N-major
    op = fusegemm.GemmAmax(kw["a_tensor"], kw["b_tensor"], kw["sfa_tensor"], kw["sfb_tensor"],
                           sample_c if sample_c is not None else c)
    return op, kw, c


def test_gemm_amax_class_reaches_the_device_check():
    op, kw, c = _amax_class()
    with pytest.raises(FusegemmError, match=r"^a_tensor\.device: got cpu"):
        op.execute(kw["a_tensor"], kw["b_tensor"], kw["sfa_tensor"], kw["sfb_tensor"], c, torch.zeros(1, 1, 1))
    # an M-major sample makes an M-major op: its C must be M-contiguous too
    m_major = torch.zeros(2, 256, 200).permute(2, 1, 0)
    op_m, kw, _ = _amax_class(c=m_major)
    assert op_m.op.variant.cd_major == "m"
    with pytest.raises(FusegemmError, match=r"^a_tensor\.device: got cpu"):
        op_m.execute(kw["a_tensor"], kw["b_tensor"], kw["sfa_tensor"], kw["sfb_tensor"], m_major, torch.zeros(1))


AMAX_CLASS_CASES = [
    ("c_missing", lambda c, kw: (None, torch.zeros(1, 1, 1)), r"^c_tensor: got None"),
    ("c_wrong_shape", lambda c, kw: (c[:100], torch.zeros(1, 1, 1)), r"^c_tensor\.shape: got \(100, 256, 2\)"),
    ("c_wrong_dtype", lambda c, kw: (c.to(torch.bfloat16), torch.zeros(1, 1, 1)), r"^c_tensor\.dtype: got bfloat16"),
    ("c_m_major_for_n_op", lambda c, kw: (torch.zeros(2, 256, 200).permute(2, 1, 0), torch.zeros(1, 1, 1)),
     r"^c_tensor\.stride: got"),
    ("amax_two", lambda c, kw: (c, torch.zeros(2)), r"^amax_tensor\.shape: got \(2,\)"),
    ("amax_fp16", lambda c, kw: (c, torch.zeros(1, dtype=torch.float16)), r"^amax_tensor\.dtype: got float16"),
    ("amax_in_c", lambda c, kw: (c, c.permute(2, 0, 1).reshape(-1)[:1]), r"^amax_tensor: got memory shared with c_tensor"),
    ("c_aliases_a", "alias", r"^c_tensor: got memory shared with an input"),
]


@pytest.mark.parametrize("outputs,pattern", [pytest.param(f, p, id=i) for i, f, p in AMAX_CLASS_CASES])
def test_gemm_amax_class_checks_outputs(outputs, pattern):
    op, kw, c = _amax_class()
    if outputs == "alias":   # A is the first bytes of the buffer C is written into
        big = torch.zeros(4 * 200 * 256 * 2, dtype=torch.uint8)
        kw["a_tensor"] = big[: 200 * 256 * 2].view(2, 200, 256).permute(1, 2, 0).view(torch.float8_e4m3fn)
        c_out, amax = big.view(torch.float32).view(2, 200, 256).permute(1, 2, 0), torch.zeros(1)
    else:
        c_out, amax = outputs(c, kw)
    with pytest.raises(FusegemmError) as info:
        op.execute(kw["a_tensor"], kw["b_tensor"], kw["sfa_tensor"], kw["sfb_tensor"], c_out, amax)
    assert re.search(pattern, str(info.value)), str(info.value)
    assert "a_tensor.device" not in str(info.value)


def test_gemm_amax_class_compat_name():
    from fusegemm import compat
    assert compat.GemmAmaxSm100 is fusegemm.GemmAmax


def test_dswiglu_takes_a_bfloat16_prob():
    """Seed 000 allows float32 or bfloat16 prob: bf16 selects its own variant (prob_dtype) and the
    call validates through to the device check; other dtypes are refused by name."""
    kw = base("grouped_gemm_dswiglu")
    kw["prob_tensor"] = kw["prob_tensor"].to(torch.bfloat16)
    with pytest.raises(FusegemmError, match=r"^a_tensor\.device: got cpu"):
        fusegemm.grouped_gemm_dswiglu(**kw)
    kw["prob_tensor"] = kw["prob_tensor"].half()
    with pytest.raises(FusegemmError, match=r"^prob_tensor\.dtype: got float16; allowed: float32, bfloat16"):
        fusegemm.grouped_gemm_dswiglu(**kw)
