"""1x128 output scales (``quantize.vec: 128``, axis ``sfd_vec_size``): an FP8 D quantized with one
FP32 scale per row and 128 columns, the blockwise recipe's activation format, so that fc1's
output is fc2's A as it is. On the CPU: the spec language's checks, the interpreter against
``fusegemm.formats.quantize_1x128`` (an independent float64 quantizer), the registry's refusals,
the op's sfd_row layout and the sm_90a kernels' resources (0 spills)."""
from __future__ import annotations

import numpy as np
import pytest

from fusegemm.base.errors import SpecError, UnsupportedError
from fusegemm.formats import quantize_1x128
from fusegemm.interpret import quantize_1x128_rows
from fusegemm.generator.spec import find_spec, parse_spec
from fusegemm.generator.variants import make_variant

GLU = "grouped_gemm_glu_mx"
BW_1X128 = {"sf_dtype": "float32", "sf_vec_size": 128, "d_dtype": "float8_e4m3fn", "sfd_vec_size": 128}


def _ties(t: np.ndarray, s: np.ndarray, dtype: str) -> np.ndarray:
    """Where fl32(t / s) is exactly halfway between two values of ``dtype``: the only places a
    float32 division followed by a rounding to FP8 may differ from one rounding of the exact
    quotient (quantize_1x128 rounds t / s in float64)."""
    y = (t / s).astype(np.float32)
    mant = {"float8_e4m3fn": 3, "float8_e5m2": 2}[dtype]
    with np.errstate(all="ignore"):
        e = np.floor(np.log2(np.abs(y.astype(np.float64))))
        e = np.maximum(e, {"float8_e4m3fn": -6, "float8_e5m2": -14}[dtype])
        step = np.ldexp(1.0, (e - mant).astype(int))
        return np.abs(y) / step % 1.0 == 0.5


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("cols", [128, 256, 300, 32])
def test_interpreter_matches_the_float64_quantizer(dtype, cols):
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((37, cols)) * np.exp(rng.uniform(-8, 8, (37, 1)))).astype(np.float32)
    x[3, :] = 0.0                        # an all-zero row: the 1e-4 floor
    x[5, 7] = 1e-30                      # a tiny block
    y, s = quantize_1x128_rows(x, np.float32(1.0), dtype)
    ref_q, ref_s = quantize_1x128(x, dtype=dtype)
    assert s.dtype == np.float32 and s.shape == (37, -(-cols // 128))
    np.testing.assert_array_equal(s, ref_s)                      # scales: bit for bit
    from fusegemm.interpret import _store
    q = _store(y, dtype).view(np.uint8)
    ref = np.asarray(ref_q).view(np.uint8)
    diff = q != ref
    tie = _ties(x, np.repeat(s, 128, axis=1)[:, :cols], dtype)
    assert not np.any(diff & ~tie), "bytes differ away from a float32 tie"
    assert diff.mean() < 1e-3


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_pow2_is_the_float64_quantizer_bit_for_bit(dtype):
    """UE8M0 scales: t / s is exact, so the float32 steps give quantize_1x128(scales="pow2")'s bytes."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((41, 300)) * np.exp(rng.uniform(-10, 10, (41, 1)))).astype(np.float32)
    x[2] = 0.0
    x[4, :128] = 448.0 * 2.0 ** -3       # amax / 448 exactly a power of two: kept, not doubled
    y, s = quantize_1x128_rows(x, np.float32(1.0), dtype, pow2=True)
    ref_q, ref_s = quantize_1x128(x, dtype=dtype, scales="pow2")
    np.testing.assert_array_equal(s, ref_s)
    from fusegemm.interpret import _store
    np.testing.assert_array_equal(_store(y, dtype).view(np.uint8), np.asarray(ref_q).view(np.uint8))
    if dtype == "float8_e4m3fn":
        assert s[4, 0] == np.float32(2.0 ** -3)


def test_a_quotient_on_an_fp8_midpoint_rounds_to_even():
    """fl(t / s) exactly halfway between two e4m3 values (0.93750006 / fl(268.80002 / 448) =
    1.5625, between 1.5 and 1.625) rounds to even, 1.5, as the kernel's correctly rounded
    division gives; t * fl(1 / s) is 1.5625001 and would give 1.625."""
    from fusegemm.interpret import _store
    x = np.zeros((1, 128), dtype=np.float32)
    x[0, :2] = np.float32(268.80002), np.float32(0.93750006)
    y, s = quantize_1x128_rows(x, np.float32(1.0), "float8_e4m3fn")
    assert y[0, 1] == np.float32(1.5625)
    assert _store(y, "float8_e4m3fn").view(np.uint8)[0, 1] == 0x3C   # e4m3 1.5


def test_norm_const_scales_what_is_quantized():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    y, s = quantize_1x128_rows(x, np.float32(0.5), "float8_e4m3fn")
    y1, s1 = quantize_1x128_rows((x * np.float32(0.5)).astype(np.float32), np.float32(1.0), "float8_e4m3fn")
    np.testing.assert_array_equal(s, s1)
    np.testing.assert_array_equal(y, y1)


def test_nan_wins_its_group_only():
    x = np.ones((2, 256), dtype=np.float32)
    x[0, 3] = np.nan
    _, s = quantize_1x128_rows(x, np.float32(1.0), "float8_e4m3fn")
    assert np.isnan(s[0, 0]) and s[0, 1] == np.float32(1.0) / np.float32(448.0) and not np.isnan(s[1]).any()


# ---- the spec language
_SPEC = """
schema: 2
name: user_q128
summary: a user spec with 1x128 output scales
kernel: scaled
epilogue:
  inputs:
    alpha: {per: expert}
    norm_const: {per: scalar}
  compute:
    - y = alpha * acc
  outputs:
    d: {dtype: d_dtype, value: y, quantize: {norm_const: norm_const, QUANT}}
choices:
  arch: [sm_90a]
  ab_dtype: [float8_e4m3fn]
  sf_dtype: [float32]
  sf_vec_size: [128]
  d_dtype: [float8_e4m3fn]
  SFDAXIS
  tile_m: [128]
  tile_n: [128, 256]
  cluster_m: [1]
  cluster_n: [1]
defaults:
  ab_dtype: float8_e4m3fn
  sf_dtype: float32
  sf_vec_size: 128
  d_dtype: float8_e4m3fn
  tile_m: 128
  tile_n: 256
"""


def _user(quant: str, axis: str = "") -> object:
    text = _SPEC.replace("QUANT", quant).replace("SFDAXIS", axis)
    return parse_spec(text, "user_q128.yaml", expected_name="user_q128")


@pytest.mark.parametrize("quant, axis, match", [
    ("vec: 64", "", r"vec.*got 64; allowed: 32, 128"),
    ("vec: sfd_vec_size", "", r"axis 'sfd_vec_size' is not in this spec's choices"),
    ("vec: tile_n", "", r"allowed: 32, 128 or the axis sfd_vec_size"),
    ("vec: 128, col: d_col", "", r"1x128 blocks .* quantize rows only"),
    ("vec: 128, row: false, col: d_col", "", r"quantize rows only"),
    ("vec: sfd_vec_size, col: d_col", "sfd_vec_size: [32, 128]", r"quantize rows only"),
])
def test_spec_errors_name_the_key(quant, axis, match):
    with pytest.raises(SpecError, match=match):
        _user(quant, axis)


def test_a_literal_128_reaches_the_rule():
    from fusegemm.generator.emit import rule_model
    spec = _user("vec: 128")
    v = make_variant(spec, arch="sm_90a")
    traits = dict(rule_model(spec.epilogue.resolve(v.choices)).traits)
    assert traits["kSfdVec"] == "128"
    assert spec.epilogue.resolve(v.choices).buffers(256, 100, 2)["sfd_row"] == ((2, 100), "float32", 0.0)


def test_the_axis_is_a_source_axis_and_names_the_kernel():
    spec = find_spec(GLU)
    assert {"sfd_vec_size", "sfd_pow2"} <= spec.epilogue.axes_read()
    assert "pow2" in make_variant(spec, arch="sm_90a", sfd_pow2=True, **BW_1X128).readable
    with pytest.raises(UnsupportedError, match="power-of-two scales are an option of the 1x128"):
        make_variant(spec, arch="sm_90a", sfd_pow2=True)     # MX scales (sfd_vec_size 32)
    v32 = make_variant(spec, arch="sm_90a", **{**BW_1X128, "sfd_vec_size": 32})
    v128 = make_variant(spec, arch="sm_90a", **BW_1X128)
    assert "sfd1x128" in v128.readable and "sfd1x128" not in v32.readable
    r = spec.epilogue.resolve(v128.choices)
    assert r.output("d").quantize.vec == 128
    assert r.buffers(512, 1000, 4)["sfd_row"] == ((2, 1000), "float32", 0.0)     # (ceil(256/128), pitch)
    assert r.buffers(512, 1001, 4)["sfd_row"] == ((2, 1004), "float32", 0.0)     # pitch: 16 bytes


@pytest.mark.parametrize("over, match", [
    ({"arch": "sm_100a", "sf_dtype": "float8_e8m0fnu", "sf_vec_size": 32}, r"sf_vec_size=32 but 1x128 output"),
    ({"arch": "sm_90a", "sf_dtype": "float8_e8m0fnu", "sf_vec_size": 32}, r"sf_vec_size"),
    ({"arch": "sm_90a", "d_dtype": "bfloat16"}, r"d_dtype"),
    ({"arch": "sm_90a", "tile_n": 128}, r"tile_n"),
])
def test_refusals_say_why(over, match):
    import fusegemm
    kw = {**BW_1X128, **over}
    with pytest.raises(UnsupportedError, match=match):
        fusegemm.Op(GLU, **kw).check_support()


def test_the_sm100_refusal_names_the_sm90_fragment_epilogue():
    from fusegemm.generator import registry
    with pytest.raises(UnsupportedError, match=r"sfd_vec_size.*sm_90a kernels. fragment epilogue"):
        registry.resolve("grouped_gemm_srelu", "sm_100a",
                         {"sf_vec_size": 32, "sf_dtype": "float8_e8m0fnu", "sfd_vec_size": 128})
    with pytest.raises(UnsupportedError, match=r"sfd_vec_size=128 is not implemented for grouped_gemm_wgrad"):
        registry.resolve("grouped_gemm_wgrad", "sm_90a", {"sfd_vec_size": 128})
    # the BF16 grouped kernel quantizes them on its fragment too, at tile N 256
    tile = {"tile_m": 128, "cluster_m": 1, "cluster_n": 1}
    assert registry.resolve("grouped_gemm", "sm_90a", {"sfd_vec_size": 128, "tile_n": 256, **tile})
    with pytest.raises(UnsupportedError, match=r"tile_n=128 is not implemented.*with sfd_vec_size=128"):
        registry.resolve("grouped_gemm", "sm_90a", {"sfd_vec_size": 128, "tile_n": 128, **tile})


@pytest.mark.parametrize("generate_c,pow2", [(False, False), (True, False), (False, True)])
def test_sm90_kernels_build_without_spills(generate_c, pow2, session_cache):
    from fusegemm.pipeline import get_kernel
    built = get_kernel(make_variant(GLU, arch="sm_90a", generate_c=generate_c, sfd_pow2=pow2, **BW_1X128),
                       session_cache)
    assert built.resources.local_bytes == 0, built.resources      # no register spills
    # no division's slow path: every 1x128 division is div_by_scale with no branch per value
    # (common.cuh ScaleDivisor), the group scales' too (div_by_elem_max); FCHK / CALL are div.rn's
    from fusegemm.runtime import disasm
    if disasm.available():
        ops = disasm.opcodes(disasm.sass(built.cubin))
        assert not [op for op in ops if op.startswith(("FCHK", "CALL"))]


@pytest.mark.parametrize("tile_m,generate_c", [(128, False), (64, True)])
def test_the_bf16_kernel_builds_them_without_spills(tile_m, generate_c, session_cache):
    """grouped_gemm_swiglu (BF16 operands): cooperative and ping-pong tiles, with and without C."""
    from fusegemm.pipeline import get_kernel
    v = make_variant("grouped_gemm_swiglu", arch="sm_90a", d_dtype="float8_e4m3fn", sfd_vec_size=128,
                     generate_c=generate_c, tile_m=tile_m, tile_n=256, cluster_m=1)
    assert "sfd1x128" in v.readable
    built = get_kernel(v, session_cache)
    assert built.resources.local_bytes == 0, built.resources


def test_execute_takes_the_scale_view_or_its_buffer():
    """``execute`` into caller outputs: sfd_row as the (M, ceil(N/128)) view the op returns or as
    its (ceil(N/128), pitch) buffer; another layout is named before anything launches."""
    torch = pytest.importorskip("torch")
    import fusegemm
    from fusegemm.base.errors import ArgumentError
    from fusegemm.formats import blockwise_sfa_layout, quantize_128x128
    op = fusegemm.Op(GLU, arch="sm_90a", **BW_1X128)
    rng = np.random.default_rng(0)
    m, n, k, l = 512, 512, 256, 2
    aq, sa = quantize_1x128(rng.standard_normal((m, k)).astype(np.float32))
    bq, sb = quantize_128x128(rng.standard_normal((l, n, k)))
    fp8 = lambda x: torch.from_numpy(np.asarray(x).view(np.uint8)).view(torch.float8_e4m3fn)  # noqa: E731
    operands = dict(a_tensor=fp8(aq), sfa_tensor=blockwise_sfa_layout(torch.from_numpy(sa)),
                    padded_offsets=torch.tensor([256, 512], dtype=torch.int32), b_tensor=fp8(bq),
                    sfb_tensor=torch.from_numpy(sb))
    ins = {"alpha": torch.ones(l), "prob": torch.ones(m), "norm_const": torch.ones(1)}
    outs = {name: torch.empty(shape, dtype=getattr(torch, store))
            for name, (shape, store, _) in op.epilogue.buffers(n, m, l).items()}
    assert tuple(outs["sfd_row"].shape) == (2, 512)
    for sfd in (outs["sfd_row"], outs["sfd_row"][:, :m].t()):        # the buffer, the view
        with pytest.raises(ArgumentError, match="a_tensor.device"):    # past every output check
            op.execute(**operands, outputs={**outs, "sfd_row": sfd}, inputs=ins)
    with pytest.raises(ArgumentError, match="sfd_row"):
        op.execute(**operands, outputs={**outs, "sfd_row": torch.empty(m, 2)}, inputs=ins)


def test_only_the_scales_take_the_m_major_view():
    """A transposed view of another float32 output (a dbias (L, W)) stays refused: only 1x128
    scales stand for their buffer through the (M, ceil(N/128)) view."""
    torch = pytest.importorskip("torch")
    from fusegemm.base.errors import ArgumentError
    from fusegemm.ops.outputs import native_output
    buf = torch.zeros(4, 8)
    with pytest.raises(ArgumentError, match=r"dbias.shape"):
        native_output(buf.t(), "dbias", (4, 8), "float32")
    got = native_output(buf[:, :6].t(), "sfd_row", (4, 8), "float32", m_major_view=True)
    assert tuple(got.shape) == (4, 8) and got.ptr == buf.data_ptr()
