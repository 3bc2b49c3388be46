"""Tests of fusegemm.formats: element casts, E8M0 round-up, FP4 packing, block scaling, SF layouts."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fusegemm import formats as F

FP8 = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}
ALL_ML = {
    **FP8,
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
    "float4_e2m1fn": ml_dtypes.float4_e2m1fn,
}


def bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint8)


@pytest.fixture(scope="module")
def awkward_fp32() -> np.ndarray:
    """Random float32 inputs covering NaN, ±Inf, subnormals, zeros, ties and out-of-range values."""
    rng = np.random.default_rng(1234)
    random_bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    spread = (rng.standard_normal(200_000) * 2.0 ** rng.uniform(-40, 40, 200_000)).astype(np.float32)
    specials = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 2**-149, 2**-127, 2**-126,
         448, 464, 465, 470, 480, 1e30, -1e30, 57344, 61440, 61441, 6, 7, 5, 0.25, 0.75, 3.5,
         2**127, 3.4e38, -3.4e38],
        dtype=np.float32,
    )
    return np.concatenate([random_bits, spread, specials])


# ---------------------------------------------------------------- element decode, all codes


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"])
def test_decode_all_256_codes_matches_ml_dtypes(name):
    codes = np.arange(256, dtype=np.uint8)
    expected = codes.view(ALL_ML[name]).astype(np.float32)
    got_typed = F.to_float32(codes.view(ALL_ML[name]))
    got_raw = F.to_float32(codes, dtype=name)
    assert np.array_equal(bits(got_typed.view(np.uint32)), bits(expected.view(np.uint32)))
    assert np.array_equal(got_raw, expected, equal_nan=True)


def test_decode_all_16_fp4_codes():
    codes = np.arange(16, dtype=np.uint8)
    expected = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    literal = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    assert np.array_equal(F.to_float32(codes.view(ml_dtypes.float4_e2m1fn)), expected)
    assert np.array_equal(expected, np.array(literal, np.float32))
    assert np.signbit(F.to_float32(codes.view(ml_dtypes.float4_e2m1fn))[8])


def test_decode_literal_code_values():
    e4m3 = F.to_float32(np.array([0x7E, 0x01, 0x08, 0x38, 0xFE], np.uint8), "float8_e4m3fn")
    assert e4m3.tolist() == [448.0, 2.0**-9, 2.0**-6, 1.0, -448.0]
    assert np.isnan(F.to_float32(np.array([0x7F, 0xFF], np.uint8), "float8_e4m3fn")).all()
    e5m2 = F.to_float32(np.array([0x7B, 0x7C, 0x01, 0x3C], np.uint8), "float8_e5m2")
    assert e5m2.tolist() == [57344.0, np.inf, 2.0**-16, 1.0]
    e8m0 = F.to_float32(np.array([0x00, 0x7F, 0x80, 0xFE, 0xFF], np.uint8), "float8_e8m0fnu")
    assert e8m0[:4].tolist() == [2.0**-127, 1.0, 2.0, 2.0**127] and np.isnan(e8m0[4])


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float4_e2m1fn"])
def test_encode_every_code_value_round_trips(name):
    n = 16 if name == "float4_e2m1fn" else 256
    codes = np.arange(n, dtype=np.uint8)
    values = codes.view(ALL_ML[name]).astype(np.float32)
    finite = np.isfinite(values) if name != "float8_e5m2" else ~np.isnan(values)
    again = F.to_format(values[finite], name)
    assert np.array_equal(bits(again), codes[finite])


# ---------------------------------------------------------------- encode vs ml_dtypes, random


@pytest.mark.parametrize("name", list(ALL_ML))
def test_nearest_matches_ml_dtypes_bit_for_bit(name, awkward_fp32):
    with np.errstate(all="ignore"):
        expected = awkward_fp32.astype(ALL_ML[name])
    got = F.to_format(awkward_fp32, name)
    assert got.dtype == np.dtype(ALL_ML[name])
    assert np.array_equal(bits(got), bits(expected))


@pytest.mark.parametrize("name", list(ALL_ML))
def test_nearest_from_bfloat16_matches_ml_dtypes(name, awkward_fp32):
    with np.errstate(all="ignore"):
        bf = awkward_fp32.astype(ml_dtypes.bfloat16)
        expected = bf.astype(ALL_ML[name])
    assert np.array_equal(bits(F.to_format(bf, name)), bits(expected))


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"])
def test_saturating_matches_ml_dtypes_after_clamp(name, awkward_fp32):
    top = float(ml_dtypes.finfo(ALL_ML[name]).max)
    with np.errstate(all="ignore"):
        clipped = np.clip(awkward_fp32, -top, top)
        if name == "float4_e2m1fn":                     # no NaN encoding: cvt.satfinite gives +6
            clipped = np.where(np.isnan(awkward_fp32), np.float32(top), clipped)
        expected = clipped.astype(ALL_ML[name])
    got = F.to_format(awkward_fp32, name, saturate=True)
    assert np.array_equal(bits(got), bits(expected))
    decoded = got.astype(np.float32)
    finite_in = ~np.isnan(awkward_fp32)
    assert np.all(np.abs(decoded[finite_in]) <= top)  # nothing overflows to NaN/Inf
    if name != "float4_e2m1fn":
        assert np.array_equal(np.isnan(decoded), np.isnan(awkward_fp32))  # NaN stays NaN
    else:
        assert np.all(bits(got)[np.isnan(awkward_fp32)] == 0x7)           # NaN -> +6, whatever its sign


def test_saturation_literals():
    x = np.array([470.0, -470.0, np.inf, -np.inf, np.nan, 464.0, 1e6], np.float32)
    plain = F.to_format(x, "float8_e4m3fn").astype(np.float32)
    sat = F.to_format(x, "float8_e4m3fn", saturate=True).astype(np.float32)
    assert np.isnan(plain[[0, 1, 2, 3, 4, 6]]).all() and plain[5] == 448.0  # 464 ties to even 448
    assert sat[[0, 1, 2, 3, 5, 6]].tolist() == [448, -448, 448, -448, 448, 448] and np.isnan(sat[4])
    e5 = F.to_format(np.array([1e6, -np.inf, 61440], np.float32), "float8_e5m2")
    assert e5.astype(np.float32).tolist() == [np.inf, -np.inf, np.inf]  # ml_dtypes: no saturation
    e5s = F.to_format(np.array([1e6, -np.inf, 61440], np.float32), "float8_e5m2", saturate=True)
    assert e5s.astype(np.float32).tolist() == [57344, -57344, 57344]


# ---------------------------------------------------------------- E8M0 round-up


def cuda_e8m0_round_up(x: np.ndarray, satfinite: bool) -> np.ndarray:
    """Port of CUDA's host emulation of cvt.rp[.satfinite].ue8m0x2.f32 (cuda_fp8.hpp)."""
    ux = x.astype(np.float32).view(np.uint32) & np.uint32(0x7FFFFFFF)  # |x|
    nan = ux > 0x7F800000
    round_bf16 = (ux < 0x7F800000) & ((ux & 0xFFFF) != 0)
    bf = np.where(nan, 0x7FFF, np.where(round_bf16, (ux >> 16) + 1, ux >> 16)).astype(np.uint32)
    res = (bf >> 7) & 0xFF
    up = ((bf & 0x7F) != 0) & ((bf & 0x7FFF) > 0x40) & ((bf & 0x7FFF) < 0x7F80)
    res = res + up
    if satfinite:
        res = np.where(((bf & 0x7FFF) <= 0x7F80) & (res == 0xFF), 0xFE, res)
    return res.astype(np.uint8)


@pytest.mark.parametrize("saturate", [True, False])
def test_e8m0_round_up_matches_cuda_emulation(saturate, awkward_fp32):
    got = F.to_format(awkward_fp32, "float8_e8m0fnu", rounding="up", saturate=saturate)
    assert np.array_equal(bits(got), cuda_e8m0_round_up(awkward_fp32, saturate))


def test_e8m0_round_up_literals():
    x = np.array(
        [3.0, 4.0, 1.0, 0.5, 1.0000001, 0.75, 2.0**127, 2.0**-127, 2.0**-126, 1e-45, 0.0, -3.0],
        np.float32,
    )
    up = bits(F.to_format(x, "float8_e8m0fnu", rounding="up", saturate=True))
    assert up.tolist() == [0x81, 0x81, 0x7F, 0x7E, 0x80, 0x7F, 0xFE, 0x00, 0x01, 0x00, 0x00, 0x81]
    assert F.to_format(np.float32(3.0), "float8_e8m0fnu", rounding="up").astype(np.float32) == 4.0
    specials = np.array([np.nan, np.inf, 2.0**127 * 1.5, 3.4e38], np.float32)
    assert bits(F.to_format(specials, "float8_e8m0fnu", rounding="up", saturate=True)).tolist() == [
        0xFF, 0xFE, 0xFE, 0xFE]
    assert bits(F.to_format(specials, "float8_e8m0fnu", rounding="up", saturate=False)).tolist() == [
        0xFF, 0xFF, 0xFF, 0xFF]
    # Round-to-nearest (ml_dtypes) differs: 3.0 -> 4 (tie), 2.9 -> 2, 0 -> NaN.
    near = F.to_format(np.array([3.0, 2.9, 0.0], np.float32), "float8_e8m0fnu").astype(np.float32)
    assert near[:2].tolist() == [4.0, 2.0] and np.isnan(near[2])


def test_e8m0_round_up_never_rounds_down(awkward_fp32):
    mag = np.abs(awkward_fp32)
    ok = np.isfinite(mag) & (mag > 2.0**-127) & (mag <= 2.0**127)
    q = F.to_float32(F.to_format(mag[ok], "float8_e8m0fnu", rounding="up")).astype(np.float64)
    assert np.all(q >= mag[ok]) and np.all(q / 2 < mag[ok])


def test_round_up_only_for_e8m0():
    with pytest.raises(ValueError, match=r"^rounding='up' is only defined for float8_e8m0fnu; got dtype='float8_e4m3fn'"):
        F.to_format(np.ones(2, np.float32), "float8_e4m3fn", rounding="up")
    with pytest.raises(ValueError, match=r"rounding='down' is not supported; allowed: nearest, up"):
        F.to_format(np.ones(2, np.float32), "float8_e8m0fnu", rounding="down")
    with pytest.raises(ValueError, match=r"dtype='int4' is not supported; allowed: float8_e4m3fn"):
        F.to_format(np.ones(2, np.float32), "int4")


# ---------------------------------------------------------------- FP4 packing


def test_fp4_pack_literal_even_element_low_nibble():
    x = np.array([[1.0, -2.0, 0.5, 6.0]], np.float32)  # codes 0x2, 0xC, 0x1, 0x7
    packed = F.pack_fp4(x)
    assert packed.dtype == np.uint8 and packed.tolist() == [[0xC2, 0x71]]
    assert F.unpack_fp4(packed).astype(np.float32).tolist() == x.tolist()
    assert F.to_float32(packed, "float4_e2m1fn_x2").tolist() == x.tolist()
    assert np.array_equal(F.to_format(x, "float4_e2m1fn_x2"), packed)


def test_fp4_pack_round_trip_random():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (5, 7, 64), dtype=np.uint8).view(ml_dtypes.float4_e2m1fn)
    packed = F.pack_fp4(codes)
    assert packed.shape == (5, 7, 32)
    assert np.array_equal(F.unpack_fp4(packed).view(np.uint8), codes.view(np.uint8))


def test_fp4_pack_rejects_odd_k_and_uint8_decode_needs_dtype():
    with pytest.raises(ValueError, match=r"even last axis.*got shape \(2, 3\)"):
        F.pack_fp4(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="ambiguous"):
        F.to_float32(np.zeros(4, np.uint8))


def test_torch_tensors_are_accepted():
    torch = pytest.importorskip("torch")
    x = torch.linspace(-500, 500, 257, dtype=torch.float32)
    assert np.array_equal(
        bits(F.to_format(x.to(torch.bfloat16), "float8_e4m3fn", saturate=True)),
        bits(F.to_format(x.numpy().astype(ml_dtypes.bfloat16), "float8_e4m3fn", saturate=True)),
    )
    t8 = x.to(torch.float8_e4m3fn)
    assert np.array_equal(F.to_float32(t8), t8.to(torch.float32).numpy(), equal_nan=True)
    assert F.resolve_dtype(torch.float8_e8m0fnu, argument="x", allowed=("float8_e8m0fnu",)) == "float8_e8m0fnu"


# ---------------------------------------------------------------- block quantization


BLOCK_CASES = [
    ("float8_e4m3fn", "float8_e8m0fnu", 32, 3, 2.0**-10),
    ("float8_e5m2", "float8_e8m0fnu", 32, 2, 2.0**-17),
    ("float4_e2m1fn_x2", "float8_e4m3fn", 16, 1, 0.25),
    ("float4_e2m1fn_x2", "float8_e8m0fnu", 16, 1, 0.25),
    ("uint8", "float8_e8m0fnu", 32, 1, 0.25),
]


@pytest.mark.parametrize("ab,sf,vec,mant,half_sub", BLOCK_CASES)
def test_block_quantize_round_trip_within_format_precision(ab, sf, vec, mant, half_sub):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((6, 96)) * 2.0 ** rng.integers(-8, 8, (6, 1))).astype(np.float32)
    data, scales = F.quantize_blockwise(x, ab_dtype=ab, sf_dtype=sf, sf_vec_size=vec)
    assert scales.shape == (6, 96 // vec) and scales.dtype == np.dtype(ml_dtypes.__dict__[sf])
    assert data.shape == ((6, 48) if ab in ("uint8", "float4_e2m1fn_x2") else (6, 96))
    back = F.dequantize_blockwise(data, scales, sf_vec_size=vec)
    scale_per_elem = np.repeat(F.to_float32(scales), vec, axis=1)
    bound = np.abs(x) * 2.0 ** -(mant + 1) + half_sub * scale_per_elem
    assert np.all(np.abs(back - x) <= bound * (1 + 1e-6))


def test_block_scale_choice_literals():
    blocks = np.zeros((4, 32), np.float32)
    blocks[0, 5], blocks[1, 5], blocks[2, 5], blocks[3, 5] = 448.0, 449.0, -1.0, 0.0
    data, scales = F.quantize_blockwise(blocks, ab_dtype="float8_e4m3fn")
    # amax / 448 rounded up to a power of two: 1, 2 (449 > 448), 2^-8 (1/448 -> 1/256), 2^-127
    assert bits(scales).ravel().tolist() == [127, 128, 119, 0]
    assert F.to_float32(data)[:3, 5].tolist() == [448.0, 224.0, -256.0]
    nv = np.zeros((2, 16), np.float32)
    nv[0, 0], nv[1, 0] = 6.0, 7.0
    data, scales = F.quantize_blockwise(nv, ab_dtype="float4_e2m1fn_x2", sf_dtype="float8_e4m3fn", sf_vec_size=16)
    # e4m3 scale: smallest e4m3 >= amax/6: 6 -> 1.0, 7 -> 7/6 = 1.1667 -> 1.25
    assert F.to_float32(scales).ravel().tolist() == [1.0, 1.25]
    assert F.to_float32(data, "float4_e2m1fn_x2")[:, 0].tolist() == [6.0, 6.0]  # 7/1.25=5.6 -> 6


def test_block_max_element_lands_in_top_binade():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((50, 64)).astype(np.float32)
    data, _ = F.quantize_blockwise(x, ab_dtype="float8_e4m3fn")
    top = np.abs(F.to_float32(data)).reshape(50, 2, 32).max(-1)
    assert np.all((top >= 224) & (top <= 448))  # amax/scale in (224, 448], then RNE


def test_block_nan_poisons_only_its_block():
    x = np.ones((1, 64), np.float32)
    x[0, 3] = np.nan
    data, scales = F.quantize_blockwise(x, ab_dtype="float8_e4m3fn")
    back = F.dequantize_blockwise(data, scales, sf_vec_size=32)
    assert np.isnan(back[0, :32]).all() and np.array_equal(back[0, 32:], np.ones(32))


@pytest.mark.parametrize(
    "ab,sf,vec,message",
    [
        ("float4_e2m1fn_x2", "float8_e4m3fn", 32, r"^sf_vec_size=32 is not allowed with sf_dtype='float8_e4m3fn'"),
        ("float8_e4m3fn", "float8_e8m0fnu", 16, r"^sf_vec_size=16 is not allowed with ab_dtype='float8_e4m3fn'; FP8"),
        ("float8_e5m2", "float8_e4m3fn", 32, r"sf_vec_size=32 is not allowed with sf_dtype='float8_e4m3fn'"),
        ("float8_e4m3fn", "float8_e8m0fnu", 64, r"^sf_vec_size=64 is not supported; allowed: 16, 32$"),
        ("bfloat16", "float8_e8m0fnu", 32, r"^ab_dtype='bfloat16' is not supported; allowed: float8_e4m3fn"),
        ("float8_e4m3fn", "float16", 32, r"^sf_dtype='float16' is not supported; allowed: float8_e8m0fnu, float8_e4m3fn$"),
    ],
)
def test_block_format_rejects_bad_combinations(ab, sf, vec, message):
    with pytest.raises(ValueError, match=message):
        F.quantize_blockwise(np.zeros((1, 64), np.float32), ab_dtype=ab, sf_dtype=sf, sf_vec_size=vec)


def test_block_format_names():
    assert F.block_format("float8_e5m2", "float8_e8m0fnu", 32).name == "mxfp8"
    assert F.block_format("uint8", "float8_e4m3fn", 16).name == "nvfp4"
    assert F.block_format("float4_e2m1fn_x2", "float8_e8m0fnu", 32).name == "mxfp4"


def test_block_quantize_accepts_torch_and_bf16():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    d1, s1 = F.quantize_blockwise(x, ab_dtype="float8_e4m3fn")
    d2, s2 = F.quantize_blockwise(x.float().numpy(), ab_dtype="float8_e4m3fn")
    assert np.array_equal(bits(d1), bits(d2)) and np.array_equal(bits(s1), bits(s2))


# ---------------------------------------------------------------- scale-factor atom layout


@pytest.mark.parametrize("mn,sfk,l", [(1, 1, 1), (127, 3, 2), (128, 4, 1), (129, 5, 3), (300, 9, 2), (256, 8, 1)])
def test_sf_pack_unpack_round_trip(mn, sfk, l):
    rng = np.random.default_rng(mn * 100 + sfk)
    sf = rng.integers(1, 255, (mn, sfk, l), dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
    phys = F.pack_sf(sf)
    assert phys.shape == F.sf_physical_shape(mn, sfk, l) and phys.flags.c_contiguous
    assert phys.dtype == sf.dtype
    view = F.sf_to_kernel_view(phys)
    assert view.shape == F.sf_view_shape(mn, sfk, l) and np.shares_memory(view, phys)
    for form in (phys, view, phys.ravel()):
        assert np.array_equal(bits(F.unpack_sf(form, mn, sfk)), bits(sf))
    lmk = np.moveaxis(sf, -1, 0)
    assert np.array_equal(bits(F.pack_sf(lmk, batch_first=True)), bits(phys))
    assert np.array_equal(bits(F.unpack_sf(view, mn, sfk, batch_first=True)), bits(lmk))
    assert np.count_nonzero(phys.view(np.uint8)) == mn * sfk * l  # padding is zero bytes
    assert np.shares_memory(F.sf_from_kernel_view(view), phys)


def test_sf_two_tile_mapping_literal_offsets():
    """mn = 256 (two 128-row tiles), sfk = 8 (two 4-column tiles): physical (1, 2, 2, 32, 4, 4).

    Byte offset = (m//128)*1024 + (k//4)*512 + (m%32)*16 + ((m%128)//32)*4 + k%4, written out.
    """
    sf = np.zeros((256, 8), np.uint8)
    cases = [  # (m, k, byte offset, kernel-view index)
        (0, 0, 0, (0, 0, 0, 0, 0, 0)),
        (1, 0, 16, (1, 0, 0, 0, 0, 0)),
        (32, 0, 4, (0, 1, 0, 0, 0, 0)),
        (0, 1, 1, (0, 0, 0, 1, 0, 0)),
        (0, 4, 512, (0, 0, 0, 0, 1, 0)),
        (128, 0, 1024, (0, 0, 1, 0, 0, 0)),
        (200, 5, 1673, (8, 2, 1, 1, 1, 0)),
        (97, 6, 542, (1, 3, 0, 2, 1, 0)),
        (255, 7, 2047, (31, 3, 1, 3, 1, 0)),
    ]
    for i, (m, k, _, _) in enumerate(cases):
        sf[m, k] = i + 1
    phys = F.pack_sf(sf)
    assert phys.shape == (1, 2, 2, 32, 4, 4)
    flat = phys.ravel()
    view = F.sf_to_kernel_view(phys)
    assert view.shape == (32, 4, 2, 4, 2, 1)
    for i, (m, k, offset, index) in enumerate(cases):
        assert flat[offset] == i + 1, (m, k, offset)
        assert view[index] == i + 1, (m, k, index)
    assert np.count_nonzero(flat) == len(cases)


def test_sf_flat_and_shape_errors():
    with pytest.raises(ValueError, match=r"flat with 100 elements; expected a positive multiple of 512"):
        F.unpack_sf(np.zeros(100, np.uint8), 128, 4)
    with pytest.raises(ValueError, match=r"has shape \(1, 2, 1, 32, 4, 4\), which does not hold scales for mn=128"):
        F.unpack_sf(np.zeros((1, 2, 1, 32, 4, 4), np.uint8), 128, 4)
    with pytest.raises(ValueError, match=r"sf must be 2-D \(mn, sfk\) or 3-D; got shape \(5,\)"):
        F.pack_sf(np.zeros(5, np.uint8))


def test_discrete_col_sfd_literal_offsets():
    """N = 256 (NT = 2), experts of 256, 0 and 512 rows (offsets 256, 256, 768), M = 768 (RM = 6)."""
    offsets = np.array([256, 256, 768], np.int32)
    sf = np.zeros((256, 24), np.uint8)  # sf[n, m // 32]
    cases = [  # (n, m, discrete byte offset, default byte offset)
        (0, 0, 0, 0),
        (130, 40, 1057, 3105),  # expert 0, column tile 1 -> atom 1*2 + 0
        (5, 300, 2129, 1105),  # expert 2 starts at atom 256/128*2 = 4 -> byte 2048
        (200, 700, 5769, 5769),  # expert 2, atom 4 + 1*4 + 3
        (129, 500, 4627, 4627),  # expert 2, atom 4 + 1*4 + 1
    ]
    for i, (n, m, _, _) in enumerate(cases):
        sf[n, m // 32] = i + 1
    discrete = F.pack_sf_discrete_col(sf, offsets, rows=768).ravel()
    default = F.pack_sf(sf).ravel()
    assert discrete.size == default.size == 2 * 6 * 512
    for i, (n, m, d_off, p_off) in enumerate(cases):
        assert discrete[d_off] == i + 1, (n, m, d_off)
        assert default[p_off] == i + 1, (n, m, p_off)
    back = F.unpack_sf_discrete_col(discrete.reshape(1, 2, 6, 32, 4, 4), 256, 768, offsets)
    assert np.array_equal(back, sf)


def test_discrete_col_sfd_is_concatenation_of_expert_packs():
    rng = np.random.default_rng(5)
    offsets = np.array([512, 512, 768, 1280], np.int32)
    sf = rng.integers(1, 255, (200, 1280 // 32), dtype=np.uint8)
    discrete = F.pack_sf_discrete_col(sf, offsets, rows=1280).ravel()
    pieces = [F.pack_sf(sf[:, a // 32 : b // 32]).ravel() for a, b in [(0, 512), (512, 768), (768, 1280)]]
    assert np.array_equal(discrete, np.concatenate(pieces))
    assert np.array_equal(F.unpack_sf_discrete_col(discrete, 200, 1280, offsets), sf)


# ---------------------------------------------------------------- canonical <-> kernel views


def test_views_shapes_strides_and_round_trips():
    b = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)  # (L, N, K)
    bk = F.b_to_kernel(b)
    assert bk.shape == (3, 5, 2) and bk.strides == (5 * 4, 4, 15 * 4) and np.shares_memory(bk, b)
    assert bk[1, 4, 1] == b[1, 1, 4]
    assert F.b_from_kernel(bk) is not None and np.array_equal(F.b_from_kernel(bk), b)
    a = np.zeros((4, 6), np.float32)
    assert F.a_to_kernel(a).shape == (4, 6, 1) and F.a_to_kernel(a).strides == (24, 4, 96)
    assert F.a_from_kernel(F.a_to_kernel(a)).shape == (4, 6)
    p = np.arange(4, dtype=np.float32)
    assert F.prob_to_kernel(p).shape == (4, 1, 1) and F.prob_to_kernel(p).strides == (4, 4, 4)
    assert np.array_equal(F.prob_from_kernel(F.prob_to_kernel(p)), p)
    assert F.cd_to_kernel(a).strides == (24, 4, 96) and F.cd_from_kernel(F.cd_to_kernel(a)).shape == (4, 6)
    for dtype in (ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fn, ml_dtypes.bfloat16, np.uint8):
        view = F.cd_to_kernel(np.zeros((4, 6), dtype))  # every element dtype, exact strides
        assert view.dtype == np.dtype(dtype) and view.strides[2] == 24 * np.dtype(dtype).itemsize
    with pytest.raises(ValueError, match=r"^a must have shape \(M, K, 1\); got \(4, 6, 2\)$"):
        F.a_from_kernel(np.zeros((4, 6, 2)))


def test_views_work_on_torch():
    torch = pytest.importorskip("torch")
    b = torch.arange(30, dtype=torch.float32).reshape(2, 3, 5)
    bk = F.b_to_kernel(b)
    assert tuple(bk.shape) == (3, 5, 2) and bk.stride() == (5, 1, 15)
    assert torch.equal(F.b_from_kernel(bk), b)
    assert F.a_to_kernel(b[0]).stride() == (5, 1, 15)
    assert F.prob_to_kernel(torch.zeros(7)).stride() == (1, 1, 1)
    phys = torch.zeros((2, 1, 1, 32, 4, 4), dtype=torch.uint8)
    view = F.sf_to_kernel_view(phys)
    assert tuple(view.shape) == (32, 4, 1, 4, 1, 2)
    assert tuple(F.sf_from_kernel_view(view).shape) == (2, 1, 1, 32, 4, 4)


def correctly_rounded(x: np.ndarray, name: str) -> np.ndarray:
    """Brute force: nearest finite code value, ties to the even code (saturating first)."""
    n = 16 if name == "float4_e2m1fn" else 256
    grid = np.arange(n, dtype=np.uint8).view(ALL_ML[name]).astype(np.float64)
    keep = np.isfinite(grid) & ~((grid == 0) & np.signbit(grid))
    values, codes_ = grid[keep], np.arange(n)[keep]
    order = np.argsort(values)
    values, codes_ = values[order], codes_[order]
    top = values[-1]
    xc = np.clip(x, -top, top)
    hi = np.clip(np.searchsorted(values, xc), 1, len(values) - 1)
    lo = hi - 1
    d_lo, d_hi = xc - values[lo], values[hi] - xc
    pick = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(codes_[lo] % 2 == 0, lo, hi)))
    return values[pick]


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"])
def test_float64_input_is_rounded_once(name):
    rng = np.random.default_rng(9)
    n = 16 if name == "float4_e2m1fn" else 256
    grid = np.unique(np.abs(np.arange(n, dtype=np.uint8).view(ALL_ML[name]).astype(np.float64)))
    grid = grid[np.isfinite(grid)]
    mids = (grid[1:] + grid[:-1]) / 2
    nudged = np.concatenate([mids, mids * (1 + 2.0**-40), mids * (1 - 2.0**-40), -mids * (1 + 2.0**-40)])
    x = np.concatenate([nudged, rng.standard_normal(5000) * 2.0 ** rng.integers(-12, 12, 5000)])
    got = F.to_format(x, name, saturate=True).astype(np.float64)
    assert np.array_equal(np.abs(got), np.abs(correctly_rounded(x, name)))
    # the float64 -> float32 -> format path rounds twice: it differs on the nudged midpoints
    twice = F.to_format(x.astype(np.float32), name, saturate=True).astype(np.float64)
    assert not np.array_equal(twice, got)
