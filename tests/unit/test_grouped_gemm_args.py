"""Invalid arguments of seed 001 raise ArgumentError/UnsupportedError naming the argument,
before anything is compiled or launched. Runs on CPU tensors: shape/stride/dtype checks come
before device checks; the cases that need to get past the device checks mock them."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import fusegemm.ops.arg_checks as checks  # noqa: E402
import fusegemm.ops.device as device  # noqa: E402
import fusegemm.ops.engine as engine_mod  # noqa: E402
import fusegemm.runtime.launch as launch_mod  # noqa: E402
from fusegemm.compat import GroupedGemmSm100, grouped_gemm_wrapper_sm100  # noqa: E402
from fusegemm.presets import GroupedGemm, grouped_gemm  # noqa: E402
from fusegemm.base.errors import ArgumentError, UnsupportedError  # noqa: E402

M, K, N, L = 512, 64, 128, 2
BF, F16, F32, I32, I64 = torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched")
    monkeypatch.setattr(launch_mod, "launch", boom)
    monkeypatch.setattr(device, "device_arch", lambda d: (_ for _ in ()).throw(
        AssertionError("CUDA was queried")))


@pytest.fixture
def fake_cuda(monkeypatch):
    """Treat CPU tensors as device 0 (for the checks that come after device checks)."""
    monkeypatch.setattr(checks, "require_cuda", lambda v, n: 0)
    monkeypatch.setattr(checks, "same_device", lambda views, dev: None)


def base(**over):
    a = torch.zeros(M, K, 1, dtype=BF)
    kw = dict(a_tensor=a, padded_offsets=torch.tensor([256, 512], dtype=I32),
              alpha_tensor=torch.ones(L), b_tensor=torch.zeros(L, N, K, dtype=BF).permute(1, 2, 0),
              bias_tensor=None, prob_tensor=torch.ones(M, 1, 1))
    kw.update(over)
    return kw


def discrete(**over):
    kw = base(b_tensor=None, b_ptrs=torch.zeros(L, dtype=I64), n=N)
    kw.update(over)
    return kw


# (id, kwargs, exception, message regex) for the wrapper; everything before device checks.
WRAPPER_CASES = [
    ("a_none", base(a_tensor=None), ArgumentError, r"^a_tensor: got None"),
    ("a_list", base(a_tensor=[1, 2]), ArgumentError, r"^a_tensor: got list"),
    ("a_1d", base(a_tensor=torch.zeros(M, dtype=BF)), ArgumentError, r"a_tensor.shape"),
    ("a_4d", base(a_tensor=torch.zeros(M, K, 1, 1, dtype=BF)), ArgumentError, r"a_tensor.shape"),
    ("a_trailing_2", base(a_tensor=torch.zeros(M, K, 2, dtype=BF)), ArgumentError,
     r"a_tensor.shape.*\(M, K, 1\)"),
    ("a_fp16", base(a_tensor=torch.zeros(M, K, 1, dtype=F16)), ArgumentError, r"a_tensor.dtype: got float16"),
    ("a_fp32", base(a_tensor=torch.zeros(M, K, 1, dtype=F32)), ArgumentError, r"a_tensor.dtype: got float32"),
    ("a_int8", base(a_tensor=torch.zeros(M, K, 1, dtype=torch.int8)), ArgumentError, r"a_tensor.dtype"),
    ("a_fp64", base(a_tensor=torch.zeros(M, K, 1, dtype=torch.float64)), ArgumentError, r"a_tensor.dtype"),
    ("a_m_major", base(a_tensor=torch.zeros(K, M, dtype=BF).t().unsqueeze(-1)), ArgumentError,
     r"a_tensor.stride.*K-major"),
    ("a_m_unaligned", base(a_tensor=torch.zeros(300, K, 1, dtype=BF)), ArgumentError,
     r"a_tensor.shape\[0\]: got 300; allowed: a multiple of 256"),
    ("a_m_100", base(a_tensor=torch.zeros(100, K, 1, dtype=BF)), ArgumentError, r"multiple of 256"),
    ("a_k_small", base(a_tensor=torch.zeros(M, 4, 1, dtype=BF)), ArgumentError, r"\(K\): got 4"),
    ("a_k_odd", base(a_tensor=torch.zeros(M, 66, 1, dtype=BF)), ArgumentError, r"\(K\): got 66"),
    ("a_k_zero", base(a_tensor=torch.zeros(M, 0, 1, dtype=BF)), ArgumentError, r"\(K\): got 0"),
    ("a_pitch", base(a_tensor=torch.zeros(M, 72, dtype=BF)[:, :64].unsqueeze(-1)
                     .as_strided((M, 64, 1), (68, 1, 1))), ArgumentError, r"a_tensor.stride\[0\]"),
    ("off_none", base(padded_offsets=None), ArgumentError, r"^padded_offsets: got None"),
    ("off_int64", base(padded_offsets=torch.tensor([256, 512], dtype=I64)), ArgumentError,
     r"padded_offsets.dtype: got int64; allowed: int32"),
    ("off_float", base(padded_offsets=torch.tensor([256.0, 512.0])), ArgumentError, r"padded_offsets.dtype"),
    ("off_2d", base(padded_offsets=torch.zeros(2, 1, dtype=I32)), ArgumentError, r"padded_offsets.shape"),
    ("off_empty", base(padded_offsets=torch.zeros(0, dtype=I32)), ArgumentError,
     r"padded_offsets.shape.*1 <= L <= 1024"),
    ("off_too_many", base(padded_offsets=torch.zeros(1025, dtype=I32)), ArgumentError, r"1 <= L <= 1024"),
    ("off_strided", base(padded_offsets=torch.zeros(4, dtype=I32)[::2]), ArgumentError,
     r"padded_offsets.stride"),
    ("alpha_none", base(alpha_tensor=None), ArgumentError, r"^alpha_tensor: got None"),
    ("alpha_len", base(alpha_tensor=torch.ones(3)), ArgumentError, r"alpha_tensor.shape.*\(2,\)"),
    ("alpha_bf16", base(alpha_tensor=torch.ones(L, dtype=BF)), ArgumentError, r"alpha_tensor.dtype"),
    ("alpha_fp64", base(alpha_tensor=torch.ones(L, dtype=torch.float64)), ArgumentError, r"alpha_tensor.dtype"),
    ("alpha_2x2", base(alpha_tensor=torch.ones(L, 2)), ArgumentError, r"alpha_tensor.shape"),
    ("alpha_strided", base(alpha_tensor=torch.ones(2 * L)[::2]), ArgumentError, r"alpha_tensor.stride"),
    ("alpha_4d", base(alpha_tensor=torch.ones(L, 1, 1, 1)), ArgumentError, r"alpha_tensor.shape"),
    ("b_and_ptrs", base(b_ptrs=torch.zeros(L, dtype=I64)), ArgumentError,
     r"b_tensor/b_ptrs: got both"),
    ("b_neither", base(b_tensor=None), ArgumentError, r"b_tensor/b_ptrs: got neither"),
    ("b_fp16", base(b_tensor=torch.zeros(L, N, K, dtype=F16).permute(1, 2, 0)), ArgumentError,
     r"b_tensor.dtype: got float16"),
    ("b_2d", base(b_tensor=torch.zeros(N, K, dtype=BF)), ArgumentError, r"b_tensor.shape"),
    ("b_wrong_k", base(b_tensor=torch.zeros(L, N, 32, dtype=BF).permute(1, 2, 0)), ArgumentError,
     r"^b_tensor.shape: got \(128, 32, 2\); allowed: \(N, 64, 2\) \(kernel-facing\) or \(2, N, 64\)"),
    ("b_wrong_l", base(b_tensor=torch.zeros(3, N, K, dtype=BF).permute(1, 2, 0)), ArgumentError,
     r"^b_tensor.shape: got \(128, 64, 3\)"),
    ("b_n_major", base(b_tensor=torch.zeros(L, K, N, dtype=BF).permute(2, 1, 0)), ArgumentError,
     r"K-major"),
    ("b_n_mismatch", base(n=64), ArgumentError, r"^n: got 64; allowed: None or 128"),
    ("b_n_odd", base(b_tensor=torch.zeros(L, 100, K, dtype=BF).permute(1, 2, 0)), ArgumentError,
     r"n \(N\): got 100; allowed: a multiple of 8"),
    ("b_n_4", base(b_tensor=torch.zeros(L, 4, K, dtype=BF).permute(1, 2, 0)), ArgumentError, r"n \(N\): got 4"),
    ("b_row_pitch", base(b_tensor=torch.zeros(L, N, 68, dtype=BF)[:, :, :K].permute(1, 2, 0)
                         .as_strided((N, K, L), (68, 1, N * 68))), ArgumentError, r"b_tensor N stride"),
    ("b_expert_pitch", base(b_tensor=torch.zeros(L * N * K + 4, dtype=BF).as_strided(
        (N, K, L), (K, 1, N * K + 4))), ArgumentError, r"b_tensor expert stride"),
    ("b_major_n", base(b_major="n"), ArgumentError, r"^b_major: got 'n'; allowed: 'k'"),
    ("b_major_m", base(b_major="mn"), ArgumentError, r"^b_major"),
    ("b_dtype_fp16", base(b_dtype=F16), ArgumentError, r"^b_dtype: got torch.float16"),
    ("b_dtype_str", base(b_dtype="float8_e4m3fn"), ArgumentError, r"^b_dtype"),
    ("ptrs_int32", discrete(b_ptrs=torch.zeros(L, dtype=I32)), ArgumentError, r"b_ptrs.dtype: got int32"),
    ("ptrs_float", discrete(b_ptrs=torch.zeros(L)), ArgumentError, r"b_ptrs.dtype"),
    ("ptrs_len", discrete(b_ptrs=torch.zeros(3, dtype=I64)), ArgumentError, r"b_ptrs.shape.*\(2,\)"),
    ("ptrs_2d", discrete(b_ptrs=torch.zeros(L, 1, dtype=I64)), ArgumentError, r"b_ptrs.shape"),
    ("ptrs_strided", discrete(b_ptrs=torch.zeros(2 * L, dtype=I64)[::2]), ArgumentError, r"b_ptrs.stride"),
    ("ptrs_no_n", discrete(n=None), ArgumentError, r"^n: got None.*discrete weights need n="),
    ("ptrs_n_float", discrete(n=128.0), ArgumentError, r"^n: got 128.0"),
    ("ptrs_n_bool", discrete(n=True), ArgumentError, r"^n: got True"),
    ("ptrs_n_odd", discrete(n=130), ArgumentError, r"n \(N\): got 130"),
    ("ptrs_b_major", discrete(b_major="n"), ArgumentError, r"^b_major"),
    ("ptrs_b_dtype", discrete(b_dtype=F32), ArgumentError, r"^b_dtype"),
    ("bias_shape", base(bias_tensor=torch.zeros(L, N, dtype=BF)), ArgumentError,
     r"bias_tensor.shape: got \(2, 128\); allowed: \(128, 2\)"),
    ("bias_1d", base(bias_tensor=torch.zeros(N, dtype=BF)), ArgumentError, r"bias_tensor.shape"),
    ("bias_3d", base(bias_tensor=torch.zeros(N, L, 1, dtype=BF)), ArgumentError, r"bias_tensor.shape"),
    ("bias_row_major", base(bias_tensor=torch.zeros(N, L, dtype=BF)), ArgumentError,
     r"bias_tensor.stride.*\(1, 128\)"),
    ("bias_int", base(bias_tensor=torch.zeros(L, N, dtype=I32).t()), ArgumentError, r"bias_tensor.dtype"),
    ("bias_fp64", base(bias_tensor=torch.zeros(L, N, dtype=torch.float64).t()), ArgumentError,
     r"bias_tensor.dtype"),
    ("bias_wrong_n", base(bias_tensor=torch.zeros(L, 64, dtype=BF).t()), ArgumentError, r"bias_tensor.shape"),
    ("bias_wrong_l", base(bias_tensor=torch.zeros(3, N, dtype=BF).t()), ArgumentError, r"bias_tensor.shape"),
    ("prob_len", base(prob_tensor=torch.ones(M - 256, 1, 1)), ArgumentError, r"prob_tensor.shape"),
    ("prob_bf16", base(prob_tensor=torch.ones(M, 1, 1, dtype=BF)), ArgumentError, r"prob_tensor.dtype"),
    ("prob_wide", base(prob_tensor=torch.ones(M, 2, 1)), ArgumentError, r"prob_tensor.shape"),
    ("prob_strided", base(prob_tensor=torch.ones(2 * M)[::2]), ArgumentError, r"prob_tensor.stride"),
    ("prob_4d", base(prob_tensor=torch.ones(M, 1, 1, 1)), ArgumentError, r"prob_tensor.shape"),
    ("c_dtype_int", base(c_dtype=I32), ArgumentError, r"^c_dtype: got torch.int32"),
    ("c_dtype_fp8", base(c_dtype="float8_e4m3fn"), ArgumentError, r"^c_dtype"),
    ("c_dtype_none", base(c_dtype=None), ArgumentError, r"^c_dtype: got None"),
    ("d_dtype_int", base(d_dtype=I64), ArgumentError, r"^d_dtype"),
    ("d_dtype_fp64", base(d_dtype=torch.float64), ArgumentError, r"^d_dtype"),
    ("d_dtype_bogus", base(d_dtype="bf16x"), ArgumentError, r"^d_dtype: got 'bf16x'"),
    ("acc_bf16", base(acc_dtype=BF), ArgumentError, r"^acc_dtype"),
    ("acc_fp16", base(acc_dtype="float16"), ArgumentError, r"^acc_dtype"),
    ("acc_fp64", base(acc_dtype=torch.float64), ArgumentError, r"^acc_dtype"),
    ("cd_major", base(cd_major="m"), ArgumentError, r"^cd_major: got 'm'"),
    ("vector_f32_int", base(vector_f32=1), ArgumentError, r"^vector_f32: got 1; allowed: True or False$"),
    ("vector_f32_str", base(vector_f32="yes"), ArgumentError, r"^vector_f32: got 'yes'; allowed: True or False$"),
    ("vector_f32_reaches_device_check", base(vector_f32=True), ArgumentError,
     r"^a_tensor.device: got cpu; allowed: a CUDA device"),
    ("m_aligned_128", base(m_aligned=128), ArgumentError, r"^m_aligned: got 128"),
    ("m_aligned_512", base(m_aligned=512), ArgumentError, r"^m_aligned"),
    ("generate_c_int", base(generate_c=1), ArgumentError, r"^generate_c: got 1"),
    ("generate_c_str", base(generate_c="yes"), ArgumentError, r"^generate_c"),
    ("dyn_int", base(use_dynamic_sched=1), ArgumentError, r"^use_dynamic_sched"),
    ("dyn_none", base(use_dynamic_sched=None), ArgumentError, r"^use_dynamic_sched"),
    ("a_on_cpu", base(), ArgumentError, r"^a_tensor.device: got cpu; allowed: a CUDA device"),
    ("tile_str", base(mma_tiler_mn="128x256"), ArgumentError, r"mma_tiler_mn"),
    ("cluster_scalar", base(cluster_shape_mn=2), ArgumentError, r"cluster_shape_mn"),
]

# Cases that get past the device checks (mocked): addresses, devices of outputs.
MOCKED_CASES = [
    ("a_misaligned", base(a_tensor=torch.zeros(M * K + 1, dtype=BF)[1:].view(M, K, 1)), ArgumentError,
     r"a_tensor.data_ptr.*multiple of 16"),
    ("b_misaligned", base(b_tensor=torch.zeros(L * N * K + 1, dtype=BF)[1:].view(L, N, K)
                          .permute(1, 2, 0)), ArgumentError, r"b_tensor.data_ptr"),
    ("bias_misaligned", base(bias_tensor=torch.zeros(L * N + 1, dtype=BF)[1:].view(L, N).t()),
     ArgumentError, r"bias_tensor.data_ptr"),
    ("b_misaligned_8b", base(b_tensor=torch.zeros(L * N * K + 4, dtype=BF)[4:].view(L, N, K)
                             .permute(1, 2, 0)), ArgumentError, r"b_tensor.data_ptr"),
    ("a_misaligned_8b", base(a_tensor=torch.zeros(M * K + 4, dtype=BF)[4:].view(M, K, 1)),
     ArgumentError, r"a_tensor.data_ptr: got 0x[0-9a-f]+; allowed: a multiple of 16 bytes"),
    ("ptrs_misaligned", discrete(b_ptrs=torch.zeros(2 * L + 1, dtype=I32)[1:].view(I64)
                                 if False else torch.zeros(L + 1, dtype=I64)[1:]), None, None),
]


@pytest.mark.parametrize("case,kw,exc,msg", WRAPPER_CASES, ids=[c[0] for c in WRAPPER_CASES])
def test_wrapper_rejects(case, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        grouped_gemm(**kw)


@pytest.mark.parametrize("case,kw,exc,msg", MOCKED_CASES, ids=[c[0] for c in MOCKED_CASES])
def test_wrapper_rejects_after_device_checks(fake_cuda, monkeypatch, case, kw, exc, msg):
    if exc is None:  # 8-byte aligned pointer table is legal: must get past validation
        monkeypatch.setattr(engine_mod, "alloc_buffers", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("passed")))
        with pytest.raises(RuntimeError, match="passed"):
            grouped_gemm(**kw)
        return
    with pytest.raises(exc, match=msg):
        grouped_gemm(**kw)


def test_compat_names_are_ours():
    assert grouped_gemm_wrapper_sm100 is grouped_gemm
    assert GroupedGemmSm100 is GroupedGemm
    with pytest.raises(ArgumentError, match="a_tensor"):
        grouped_gemm_wrapper_sm100(**base(a_tensor=None))


def test_error_is_value_error_with_fields():
    with pytest.raises(ValueError) as info:
        grouped_gemm(**base(alpha_tensor=torch.ones(3)))
    err = info.value
    assert err.name == "alpha_tensor.shape" and err.received == (3,)


# ---- class API ----------------------------------------------------------------------
def samples(**over):
    kw = base()
    d = torch.zeros(M, N, 1, dtype=BF)
    s = dict(sample_a=kw["a_tensor"], sample_c=None, sample_d=d,
             sample_padded_offsets=kw["padded_offsets"], sample_alpha=kw["alpha_tensor"],
             sample_b=kw["b_tensor"], sample_bias=None, sample_prob=kw["prob_tensor"],
             arch="sm_90a")
    s.update(over)
    return s


CLASS_CASES = [
    ("acc", samples(acc_dtype=F16), ArgumentError, r"^acc_dtype"),
    ("m_aligned", samples(m_aligned=64), ArgumentError, r"^m_aligned"),
    ("no_b_no_shape", samples(sample_b=None), ArgumentError, r"^num_experts: got None.*without sample_b"),
    ("b_shape_k", samples(sample_b=None, num_experts=L, b_shape=(N, 32)), ArgumentError,
     r"^b_shape.*K of sample_a"),
    ("b_shape_bad", samples(sample_b=None, num_experts=L, b_shape="NK"), ArgumentError, r"^b_shape"),
    ("num_experts", samples(sample_b=None, num_experts=3, b_shape=(N, K)), ArgumentError,
     r"^sample_padded_offsets.shape: got \(2,\); allowed: \(3,\): num_experts"),
    ("d_shape", samples(sample_d=torch.zeros(M, 64, 1, dtype=BF)), ArgumentError, r"sample_d.shape"),
    ("d_dtype", samples(sample_d=torch.zeros(M, N, 1, dtype=I32)), ArgumentError, r"^sample_d.dtype"),
    ("d_m_major", samples(sample_d=torch.zeros(N, M, dtype=BF).t()), ArgumentError, r"sample_d.stride"),
    ("c_shape", samples(sample_c=torch.zeros(M + 256, N, 1, dtype=F32), generate_c=True),
     ArgumentError, r"sample_c.shape"),
    ("c_dtype_arg", samples(c_dtype="int8"), ArgumentError, r"^c_dtype"),
    ("generate_c", samples(generate_c="no"), ArgumentError, r"^generate_c"),
    ("dynamic", samples(use_dynamic_sched=0), ArgumentError, r"^use_dynamic_sched"),
    ("a_dtype", samples(sample_a=torch.zeros(M, K, 1, dtype=F16)), ArgumentError, r"a_tensor.dtype"),
]


@pytest.mark.parametrize("case,kw,exc,msg", CLASS_CASES, ids=[c[0] for c in CLASS_CASES])
def test_class_rejects(fake_cuda, case, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        GroupedGemm(**kw)


SUPPORT_CASES = [
    # registry limits of the sm_90a kernel (declared by the spec, not implemented there)
    ("tile_256x256", dict(mma_tiler_mn=(256, 256)),
     r"^mma_tiler_mn=\(256, 256\): tile_m=256 is not implemented for grouped_gemm on sm_90a; "
     r"implemented: 64, 128 \(two WGMMA consumer warpgroups: 128 cooperative"),
    ("cluster_4x1", dict(cluster_shape_mn=(4, 1)),
     r"^cluster_shape_mn=\(4, 1\): cluster_m=4 is not implemented for grouped_gemm on sm_90a; "
     r"implemented: 1, 2 \(clusters up to 2x2 on sm_90a\)"),
    ("cluster_dynamic", dict(cluster_shape_mn=(1, 2), use_dynamic_sched=True),
     r"^cluster_shape_mn=\(1, 2\): cluster_n=2 is not implemented for grouped_gemm on sm_90a with "
     r"scheduler=dynamic; implemented: 1 \(the dynamic scheduler claims tiles per CTA"),
    # outside every kernel's accumulator widths, so outside the axis vocabulary and the spec's surface
    ("tile_128x64", dict(mma_tiler_mn=(128, 64)),
     r"^mma_tiler_mn=\(128, 64\): tile_n: got 64; spec grouped_gemm allows: one of 128, 256$"),
    ("arch_sm80", dict(arch="sm_80"), r"^arch: got 'sm_80'; allowed: sm_100a, sm_90a$"),
]


@pytest.mark.parametrize("case,kw,msg", SUPPORT_CASES, ids=[c[0] for c in SUPPORT_CASES])
def test_check_support_says_why(fake_cuda, case, kw, msg):
    op = GroupedGemm(**samples(**kw))
    assert op.support_problem() is not None
    with pytest.raises(UnsupportedError, match=msg):
        op.check_support()
    with pytest.raises(UnsupportedError):
        op.compile()


def test_check_support_ok(fake_cuda):
    op = GroupedGemm(**samples())
    assert op.support_problem() is None and op.check_support() is True
    # defaults come from the spec plus the registry: sm_90a prefers 128x256 without clusters,
    # sm_100a takes the spec's 256x256 on a 2x1 cluster
    assert (op.tile, op.cluster) == ((128, 256), (1, 1))
    op100 = GroupedGemm(**samples(arch="sm_100a"))
    assert (op100.tile, op100.cluster) == ((256, 256), (2, 1)) and op100.check_support()
    # sm_90a clusters up to 2x2 with static scheduling (TMA multicast)
    for cluster in ((2, 1), (1, 2), (2, 2)):
        assert GroupedGemm(**samples(cluster_shape_mn=cluster)).support_problem() is None


def test_tile_m_64_runs_on_sm90a(fake_cuda, session_cache, monkeypatch):
    """The spec and the sm_90a kernel allow tile M 64; the op used to refuse it (it kept its own
    table of tiles). Now the op's surface is the spec's plus the registry's, and the kernel of
    that variant compiles."""
    from fusegemm import pipeline
    op = GroupedGemm(**samples(mma_tiler_mn=(64, 256)))
    assert op.check_support() is True
    built = pipeline.get_kernel(op._variant(), session_cache)
    assert built.contract.tile_m == 64 and built.resources.local_bytes == 0


def execute_args(**over):
    kw = base()
    args = dict(a_tensor=kw["a_tensor"], c_tensor=None, d_tensor=torch.zeros(M, N, 1, dtype=BF),
                padded_offsets=kw["padded_offsets"], alpha_tensor=kw["alpha_tensor"],
                b_tensor=kw["b_tensor"], bias_tensor=None, prob_tensor=kw["prob_tensor"])
    args.update(over)
    return args


EXECUTE_CASES = [
    ("bias_added", execute_args(bias_tensor=torch.zeros(L, N, dtype=BF).t()), r"^bias_tensor: got bfloat16; allowed: None"),
    ("ptrs_for_dense", execute_args(b_tensor=None, b_ptrs=torch.zeros(L, dtype=I64)), r"b_tensor/b_ptrs"),
    ("d_missing", execute_args(d_tensor=None), r"^d_tensor: got None"),
    ("d_dtype", execute_args(d_tensor=torch.zeros(M, N, 1, dtype=F16)), r"d_tensor.dtype: got float16"),
    ("d_rows", execute_args(d_tensor=torch.zeros(M - 256, N, 1, dtype=BF)), r"d_tensor.shape"),
    ("d_pitch", execute_args(d_tensor=torch.zeros(M, N + 4, 1, dtype=BF)[:, :N]), r"d_tensor.stride\[0\]"),
    ("d_misaligned", execute_args(d_tensor=torch.zeros(M * N + 1, dtype=BF)[1:].view(M, N, 1)),
     r"d_tensor.data_ptr"),
    ("a_k_changed", execute_args(a_tensor=torch.zeros(M, 32, 1, dtype=BF)), r"^b_tensor.shape: got"),
    ("alpha_len", execute_args(alpha_tensor=torch.ones(5)), r"alpha_tensor.shape"),
    ("offsets_dtype", execute_args(padded_offsets=torch.tensor([256, 512], dtype=I64)), r"padded_offsets.dtype"),
]


@pytest.mark.parametrize("case,kw,msg", EXECUTE_CASES, ids=[c[0] for c in EXECUTE_CASES])
def test_execute_rejects(fake_cuda, case, kw, msg):
    op = GroupedGemm(**samples())
    with pytest.raises(ArgumentError, match=msg):
        op.execute(**kw)


def test_class_on_cpu_tensors():
    with pytest.raises(ArgumentError, match=r"^a_tensor.device: got cpu"):
        GroupedGemm(**samples())


def test_execute_discrete_op_rejects_dense_weights(fake_cuda):
    s = samples(sample_b=None, num_experts=L, b_shape=(N, K))
    op = GroupedGemm(**s)
    with pytest.raises(ArgumentError, match=r"b_tensor/b_ptrs.*discrete"):
        op.execute(**execute_args())


def test_no_cuda_at_import():
    import subprocess
    import sys
    code = ("import sys, fusegemm, fusegemm.presets, fusegemm.compat;"
            "bad=[m for m in sys.modules if m.startswith('cuda.bindings.driver') or m == 'torch'];"
            "print(bad); sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ---- host pieces that need no GPU ---------------------------------------------------
TMAP_CASES = [
    (dict(dtype="int4"), r"tensor map dtype"),
    (dict(shape=()), r"tensor map rank"),
    (dict(shape=(64, 64, 1, 1, 1, 1), strides=(128,) * 5, box=(64,) * 6), r"tensor map rank"),
    (dict(strides=()), r"tensor map strides"),
    (dict(box=(64,)), r"tensor map box"),
    (dict(shape=(0, 64)), r"tensor map shape\[0\]"),
    (dict(strides=(100,)), r"tensor map stride\[1\]: got 100"),
    (dict(box=(64, 512)), r"tensor map box\[1\]: got 512"),
    (dict(box=(4, 64)), r"tensor map box\[0\]: got 4"),
    (dict(box=(128, 64)), r"at most 64 elements with a 128-byte swizzle"),
    (dict(swizzle=16), r"tensor map swizzle"),
    (dict(l2_promotion=32), r"tensor map l2_promotion"),
    (dict(oob_fill="inf"), r"tensor map oob_fill"),
]


@pytest.mark.parametrize("over,msg", TMAP_CASES)
def test_tiled_map_spec_rejects(over, msg):
    from fusegemm.runtime.tensormap import TiledMapSpec
    kw = dict(dtype="bfloat16", shape=(64, 256), strides=(128,), box=(64, 128))
    kw.update(over)
    with pytest.raises(ArgumentError, match=msg):
        TiledMapSpec(**kw)


def test_tiled_map_spec_ok_and_address_checked():
    from fusegemm.runtime.tensormap import TiledMapSpec, encode_tiled
    spec = TiledMapSpec("bfloat16", (7168, 16384), (14336,), (64, 128))
    assert spec.box_bytes == 64 * 128 * 2
    with pytest.raises(ArgumentError, match="tensor map address"):
        encode_tiled(0x1008, spec)


def test_launch_config_rejects():
    from fusegemm.runtime.launch import LaunchConfig
    with pytest.raises(ArgumentError, match="LaunchConfig.block"):
        LaunchConfig(grid=(1, 1, 1), block=(2048, 1, 1))
    with pytest.raises(ArgumentError, match="LaunchConfig.grid.x"):
        LaunchConfig(grid=(3, 1, 1), block=(128, 1, 1), cluster=(2, 1, 1))
    with pytest.raises(ArgumentError, match="LaunchConfig.grid"):
        LaunchConfig(grid=(0, 1, 1), block=(128, 1, 1))


def test_stream_resolution_without_cuda():
    from fusegemm.runtime.tensors import resolve_stream
    assert resolve_stream(1234, 0) == 1234

    class TorchLike:
        cuda_stream = 77

    class CoreLike:
        def __cuda_stream__(self):
            return (0, 99)

    assert resolve_stream(TorchLike(), 0) == 77
    assert resolve_stream(CoreLike(), 0) == 99
    with pytest.raises(ArgumentError, match="current_stream"):
        resolve_stream(-1, 0)
    with pytest.raises(ArgumentError, match="current_stream"):
        resolve_stream("default", 0)


def test_cuda_array_interface_inputs_are_described():
    from fusegemm.runtime.tensors import view

    class Cai:
        __cuda_array_interface__ = {"shape": (4, 8), "typestr": "<f4", "data": (0, False),
                                    "strides": None, "version": 3}

    v = view(Cai(), "x")
    assert v.shape == (4, 8) and v.strides == (8, 1) and v.dtype == "float32"

    class BadStride:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False),
                                    "strides": (2,), "version": 3}

    with pytest.raises(ArgumentError, match="x.strides"):
        view(BadStride(), "x")


def test_weight_major_is_checked_against_the_kernel_it_runs_on():
    """b_major: the seed wrappers read K-major weights only; a spec op built with b_major="n"
    (sm_90a) takes the (L, N, K) view of (L, K, N) weights, and each refuses the other layout by
    its stride, before any device check."""
    from fusegemm.ops.grouped_operands import parse_call
    a = torch.zeros(M, K, dtype=BF)
    off = torch.tensor([256, 512], dtype=I32)
    w_kn = torch.zeros(L, K, N, dtype=BF)          # (L, K, N): N contiguous
    common = dict(ab_dtypes=("bfloat16",), bias_dtypes=(), alpha_required=False)
    with pytest.raises(ArgumentError, match=r"b_major: got 'n'; allowed: 'k'|b_major: got 'n'; allowed: k"):
        parse_call(a, off, None, w_kn.transpose(1, 2), None, None, None, b_major="n", **common)
    with pytest.raises(ArgumentError, match="b_tensor.stride: got .*allowed: K-major"):
        parse_call(a, off, None, w_kn.transpose(1, 2), None, None, None, **common)
    with pytest.raises(ArgumentError, match="b_tensor.stride: got .*allowed: N-major"):
        parse_call(a, off, None, w_kn.transpose(1, 2).contiguous(), None, None, None, b_major="n",
                   b_majors=("n",), **common)
    # the N-major view passes every layout check and stops only at the CPU tensor's device
    with pytest.raises(ArgumentError, match="a_tensor"):
        parse_call(a, off, None, w_kn.transpose(1, 2), None, None, None, b_major="n", b_majors=("n",), **common)
