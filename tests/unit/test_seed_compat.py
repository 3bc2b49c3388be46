"""What NVIDIA's cuDNN frontend tests of the seed APIs need from ``fusegemm.compat``, checked on the
CPU: every parameter the seed pages document exists with its documented default (a table written
from the pages, each name checked against the page text), ``vector_f32=True`` (packed FP32 on
sm_100a, scalar on sm_90a), ``torch.float4_e2m1fn_x2`` operands, seed 002's discrete class mode,
and the error class of an operand layout that is valid for an op but not on an arch.

Calls on CPU tensors are validated completely and then refused at the device check
(``a_tensor.device: got cpu``), as in test_scaled_errors.py; ``VALIDATION_ARCH`` (the arch whose
kernel validates a CPU call) is patched to sm_90a where the Hopper behaviour is the point.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fusegemm import compat  # noqa: E402
from fusegemm.base.errors import ArgumentError, FusegemmError, UnsupportedError  # noqa: E402
from fusegemm.formats.numpy_dtypes import dtype_name  # noqa: E402
from fusegemm.generator import registry  # noqa: E402
from fusegemm.generator.render import render, rule_of  # noqa: E402
from fusegemm.generator.spec import parse_spec  # noqa: E402
from fusegemm.generator.variants import make_variant  # noqa: E402
from fusegemm.ops import scaled_seeds  # noqa: E402
from fusegemm.problems import make_batched_problem, make_grouped_problem  # noqa: E402

from test_scaled_errors import _cpu, amax_base, base  # noqa: E402

SEEDS = Path(__file__).resolve().parents[3] / "shared" / "seeds"
DEVICE = r"^a_tensor\.device: got cpu; allowed: a CUDA device$"
GROUPED = ("grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu")

# ============================================================================================
# 1. The documented parameters, from the seed pages
# ============================================================================================
# (compat name, seed page, how it is called, documented parameter names). "call": the names of
# the page's usage example (and the discrete-weights variant where the page documents one);
# "positional": the page calls these positionally, in this order.
DOCUMENTED = [
    # seed 001: grouped GEMM BF16
    ("grouped_gemm_wrapper_sm100", "001", "call",
     "a_tensor padded_offsets alpha_tensor b_tensor bias_tensor prob_tensor c_dtype d_dtype generate_c "
     "use_dynamic_sched b_ptrs n b_dtype b_major"),
    ("GroupedGemmSm100", "001", "call",
     "sample_a sample_c sample_d sample_padded_offsets sample_alpha sample_b sample_bias sample_prob acc_dtype "
     "generate_c use_dynamic_sched num_experts b_shape b_dtype"),
    ("GroupedGemmSm100.execute", "001", "call",
     "a_tensor c_tensor d_tensor padded_offsets alpha_tensor b_tensor bias_tensor prob_tensor b_ptrs"),
    # seed 002: grouped GEMM + sReLU (dense and discrete)
    ("grouped_gemm_srelu_wrapper_sm100", "002", "call",
     "a_tensor b_tensor sfa_tensor sfb_tensor padded_offsets alpha_tensor norm_const_tensor prob_tensor acc_dtype "
     "c_dtype d_dtype cd_major mma_tiler_mn cluster_shape_mn sf_vec_size vector_f32 m_aligned discrete_col_sfd "
     "current_stream b_ptrs sfb_ptrs n b_dtype b_major tanh_clamp_scale"),
    ("GroupedGemmSreluSm100", "002", "call",
     "sample_a sample_b sample_c sample_d sample_sfa sample_sfb sample_padded_offsets sample_alpha sample_d_col "
     "sample_sfd_row sample_sfd_col sample_amax sample_norm_const sample_prob acc_dtype mma_tiler_mn "
     "cluster_shape_mn sf_vec_size vector_f32 m_aligned discrete_col_sfd num_experts b_shape b_dtype "
     "tanh_clamp_scale"),
    ("GroupedGemmSreluSm100.execute", "002", "call",
     "a_tensor b_tensor c_tensor d_tensor sfa_tensor sfb_tensor padded_offsets alpha_tensor d_col_tensor "
     "sfd_row_tensor sfd_col_tensor amax_tensor norm_const_tensor prob_tensor current_stream b_ptrs sfb_ptrs"),
    # seed 003: grouped GEMM + quant (dense only: the page documents no discrete weights)
    ("grouped_gemm_quant_wrapper_sm100", "003", "call",
     "a_tensor b_tensor sfa_tensor sfb_tensor padded_offsets alpha_tensor norm_const_tensor prob_tensor acc_dtype "
     "d_dtype cd_major mma_tiler_mn cluster_shape_mn sf_vec_size vector_f32 m_aligned discrete_col_sfd "
     "current_stream"),
    ("GroupedGemmQuantSm100", "003", "call",
     "sample_a sample_b sample_d sample_sfa sample_sfb sample_padded_offsets sample_alpha sample_d_col "
     "sample_sfd_row sample_sfd_col sample_amax sample_norm_const sample_prob acc_dtype mma_tiler_mn "
     "cluster_shape_mn sf_vec_size vector_f32 m_aligned discrete_col_sfd"),
    ("GroupedGemmQuantSm100.execute", "003", "call",
     "a_tensor b_tensor d_tensor sfa_tensor sfb_tensor padded_offsets alpha_tensor d_col_tensor sfd_row_tensor "
     "sfd_col_tensor amax_tensor norm_const_tensor prob_tensor current_stream"),
    # seed 000: grouped GEMM + dSwiGLU
    ("grouped_gemm_dswiglu_wrapper_sm100", "000", "call",
     "a_tensor b_tensor c_tensor sfa_tensor sfb_tensor padded_offsets alpha_tensor beta_tensor prob_tensor "
     "norm_const_tensor acc_dtype d_dtype cd_major mma_tiler_mn cluster_shape_mn sf_vec_size vector_f32 m_aligned "
     "discrete_col_sfd epilogue_op current_stream"),
    ("GroupedGemmDswigluSm100", "000", "call",
     "sample_a sample_b sample_c sample_d_row sample_d_col sample_sfa sample_sfb sample_padded_offsets "
     "sample_alpha sample_beta sample_prob sample_dprob sample_sfd_row sample_sfd_col sample_amax "
     "sample_norm_const acc_dtype mma_tiler_mn cluster_shape_mn sf_vec_size vector_f32 m_aligned "
     "discrete_col_sfd epilogue_op"),
    ("GroupedGemmDswigluSm100.execute", "000", "call",
     "a_tensor b_tensor c_tensor d_row_tensor d_col_tensor sfa_tensor sfb_tensor padded_offsets alpha_tensor "
     "beta_tensor prob_tensor dprob_tensor sfd_row_tensor sfd_col_tensor amax_tensor norm_const_tensor "
     "current_stream"),
    # seed 004: GEMM + amax (called positionally on the page)
    ("gemm_amax_wrapper_sm100", "004", "positional", "a_tensor b_tensor sfa_tensor sfb_tensor"),
    ("gemm_amax_wrapper_sm100", "004", "call", "c_major c_dtype acc_dtype mma_tiler_mn cluster_shape_mn sf_vec_size "
     "stream"),
    ("GemmAmaxSm100", "004", "call",
     "sample_a sample_b sample_sfa sample_sfb sample_c sample_amax acc_dtype mma_tiler_mn cluster_shape_mn "
     "sf_vec_size"),
    ("GemmAmaxSm100.execute", "004", "positional",
     "a_tensor b_tensor sfa_tensor sfb_tensor c_tensor amax_tensor"),
    ("GemmAmaxSm100.execute", "004", "call", "current_stream"),
]

# Defaults a page states ("Default: ..."), by compat name. Tiles and clusters are not here: they
# default to the arch's preferred kernel (scaled_seeds.py's module docstring says why).
DEFAULTS = {
    "grouped_gemm_quant_wrapper_sm100": {"acc_dtype": "float32", "d_dtype": "bfloat16", "cd_major": "n",
                                         "sf_vec_size": 16, "vector_f32": False, "m_aligned": 256,
                                         "discrete_col_sfd": False},
    "GroupedGemmQuantSm100": {"sf_vec_size": 16, "vector_f32": False, "m_aligned": 256, "discrete_col_sfd": False},
    "grouped_gemm_dswiglu_wrapper_sm100": {"acc_dtype": "float32", "d_dtype": "bfloat16", "cd_major": "n",
                                           "sf_vec_size": 16, "vector_f32": False, "m_aligned": 256,
                                           "discrete_col_sfd": False, "epilogue_op": None},
    "GroupedGemmDswigluSm100": {"sf_vec_size": 16, "vector_f32": False, "m_aligned": 256,
                                "discrete_col_sfd": False, "epilogue_op": None},
    "gemm_amax_wrapper_sm100": {"c_major": "n", "c_dtype": "float32", "acc_dtype": "float32", "sf_vec_size": 32},
    "GemmAmaxSm100": {"acc_dtype": "float32", "sf_vec_size": 32},
}


def _seed_text(seed: str) -> str | None:
    """The seed page's text, or None where the pages are not beside the checkout (the table
    then stands for them)."""
    paths = list(SEEDS.glob(f"{seed}_*.txt"))
    return paths[0].read_text() if paths else None


def _signature(name: str) -> inspect.Signature:
    obj = compat
    for part in name.split("."):
        obj = getattr(obj, part)
    return inspect.signature(obj)


@pytest.mark.parametrize("name,seed,how,names", DOCUMENTED, ids=[f"{d[0]}-{d[2]}" for d in DOCUMENTED])
def test_documented_parameters_exist(name, seed, how, names):
    page = _seed_text(seed)
    params = _signature(name).parameters
    expected = names.split()
    for p in expected:      # the table says what the page says
        assert page is None or re.search(rf"\b{re.escape(p)}\b", page), f"{p} is not on seed page {seed}"
    missing = [p for p in expected if p not in params or params[p].kind is inspect.Parameter.POSITIONAL_ONLY]
    assert not missing, f"{name}: documented parameters missing from the signature: {missing}"
    if how == "positional":
        order = [p for p in params if p != "self"][:len(expected)]
        assert order == expected, f"{name}: positional order {order}, the page calls {expected}"


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_documented_defaults(name):
    params = _signature(name).parameters
    for p, want in DEFAULTS[name].items():
        got = params[p].default
        if isinstance(want, str) and want not in ("n",):
            got = dtype_name(got) if dtype_name(got) is not None else got
        assert got == want and type(got) is type(want), f"{name}.{p}: default {got!r}, the page says {want!r}"


def test_vector_f32_is_a_parameter_of_every_grouped_wrapper_and_class():
    for name in ("grouped_gemm_wrapper_sm100", "GroupedGemmSm100", "grouped_gemm_srelu_wrapper_sm100",
                 "GroupedGemmSreluSm100", "grouped_gemm_quant_wrapper_sm100", "GroupedGemmQuantSm100",
                 "grouped_gemm_dswiglu_wrapper_sm100", "GroupedGemmDswigluSm100"):
        assert _signature(name).parameters["vector_f32"].default is False, name


# ============================================================================================
# 2. vector_f32
# ============================================================================================
@pytest.fixture
def built_ops(monkeypatch):
    """The BlockScaledGemm each wrapper call builds (scaled_seeds._op), in call order."""
    ops = []
    real = scaled_seeds._op

    def record(*a, **k):
        ops.append(real(*a, **k))
        return ops[-1]
    monkeypatch.setattr(scaled_seeds, "_op", record)
    return ops


@pytest.mark.parametrize("family", GROUPED)
def test_vector_f32_wrappers_build_the_packed_variant_on_sm100(family, built_ops):
    with pytest.raises(ArgumentError, match=DEVICE):
        getattr(compat, f"{family}_wrapper_sm100")(**base(family, vector_f32=True))
    (op,) = built_ops
    assert (op.arch, op.variant.vector_f32) == ("sm_100a", True)
    assert "apply2(" in render(op.variant).text


@pytest.mark.parametrize("family", GROUPED)
def test_vector_f32_on_sm90_is_the_scalar_kernel(family, built_ops, monkeypatch):
    monkeypatch.setattr(scaled_seeds, "VALIDATION_ARCH", "sm_90a")
    for packed in (True, False):
        with pytest.raises(ArgumentError, match=DEVICE):
            getattr(compat, f"{family}_wrapper_sm100")(**base(family, vector_f32=packed))
    vf, plain = built_ops
    assert vf.arch == "sm_90a" and vf.variant == plain.variant and vf.variant.vector_f32 is False
    assert vf is plain                                  # one op, one kernel
    assert render(vf.variant).digest == render(plain.variant).digest


def test_vector_f32_classes(monkeypatch):
    kw = base("grouped_gemm_srelu")
    samples = dict(sample_a=kw["a_tensor"], sample_b=kw["b_tensor"], sample_sfa=kw["sfa_tensor"],
                   sample_sfb=kw["sfb_tensor"], sf_vec_size=32)
    d8 = torch.zeros(768, 256, 1, dtype=torch.uint8).view(torch.float8_e4m3fn)
    ops = [compat.GroupedGemmSreluSm100(**samples, sample_d=d8, vector_f32=True),
           compat.GroupedGemmQuantSm100(**samples, sample_d=d8, vector_f32=True)]
    ds = base("grouped_gemm_dswiglu")
    ops.append(compat.GroupedGemmDswigluSm100(sample_a=ds["a_tensor"], sample_b=ds["b_tensor"],
                                              sample_c=ds["c_tensor"], sample_sfa=ds["sfa_tensor"],
                                              sample_sfb=ds["sfb_tensor"], sample_d_row=d8, sf_vec_size=32,
                                              vector_f32=True))
    assert [o.op.variant.vector_f32 for o in ops] == [True, True, True]
    monkeypatch.setattr(scaled_seeds, "VALIDATION_ARCH", "sm_90a")
    hopper = compat.GroupedGemmSreluSm100(**samples, sample_d=d8, vector_f32=True)
    assert hopper.op.variant.vector_f32 is False and hopper.check_support()
    with pytest.raises(ArgumentError, match=r"^vector_f32: got 1; allowed: True or False$"):
        compat.GroupedGemmSreluSm100(**samples, sample_d=d8, vector_f32=1)


def test_vector_f32_bf16_class(monkeypatch):
    import fusegemm.ops.arg_checks as checks    # the BF16 class checks devices at construction: CPU as device 0
    monkeypatch.setattr(checks, "require_cuda", lambda v, n: 0)
    monkeypatch.setattr(checks, "same_device", lambda views, dev: None)
    a = torch.zeros(512, 64, 1, dtype=torch.bfloat16)
    kw = dict(sample_padded_offsets=torch.tensor([256, 512], dtype=torch.int32), sample_alpha=torch.ones(2),
              sample_b=torch.zeros(2, 128, 64, dtype=torch.bfloat16).permute(1, 2, 0), sample_prob=torch.ones(512, 1, 1))
    packed = compat.GroupedGemmSm100(a, vector_f32=True, arch="sm_100a", **kw)._variant()
    assert packed.vector_f32 and "apply2(" in render(packed).text
    hopper = compat.GroupedGemmSm100(a, vector_f32=True, arch="sm_90a", **kw)._variant()
    assert hopper == compat.GroupedGemmSm100(a, arch="sm_90a", **kw)._variant() and not hopper.vector_f32
    with pytest.raises(ArgumentError, match=r"^vector_f32: got 'yes'; allowed: True or False$"):
        compat.GroupedGemmSm100(a, vector_f32="yes", arch="sm_100a", **kw)


SPECS_WITH_VF32 = ("grouped_gemm", "grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu")


@pytest.mark.parametrize("spec", SPECS_WITH_VF32)
def test_vector_f32_reaches_the_sm100_source_and_not_the_sm90_one(spec):
    packed, plain = (render(make_variant(spec, arch="sm_100a", vector_f32=v)) for v in (True, False))
    assert packed.digest != plain.digest and ".vf32." in packed.name and ".vf32." not in plain.name
    assert "FUSEGEMM_DEVICE void apply2(float2 acc0" in packed.text and "fusegemm::f32x2::mul(" in packed.text
    assert "apply2" not in plain.text and "f32x2" not in plain.text
    # sm_90a records that it runs vector_f32 with its scalar math: the variant is the scalar one
    row = registry.lookup(find_kernel(spec), "sm_90a")
    got = [(r.axis, r.value, r.runs_as, r.when) for r in row.runs_as]
    assert got[0] == ("vector_f32", True, False, ())
    # (the block-scaled rows also run the blockwise recipe's E8M0 scales as FP32: a conditional one)
    assert got[1:] == ([("sf_dtype", "float8_e8m0fnu", "float32", (("sf_vec_size", 128),))]
                       if row.kernel_class in ("scaled", "batched") else [])
    assert "vector_f32" not in row.source_axes and "vector_f32" in registry.lookup(find_kernel(spec), "sm_100a").source_axes
    hopper = make_variant(spec, arch="sm_90a", vector_f32=True)
    assert hopper == make_variant(spec, arch="sm_90a") and hopper.vector_f32 is False
    # even a variant built around the registry renders the scalar rule on sm_90a
    forced = dataclasses.replace(make_variant(spec, arch="sm_90a"), vector_f32=True)
    assert render(forced).digest == render(hopper).digest


def find_kernel(spec: str) -> str:
    from fusegemm.generator.spec import find_spec
    return find_spec(spec).kernel


def test_cli_variant_on_sm90_says_it_runs_the_scalar_kernel():
    row = registry.lookup("grouped_gemm_srelu", "sm_90a")
    with pytest.raises(UnsupportedError) as info:
        row.reaching({"vector_f32": True})
    assert str(info.value) == (
        "vector_f32: does not reach the sm_90a kernel of grouped_gemm_srelu, which runs vector_f32=True as "
        "vector_f32=False (sm_90a has no packed FP32 instructions: scalar FP32 math, the same results): one kernel "
        "for both; allowed: leave vector_f32 out on sm_90a (the API accepts vector_f32=True and runs that kernel)")
    assert info.value.axis == "vector_f32"
    registry.lookup("grouped_gemm_srelu", "sm_100a").reaching({"vector_f32": True})   # reaches it
    with pytest.raises(ValueError, match=r"source_axes: got \['vector_f32'\]"):
        dataclasses.replace(registry.lookup("grouped_gemm", "sm_90a"),
                            source_axes=registry.lookup("grouped_gemm", "sm_90a").source_axes + ("vector_f32",))


# ---- the sm_100a SASS: the packed instructions are there with vector_f32 and only then ----
PACKED = ("FMUL2", "FADD2", "FFMA2")


def _sass_histogram(v) -> dict[str, int]:
    from fusegemm.runtime import disasm
    from fusegemm.runtime.compile import compile_source, headers
    try:
        headers()
        disasm.find_tool()
    except FusegemmError as exc:
        pytest.skip(f"needs NVRTC, the CUDA/CUTLASS header wheels and nvdisasm: {exc}")
    src = render(v)
    hist: dict[str, int] = {}
    for op, n in disasm.histogram(disasm.sass(compile_source(src.text, arch="sm_100a", kernel=src.symbol).data)).items():
        hist[op.split(".")[0]] = hist.get(op.split(".")[0], 0) + n
    return hist


@pytest.mark.parametrize("spec,choices,packed_ops", [
    ("grouped_gemm_dswiglu", {}, ("FMUL2", "FADD2")),                       # alpha^2 * acc, 1 + g (1 - s)
    ("grouped_gemm_quant", {"bias_dtype": "bfloat16"}, ("FMUL2", "FFMA2")),  # fma(acc, scale, prob * bias)
])
def test_sm100_sass_of_vector_f32(spec, choices, packed_ops):
    packed = _sass_histogram(make_variant(spec, arch="sm_100a", vector_f32=True, **choices))
    plain = _sass_histogram(make_variant(spec, arch="sm_100a", **choices))
    assert all(packed.get(op, 0) >= 16 for op in packed_ops), packed      # one per column pair of a block
    assert not any(plain.get(op, 0) for op in PACKED), plain
    # the packed ops replace scalar ones: fewer FP32 multiplies in all
    assert packed.get("FMUL", 0) < plain.get("FMUL", 0)


# ---- the packed rule computes the scalar rule's operations, lane by lane (host C++) ----
# The packed helpers are replaced by host versions that run each lane with the scalar operation,
# so this checks the emitter's wiring of apply2 (which operands and conditions each lane reads,
# values computed once for both lanes); that FMUL2/FADD2/FFMA2 are per lane the correctly rounded
# FMUL/FADD/FFMA is the ISA's (templates/include/fusegemm/sm100/packed_f32.cuh).
HOST_SHIM = r"""
#include <math.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#define FUSEGEMM_DEVICE inline
struct float2 { float x, y; };
inline float2 make_float2(float a, float b) { return float2{a, b}; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
namespace fusegemm {
struct bfloat16_t {}; struct half_t {}; struct float_e4m3_t {}; struct float_e5m2_t {};
namespace epi {
template <class T> float ldf(const void*, int64_t) { return 0.0f; }
template <class T, bool A> void ldf2(const void*, int64_t, float&, float&) {}
template <class T> void prefetch_l2(const void*, int64_t) {}
template <class T> const char* elem_ptr(const void* p, int64_t) { return static_cast<const char*>(p); }
template <class T> struct Cvt { static constexpr int kBytes = 2; };
template <class T> using Raw2T = unsigned;
template <class T> unsigned raw2_load(const char*, int) { return 0u; }
template <class T> unsigned raw2_load_elems(const char*, int, int) { return 0u; }
template <class T> void raw2_unpack(unsigned, float&, float&) {}
template <class T> bool pairs_aligned(const void*, int64_t) { return true; }
template <class T> struct Row32 {
  static constexpr bool kInRegisters = true;
  void load(const T*, int) {}
  float get(int) const { return 0.0f; }
};
inline int paired_col(int j, int) { return j; }
inline float relu(float x) { return x > 0.0f || x != x ? x : 0.0f; }
inline float fmin_nan(float a, float b) { return a != a || b != b ? a + b : (a < b ? a : b); }
inline float fmax_nan(float a, float b) { return a != a || b != b ? a + b : (a > b ? a : b); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float gelu_tanh(float x) { return 0.5f * x * (1.0f + std::tanh(0.7978846f * x)); }
}  // namespace epi
namespace f32x2 {   // host stand-ins: each lane the scalar operation
inline float2 splat(float x) { return {x, x}; }
inline float2 pair(float a, float b) { return {a, b}; }
inline float2 add(float2 a, float2 b) { return {__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y)}; }
inline float2 sub(float2 a, float2 b) { return {__fsub_rn(a.x, b.x), __fsub_rn(a.y, b.y)}; }
inline float2 mul(float2 a, float2 b) { return {__fmul_rn(a.x, b.x), __fmul_rn(a.y, b.y)}; }
inline float2 fma(float2 a, float2 b, float2 c) { return {__fmaf_rn(a.x, b.x, c.x), __fmaf_rn(a.y, b.y, c.y)}; }
inline float2 neg(float2 a) { return {-a.x, -a.y}; }
inline float2 square(float2 a) { return mul(a, a); }
template <class F, class... A> float2 map(F f, A... a) { return {f(a.x...), f(a.y...)}; }
inline float2 select(bool c0, bool c1, float2 a, float2 b) { return {c0 ? a.x : b.x, c1 ? a.y : b.y}; }
}  // namespace f32x2
}  // namespace fusegemm
static uint32_t seed = 12345u;
static float rnd() {   // wide-range values and the special ones
  seed = seed * 1664525u + 1013904223u;
  const uint32_t r = seed >> 8;
  static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f, 3.0e38f, 1.0f, -1.0f};
  if (r % 8 == 0) return special[(r >> 3) % 10];
  const float m = float(r & 0xFFFF) / 65536.0f + 0.5f;
  return ((r >> 16) & 1 ? -m : m) * std::ldexp(1.0f, int((r >> 17) % 41) - 20);
}
"""

HOST_MAIN = r"""
int main() {
  Rule r;
  for (int t = 0; t < 20000; ++t) {
    {members}
    Rule::RowIn ri; {row}
    Rule::ElemIn e0, e1; {elems}
    const float a0 = rnd(), a1 = rnd(), u0 = rnd(), u1 = rnd();
    const Rule::Out o0 = r.apply(a0, u0, ri, e0), o1 = r.apply(a1, u1, ri, e1);
    Rule::Out p0, p1;
    r.apply2(make_float2(a0, a1), make_float2(u0, u1), ri, e0, e1, p0, p1);
    if (std::memcmp(&o0, &p0, sizeof o0) || std::memcmp(&o1, &p1, sizeof o1)) { std::printf("mismatch at %d\n", t); return 1; }
  }
  std::printf("ok\n");
  return 0;
}
"""

# Every construct of the epilogue language apply2 spells differently from apply: per-column and
# per-row inputs, where() with a comparison and with isnan(), division, negation, fma, square,
# functions of one, two and three arguments, and values the same in both lanes.
ALL_FORMS_SPEC = """\
schema: 2
name: demo
kernel: grouped_gemm
problem: grouped
summary: every form apply2 spells
epilogue:
  inputs:
    alpha: {per: expert}
    prob: {per: row, default: 1.0}
    bias: {per: column, dtype: bias_dtype}
  compute:
    - s = alpha * prob + 1
    - x = s * acc
    - y = where(x > bias, x / (1 + abs(bias)), -x * prob)
    - z = where(isnan(y), 0, clamp(y, -2, 2)) + max(rcp(s), sqrt(abs(x))) - exp(min(x, 0)) + log(1 + abs(y))
    - d = fma(z, s, bias) - square(y) + sigmoid(x) * relu(-y)
  outputs:
    d: {dtype: float32}
choices:
  bias_dtype: [float32]
  tile_m: [128]
  tile_n: [256]
  cluster_m: [1]
  cluster_n: [1]
defaults: {}
"""

LANE_CASES = [
    ("grouped_gemm_srelu", {}),
    ("grouped_gemm_srelu", {"bias_dtype": "bfloat16", "tanh_clamp_scale": 1.5}),
    ("grouped_gemm_quant", {}),
    ("grouped_gemm_quant", {"bias_dtype": "bfloat16"}),
    ("grouped_gemm_dswiglu", {}),
    ("grouped_gemm", {"bias_dtype": "float32"}),
    ("grouped_gemm_swiglu", {}),          # a paired accumulator (gate, up)
    ("all_forms", {}),
]


def _lane_variant(spec: str, choices: dict):
    s = parse_spec(ALL_FORMS_SPEC, "demo.yaml", expected_name="demo") if spec == "all_forms" else spec
    v = make_variant(s, arch="sm_100a")
    return dataclasses.replace(v, vector_f32=True, **choices)


@pytest.mark.parametrize("spec,choices", LANE_CASES, ids=[f"{s}-{'-'.join(map(str, c.values())) or 'default'}"
                                                          for s, c in LANE_CASES])
def test_packed_rule_lanes_are_the_scalar_rule(spec, choices, tmp_path):
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("needs a host C++ compiler (g++ or clang++)")
    v = _lane_variant(spec, choices)
    text = render(v).text
    start = text.index("struct Rule {")
    rule = text[start:text.index("\n};\n", start) + 4]
    assert "apply2(" in rule
    model = rule_of(v, registry.resolve(v.kernel, v.arch, v.choices))
    members = " ".join(f"r.{ld.field} = rnd();" for ld in model.expert_loads + model.scalar_loads)
    row = " ".join(f"ri.{ld.field} = rnd();" for ld in model.row_loads)
    elems = " ".join(f"e0.{ld.field} = rnd(); e1.{ld.field} = rnd();" for ld in model.column_loads + model.element_loads)
    main = HOST_MAIN.replace("{members}", members).replace("{row}", row).replace("{elems}", elems)
    src = tmp_path / "lanes.cpp"
    src.write_text(HOST_SHIM + rule + main)
    exe = tmp_path / "lanes"
    built = subprocess.run([cxx, "-std=c++17", "-O1", "-ffp-contract=off", "-w", str(src), "-o", str(exe)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and ran.stdout.strip() == "ok", ran.stdout + ran.stderr


# ============================================================================================
# 3. torch.float4_e2m1fn_x2 A / B (the seeds list it beside uint8)
# ============================================================================================
def _fp4(family="grouped_gemm_srelu", **over):
    pb = make_grouped_problem(family, num_experts=2, tokens=[256, 256], n=256, k=256,
                              ab_dtype="float4_e2m1fn_x2", seed=0)
    kw = {k: _cpu(v) for k, v in pb.kwargs(d_dtype="bfloat16").items()}
    kw.update(over)
    return kw


def _as_fp4(t):
    return t.view(torch.float4_e2m1fn_x2)


@pytest.mark.parametrize("family", ("grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu"))
def test_float4_operands_are_packed_fp4(family, built_ops):
    kw = _fp4(family)
    assert kw["a_tensor"].dtype == torch.uint8
    for a, b in ((_as_fp4(kw["a_tensor"]), _as_fp4(kw["b_tensor"])), (_as_fp4(kw["a_tensor"]), kw["b_tensor"]),
                 (kw["a_tensor"], _as_fp4(kw["b_tensor"]))):
        with pytest.raises(ArgumentError, match=DEVICE):
            getattr(compat, f"{family}_wrapper_sm100")(**dict(kw, a_tensor=a, b_tensor=b))
    assert {op.variant.ab_dtype for op in built_ops} == {"float4_e2m1fn_x2"}


def test_float4_discrete_b_dtype_and_format_mismatch():
    kw = _fp4()
    with pytest.raises(ArgumentError, match=DEVICE):
        compat.grouped_gemm_srelu_wrapper_sm100(**dict(kw, a_tensor=_as_fp4(kw["a_tensor"]),
                                                       b_dtype=torch.float4_e2m1fn_x2))
    with pytest.raises(ArgumentError, match=r"^b_dtype: got torch\.float8_e4m3fn; allowed: None or "
                                            r"float4_e2m1fn_x2 \(the dtype of a_tensor\)$"):
        compat.grouped_gemm_srelu_wrapper_sm100(**dict(kw, a_tensor=_as_fp4(kw["a_tensor"]),
                                                       b_dtype=torch.float8_e4m3fn))
    fp8 = base("grouped_gemm_srelu")
    with pytest.raises(ArgumentError, match=r"^b_tensor\.dtype: got float4_e2m1fn_x2; allowed: float8_e4m3fn$"):
        compat.grouped_gemm_srelu_wrapper_sm100(**dict(fp8, b_tensor=torch.zeros(256, 128, 3, dtype=torch.uint8)
                                                       .view(torch.float4_e2m1fn_x2)))


def test_float4_gemm_amax_operands_and_uint8_c(built_ops):
    pb = make_batched_problem(m=256, n=256, k=256, batch=2, ab_dtype="float4_e2m1fn_x2", seed=0)
    kw = {k: _cpu(v) for k, v in pb.kwargs(c_dtype="bfloat16").items()}
    for c_dtype in (torch.float4_e2m1fn_x2, torch.uint8, "bfloat16"):
        with pytest.raises(ArgumentError, match=DEVICE):
            compat.gemm_amax_wrapper_sm100(**dict(kw, a_tensor=_as_fp4(kw["a_tensor"]), b_tensor=_as_fp4(kw["b_tensor"]),
                                                  c_dtype=c_dtype))
    assert [op.variant.c_dtype for op in built_ops] == ["float4_e2m1fn_x2", "float4_e2m1fn_x2", "bfloat16"]
    assert {op.variant.ab_dtype for op in built_ops} == {"float4_e2m1fn_x2"}


def test_float4_class_samples_and_outputs():
    """Seed 002's class with FP8 A/B and a packed FP4 D given as torch.float4_e2m1fn_x2 (the
    outputs (M, N / 2, 1)), and an FP4 GemmAmax with its packed C."""
    kw = base("grouped_gemm_srelu")
    m, n = kw["a_tensor"].shape[0], kw["b_tensor"].shape[0]
    d4 = torch.zeros(m, n // 2, 1, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    sfd_row = torch.zeros(1, m // 128, 2, 32, 4, 4, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    sfd_col = torch.zeros(1, n // 128, (m // 32 + 3) // 4, 32, 4, 4, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    op = compat.GroupedGemmSreluSm100(sample_a=kw["a_tensor"], sample_b=kw["b_tensor"], sample_d=d4,
                                      sample_sfa=kw["sfa_tensor"], sample_sfb=kw["sfb_tensor"], sf_vec_size=32,
                                      discrete_col_sfd=True)
    assert op.op.variant.d_dtype == "float4_e2m1fn_x2"
    ins = {k: kw[k] for k in ("a_tensor", "b_tensor", "sfa_tensor", "sfb_tensor", "padded_offsets", "alpha_tensor",
                              "prob_tensor", "norm_const_tensor")}
    with pytest.raises(ArgumentError, match=DEVICE):
        op.execute(**ins, c_tensor=torch.zeros(m, n, 1, dtype=torch.bfloat16), d_tensor=d4, d_col_tensor=d4.clone(),
                   sfd_row_tensor=sfd_row, sfd_col_tensor=sfd_col)
    pb = make_batched_problem(m=256, n=256, k=256, batch=2, ab_dtype="float4_e2m1fn_x2", seed=0)
    kb = {k: _cpu(v) for k, v in pb.kwargs().items()}
    c4 = torch.zeros(2, 256, 128, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).permute(1, 2, 0)   # (M, N/2, L)
    amax = compat.GemmAmaxSm100(_as_fp4(kb["a_tensor"]), _as_fp4(kb["b_tensor"]), kb["sfa_tensor"], kb["sfb_tensor"],
                                c4, sf_vec_size=kb["sf_vec_size"])
    assert amax.op.variant.c_dtype == "float4_e2m1fn_x2"
    with pytest.raises(ArgumentError, match=DEVICE):
        amax.execute(_as_fp4(kb["a_tensor"]), _as_fp4(kb["b_tensor"]), kb["sfa_tensor"], kb["sfb_tensor"], c4,
                     torch.zeros(1, 1, 1))
    with pytest.raises(ArgumentError, match=r"^c_tensor\.shape: got \(256, 256, 2\); allowed: \(256, 128, 2\) = "
                                            r"\(M, N // 2, L\): packed FP4$"):
        amax.execute(kb["a_tensor"], kb["b_tensor"], kb["sfa_tensor"], kb["sfb_tensor"],
                     torch.zeros(2, 256, 256, dtype=torch.uint8).permute(1, 2, 0), torch.zeros(1, 1, 1))


# ============================================================================================
# 4. Seed 002's discrete class mode: num_experts=, b_shape=(N, K), b_dtype=; b_ptrs at execute
# ============================================================================================
def _discrete_samples(**over):
    kw = base("grouped_gemm_srelu")
    s = dict(sample_a=kw["a_tensor"], sample_sfa=kw["sfa_tensor"], sample_padded_offsets=kw["padded_offsets"],
             num_experts=3, b_shape=(256, 256), b_dtype=torch.float8_e4m3fn, sf_vec_size=32)
    s.update(over)
    return s, kw


def _discrete_call(kw, **over):
    m, n = kw["a_tensor"].shape[0], 256
    call = dict(a_tensor=kw["a_tensor"], sfa_tensor=kw["sfa_tensor"], padded_offsets=kw["padded_offsets"],
                alpha_tensor=kw["alpha_tensor"], prob_tensor=kw["prob_tensor"],
                b_ptrs=torch.zeros(3, dtype=torch.int64), sfb_ptrs=torch.zeros(3, dtype=torch.int64),
                c_tensor=torch.zeros(m, n, 1, dtype=torch.bfloat16), d_tensor=torch.zeros(m, n, 1, dtype=torch.bfloat16),
                amax_tensor=torch.zeros(3, 1))
    call.update(over)
    return call


def test_discrete_class_mode():
    samples, kw = _discrete_samples()
    op = compat.GroupedGemmSreluSm100(**samples)
    assert op.op.variant.weight_mode == "discrete"
    assert op.check_support()
    with pytest.raises(ArgumentError, match=DEVICE):
        op.execute(**_discrete_call(kw))
    with pytest.raises(ArgumentError, match=DEVICE):
        op.execute(**_discrete_call(kw, n=256))
    # packed FP4 weights: b_shape's K in elements or as the bytes of a row
    fp4 = _fp4()
    for k in (256, 128):
        fop = compat.GroupedGemmSreluSm100(sample_a=fp4["a_tensor"], sample_sfa=fp4["sfa_tensor"], num_experts=2,
                                           b_shape=(256, k), b_dtype=torch.float4_e2m1fn_x2)
        assert (fop.op.variant.weight_mode, fop.op.variant.ab_dtype) == ("discrete", "float4_e2m1fn_x2")


DISCRETE_ERRORS = [
    ("no_b_shape", dict(b_shape=None), "b_shape: got None; allowed: (N, K). without sample_b (dense weights), "
                                       "discrete weights need num_experts= and b_shape=(N, K)"),
    ("no_num_experts", dict(num_experts=None), "num_experts: got None; allowed: an int (L). without sample_b (dense "
                                               "weights), discrete weights need num_experts= and b_shape=(N, K)"),
    ("num_experts_bool", dict(num_experts=True), "num_experts: got True; allowed: an int from 1 to 1024"),
    ("num_experts_2000", dict(num_experts=2000), "num_experts: got 2000; allowed: an int from 1 to 1024"),
    ("b_shape_k", dict(b_shape=(256, 128)), "b_shape: got (256, 128); allowed: (N, 256): K of sample_a"),
    ("b_shape_n", dict(b_shape=(100, 256)), "b_shape[0] (N): got 100; allowed: a multiple of 8, at least 8 "
                                            "(16-byte output rows)"),
    ("b_shape_str", dict(b_shape="256x256"), "b_shape: got '256x256'; allowed: a pair of ints, e.g. (128, 256)"),
    ("offsets_vs_experts", dict(num_experts=2), "sample_padded_offsets.shape: got (3,); allowed: (2,): num_experts"),
    ("with_sample_b", dict(sample_b=torch.zeros(256, 256, 3, dtype=torch.uint8).view(torch.float8_e4m3fn)),
     "num_experts: got 3; allowed: None with sample_b (dense weights); discrete weights pass num_experts= and "
     "b_shape=(N, K) instead of sample_b"),
    ("with_sample_sfb", dict(sample_sfb=torch.zeros(10)), "sample_sfb: got a tensor; allowed: None with discrete "
                                                          "weights (sfb_ptrs at execute hold each expert's scales)"),
    ("b_dtype_other", dict(b_dtype=torch.float8_e5m2), "b_dtype: got torch.float8_e5m2; allowed: None or "
                                                       "float8_e4m3fn (the dtype of a_tensor)"),
]


@pytest.mark.parametrize("over,message", [pytest.param(o, m, id=i) for i, o, m in DISCRETE_ERRORS])
def test_discrete_class_errors(over, message):
    samples, _ = _discrete_samples(**over)
    with pytest.raises(ArgumentError) as info:
        compat.GroupedGemmSreluSm100(**samples)
    assert str(info.value) == message


def test_discrete_class_execute_errors():
    samples, kw = _discrete_samples()
    op = compat.GroupedGemmSreluSm100(**samples)
    cases = [
        (dict(n=128), "n: got 128; allowed: None or 256 (b_shape[0] of this op)"),
        (dict(padded_offsets=kw["padded_offsets"][:2]), "padded_offsets.shape: got (2,); allowed: (3,): num_experts "
                                                        "of this op"),
        (dict(b_ptrs=None), "b_ptrs: got None; allowed: an (L,) int64 tensor of device pointers. discrete "
                            "weights need both b_ptrs and sfb_ptrs"),
        (dict(sfb_ptrs=None), "sfb_ptrs: got None; allowed: an (L,) int64 tensor of device pointers. discrete "
                              "weights need both b_ptrs and sfb_ptrs"),
    ]
    for over, message in cases:
        with pytest.raises(ArgumentError) as info:
            op.execute(**_discrete_call(kw, **over))
        assert str(info.value) == message
    # a dense op given pointers says which weights it was built for
    dense = compat.GroupedGemmSreluSm100(sample_a=kw["a_tensor"], sample_b=kw["b_tensor"], sample_sfa=kw["sfa_tensor"],
                                         sample_sfb=kw["sfb_tensor"], sf_vec_size=32)
    with pytest.raises(ArgumentError, match=r"^b_tensor/b_ptrs: got b_ptrs; allowed: the dense weights this op was "
                                            r"built for$"):
        dense.execute(**_discrete_call(kw, n=256))


def test_quant_and_dswiglu_classes_document_no_discrete_weights():
    for cls in (compat.GroupedGemmQuantSm100, compat.GroupedGemmDswigluSm100):
        assert "num_experts" not in inspect.signature(cls).parameters   # seeds 003 / 000: dense only


# ============================================================================================
# 5. MN-major FP8 operands: valid where the seed says so, run through a K-major copy on each arch
#    (fusegemm/ops/scaled_layouts.py); discrete N-major weights: UnsupportedError naming the arch
# ============================================================================================
def _mn(t):
    """The same (rows, K, L) values, MN-major: strides (1, rows, rows * K)."""
    return t.permute(2, 1, 0).contiguous().permute(2, 1, 0)


def _n_major_b(b):
    """Dense (N, K, L) B, N-major: strides (1, N, N * K)."""
    return _mn(b)


@pytest.mark.parametrize("arch", ["sm_100a", "sm_90a"])
def test_mn_major_fp8_gemm_amax_is_copied_k_major(monkeypatch, arch):
    """Seed 004's M-major A and N-major B pass the layout checks on both archs: the op is built
    K-major and the call copies them (here, CPU tensors, the call then stops at the device)."""
    monkeypatch.setattr(scaled_seeds, "VALIDATION_ARCH", arch)
    kw = amax_base()
    for changed in ({"a_tensor": _mn(kw["a_tensor"])}, {"b_tensor": _mn(kw["b_tensor"])},
                    {"a_tensor": _mn(kw["a_tensor"]), "b_tensor": _mn(kw["b_tensor"])}):
        with pytest.raises(ArgumentError, match=DEVICE):
            compat.gemm_amax_wrapper_sm100(**dict(kw, **changed))
    op = compat.GemmAmaxSm100(_mn(kw["a_tensor"]), _mn(kw["b_tensor"]), kw["sfa_tensor"], kw["sfb_tensor"])
    assert op.check_support()
    assert op.op.host_copies == {"a_major": "a_tensor", "b_major": "b_tensor"}
    assert (op.op.variant.a_major, op.op.variant.b_major) == ("m", "n")
    assert (op.op.kernel_variant.a_major, op.op.kernel_variant.b_major) == ("k", "k")
    with pytest.raises(ArgumentError, match=DEVICE):
        op.execute(_mn(kw["a_tensor"]), _mn(kw["b_tensor"]), kw["sfa_tensor"], kw["sfb_tensor"],
                   torch.zeros(2, 200, 256).permute(1, 2, 0), torch.zeros(1, 1, 1))


def test_mn_major_fp4_is_invalid_on_every_arch():
    pb = make_batched_problem(m=256, n=256, k=256, batch=2, ab_dtype="float4_e2m1fn_x2", seed=0)
    kw = {k: _cpu(v) for k, v in pb.kwargs().items()}
    a = _mn(kw["a_tensor"])
    with pytest.raises(ArgumentError) as info:
        compat.gemm_amax_wrapper_sm100(**dict(kw, a_tensor=a))
    assert str(info.value) == (f"a_tensor.stride: got {tuple(a.stride())}; allowed: K-major (stride 1 along K) on "
                               "every arch: a_major='m' but packed FP4 A/B must be K-major (allowed: ['k']). "
                               "pass a K-major a_tensor")
    # the operand parse alone (no arch) gives the same class of error for each case
    from fusegemm.ops.scaled_operands import parse_batched
    with pytest.raises(ArgumentError, match=r"^a_tensor\.stride: got .*; allowed: K-major \(packed FP4 is K-major "
                                            r"on every arch\)"):
        parse_batched(a, kw["b_tensor"], kw["sfa_tensor"], kw["sfb_tensor"], 16)
    # an MN-major FP8 operand at the parse went to an op built K-major: the hint names the axis
    f8 = amax_base()
    with pytest.raises(ArgumentError) as info:
        parse_batched(_mn(f8["a_tensor"]), f8["b_tensor"], f8["sfa_tensor"], f8["sfb_tensor"], 32)
    assert str(info.value) == ("a_tensor.stride: got (1, 200, 51200); allowed: K-major (stride 1 along K): this op "
                               "was built for K-major operands. build the op with a_major='m' to pass an MN-major "
                               "float8_e4m3fn a_tensor (a K-major copy is made on the device before each launch), "
                               "or pass a K-major a_tensor")


@pytest.mark.parametrize("arch", ["sm_100a", "sm_90a"])
def test_n_major_dense_b_of_the_grouped_seeds(monkeypatch, arch):
    """Seed 000 (dSwiGLU) allows N-major FP8 B: copied K-major on each arch (the CPU call then stops
    at the device); seeds 002 and 003 say dense B is K-major: an ArgumentError on every arch."""
    monkeypatch.setattr(scaled_seeds, "VALIDATION_ARCH", arch)
    ds = base("grouped_gemm_dswiglu")
    with pytest.raises(ArgumentError, match=DEVICE):
        compat.grouped_gemm_dswiglu_wrapper_sm100(**dict(ds, b_tensor=_n_major_b(ds["b_tensor"])))
    sr = base("grouped_gemm_srelu")
    with pytest.raises(ArgumentError) as info:
        compat.grouped_gemm_srelu_wrapper_sm100(**dict(sr, b_tensor=_n_major_b(sr["b_tensor"])))
    assert str(info.value) == (f"b_tensor.stride: got {tuple(_n_major_b(sr['b_tensor']).stride())}; allowed: K-major "
                               "(stride 1 along K) on every arch: b_major='n' but dense B must be K-major; N-major B "
                               "is a discrete-weights FP8 option (allowed: ['k']). pass a K-major b_tensor")
    qu = base("grouped_gemm_quant")
    with pytest.raises(ArgumentError, match=r"^b_tensor\.stride: got .*; allowed: K-major \(stride 1 along K\) on "
                                            r"every arch: grouped_gemm_quant offers b_major \['k'\] only\. pass a "
                                            r"K-major b_tensor$"):
        compat.grouped_gemm_quant_wrapper_sm100(**dict(qu, b_tensor=_n_major_b(qu["b_tensor"])))


def test_k_major_copies_keep_every_value():
    """What the copy makes (scaled_layouts.k_major_operands): for each MN-major layout of a
    block-scaled operand, a K-major tensor of the same logical shape and values; a K-major
    operand is passed through as the same object."""
    from fusegemm.ops.scaled_layouts import k_major_operands
    from fusegemm.ops.engine import Op
    g = torch.Generator().manual_seed(3)
    def fp8(*shape):
        return torch.randn(*shape, generator=g).to(torch.float8_e4m3fn)
    amax = Op("gemm_amax", arch="sm_90a", a_major="m", b_major="n")
    a, b = fp8(2, 192, 128), fp8(2, 64, 128)                   # (L, rows, K) row-major
    a_mn, b_mn = _mn(a.permute(1, 2, 0)), _mn(b.permute(1, 2, 0))  # (rows, K, L), rows contiguous
    assert a_mn.stride()[0] == 1 and b_mn.stride()[0] == 1
    (ca, cb, *_), _, _ = k_major_operands(amax, (a_mn, b_mn, None, None), {}, None)
    for got, want in ((ca, a_mn), (cb, b_mn)):
        assert got.shape == want.shape and got.stride()[1] == 1 and got.stride()[0] == want.shape[1]
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    two_d = a_mn[:, :, 0]                                       # (M, K), stride (1, M)
    (c2, *_), _, _ = k_major_operands(amax, (two_d, b_mn, None, None), {}, None)
    assert c2.stride() == (128, 1) and torch.equal(c2.view(torch.uint8), two_d.view(torch.uint8))
    ds = Op("grouped_gemm_dswiglu", arch="sm_90a", b_major="n")
    a_rows, offsets = fp8(256, 128), torch.tensor([0, 128, 256], dtype=torch.int32)
    b_nkl = _n_major_b(fp8(64, 128, 3))                         # kernel-facing (N, K, L), N-major
    for bb in (b_nkl, b_nkl.permute(2, 0, 1)):                  # and canonical (L, N, K)
        (_, _, _, cbb), kw, _ = k_major_operands(ds, (a_rows, None, offsets, bb), {}, None)
        assert cbb.shape == bb.shape and cbb.stride()[-1 if bb.shape[0] == 3 else 1] == 1
        assert torch.equal(cbb.view(torch.uint8), bb.view(torch.uint8))
    k_major = fp8(3, 64, 128)
    (_, _, _, same), _, _ = k_major_operands(ds, (a_rows, None, offsets, k_major), {}, None)
    assert same is k_major


@pytest.mark.parametrize("arch", ["sm_100a", "sm_90a"])
def test_discrete_n_major_b_of_srelu(monkeypatch, arch):
    """Seed 002's discrete N-major weights are copied K-major through the pointer table (the CPU
    call then stops at the device); the op builds the discrete K-major kernel."""
    monkeypatch.setattr(scaled_seeds, "VALIDATION_ARCH", arch)
    kw = base("grouped_gemm_srelu")
    discrete = {k: v for k, v in kw.items() if k not in ("b_tensor", "sfb_tensor")}
    discrete.update(b_ptrs=torch.zeros(3, dtype=torch.int64), sfb_ptrs=torch.zeros(3, dtype=torch.int64), n=256,
                    b_major="n")
    with pytest.raises(ArgumentError, match=DEVICE):
        compat.grouped_gemm_srelu_wrapper_sm100(**discrete)
    with pytest.raises(ArgumentError, match=DEVICE):       # K-major discrete weights run on both
        compat.grouped_gemm_srelu_wrapper_sm100(**dict(discrete, b_major="k"))
    from fusegemm.ops.engine import Op
    op = Op("grouped_gemm_srelu", arch=arch, weight_mode="discrete", b_major="n")
    assert op.host_copies == {"b_major": "b_ptrs"} and op.check_support()
    assert (op.kernel_variant.weight_mode, op.kernel_variant.b_major) == ("discrete", "k")
