"""The blockwise FP8 recipe on the CPU: the quantization helpers against torch's own FP8 casts, the
reference's dequantization, the operand checks of ``fusegemm.Op`` (each broken argument named
before anything launches), the registry's refusal on sm_100a and the sm_90a kernels' resources."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.base.errors import ArgumentError, UnsupportedError  # noqa: E402
from fusegemm.formats import (blockwise_sfa_layout, dequantize_1x128, dequantize_128x128,  # noqa: E402
                              quantize_1x128, quantize_128x128, to_float32)

BW = {"sf_dtype": "float32", "sf_vec_size": 128}


def _torch_1x128(x: np.ndarray, fmt) -> tuple[np.ndarray, np.ndarray]:
    """An independent 1x128 quantizer: torch's float8 cast (round to nearest even, no saturation
    needed: |x / s| <= 448 by construction) over blocks padded with zeros."""
    t = torch.from_numpy(x).double()
    k = t.shape[-1]
    pad = -k % 128
    blocks = torch.nn.functional.pad(t, (0, pad)).view(*t.shape[:-1], -1, 128)
    s = (blocks.abs().amax(-1).clamp_min(1e-4) / torch.finfo(fmt).max).float()
    q = (blocks / s.double().unsqueeze(-1)).to(fmt).reshape(*t.shape[:-1], -1)[..., :k]
    return q.view(torch.uint8).numpy(), s.numpy()


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_quantize_1x128_matches_torch(dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((37, 300)) * np.exp(rng.uniform(-3, 3, (37, 1)))).astype(np.float32)
    x[3] = 0.0                                   # an all-zero row: the floor scale, zero elements
    q, s = quantize_1x128(x, dtype)
    tq, ts = _torch_1x128(x, getattr(torch, dtype))
    assert s.shape == (37, 3) and s.dtype == np.float32
    np.testing.assert_array_equal(s, ts)
    np.testing.assert_array_equal(np.asarray(q).view(np.uint8), tq)
    deq = dequantize_1x128(q, s)
    rel = 2.0 ** -4 if dtype == "float8_e4m3fn" else 2.0 ** -3
    assert np.all(np.abs(deq - x) <= rel * np.repeat(s * 448 if dtype == "float8_e4m3fn" else s * 57344, 128,
                                                      axis=1)[:, :300] + 1e-30)


def test_quantize_128x128_blocks():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((2, 200, 260)).astype(np.float32)
    w[1, 128:, :128] *= 1000.0                   # one block far larger: only its scale grows
    q, s = quantize_128x128(w)
    assert s.shape == (2, 2, 3) and s.flags.c_contiguous
    blocks = np.pad(w, ((0, 0), (0, 56), (0, 124))).reshape(2, 2, 128, 3, 128)
    np.testing.assert_array_equal(s, (np.maximum(np.abs(blocks).max(axis=(2, 4)), 1e-4) / 448).astype(np.float32))
    assert s[1, 1, 0] > 500 * s[1, 0, 0]
    deq = dequantize_128x128(q, s)
    full = np.repeat(np.repeat(s, 128, axis=1), 128, axis=2)[:, :200, :260]
    assert np.all(np.abs(deq - w) <= 2.0 ** -4 * 448 * full)
    # each block quantized on its own equals the 1x128 rows of that block with its one scale
    q0 = np.asarray(to_float32(q[0, :128, :128]))
    np.testing.assert_array_equal(q0 * s[0, 0, 0], deq[0, :128, :128])


def _torch_pow2_1x128(x: np.ndarray, fmt) -> tuple[np.ndarray, np.ndarray]:
    """An independent UE8M0 1x128 quantizer: scales 2^ceil(log2(amax / max)) by torch in float64,
    then torch's float8 cast."""
    t = torch.from_numpy(x).double()
    k = t.shape[-1]
    blocks = torch.nn.functional.pad(t, (0, -k % 128)).view(*t.shape[:-1], -1, 128)
    s = torch.exp2(torch.ceil(torch.log2(blocks.abs().amax(-1).clamp_min(1e-4) / torch.finfo(fmt).max)))
    q = (blocks / s.unsqueeze(-1)).to(fmt).reshape(*t.shape[:-1], -1)[..., :k]
    return q.view(torch.uint8).numpy(), s.float().numpy()


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_pow2_scales_match_torch_and_are_e8m0(dtype):
    import ml_dtypes
    fmt = getattr(torch, dtype)
    top = float(torch.finfo(fmt).max)
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((21, 260)) * np.exp(rng.uniform(-6, 6, (21, 1)))).astype(np.float32)
    x[4] = 0.0                                    # the floor's scale, rounded up
    x[5, :128] = 0.0
    x[5, 7] = top * 2.0 ** -3                     # amax / max exactly a power of two: kept, not doubled
    q, s = quantize_1x128(x, dtype, scales="pow2")
    tq, ts = _torch_pow2_1x128(x, fmt)
    np.testing.assert_array_equal(s, ts)
    np.testing.assert_array_equal(np.asarray(q).view(np.uint8), tq)
    assert s[5, 0] == 2.0 ** -3
    assert np.all(np.frexp(s)[0] == 0.5)          # powers of two ...
    np.testing.assert_array_equal(s.astype(ml_dtypes.float8_e8m0fnu).astype(np.float32), s)   # ... E8M0 bytes
    amax = np.maximum(np.abs(np.pad(x, ((0, 0), (0, 124)))).reshape(21, 3, 128).max(-1), 1e-4)
    assert np.all(s >= amax / top) and np.all(s < 2 * amax / top)   # the tightest power of two: no saturation
    w = rng.standard_normal((2, 200, 260)).astype(np.float32)
    qw, sw = quantize_128x128(w, dtype, scales="pow2")
    assert sw.shape == (2, 2, 3) and np.all(np.frexp(sw)[0] == 0.5)
    _, s_amax = quantize_128x128(w, dtype)
    assert np.all(sw >= s_amax) and np.all(sw < 2 * s_amax)
    full = np.repeat(np.repeat(sw, 128, axis=1), 128, axis=2)[:, :200, :260]
    rel = 2.0 ** -4 if dtype == "float8_e4m3fn" else 2.0 ** -3
    assert np.all(np.abs(dequantize_128x128(qw, sw) - w) <= rel * top * full)


def test_scales_argument_is_checked():
    with pytest.raises(ValueError, match="scales: got 'e8m0'; allowed: 'amax', 'pow2'"):
        quantize_1x128(np.ones((2, 128), np.float32), scales="e8m0")
    with pytest.raises(ValueError, match="scales"):
        quantize_128x128(np.ones((128, 128), np.float32), scales=None)


def test_sfa_layout_numpy_and_torch():
    s = np.arange(30, dtype=np.float32).reshape(10, 3)
    v = blockwise_sfa_layout(s)
    assert v.shape == (10, 3) and v.strides == (4, 48)        # pitch ceil(10 / 4) * 4 = 12 floats
    np.testing.assert_array_equal(v, s)
    t = blockwise_sfa_layout(torch.from_numpy(s))
    assert tuple(t.shape) == (10, 3) and t.stride() == (1, 12) and torch.equal(t, torch.from_numpy(s))


def _operands(sizes=(256, 0, 512), n=256, k=384, seed=0):
    rng = np.random.default_rng(seed)
    m, l = sum(sizes), len(sizes)
    aq, sa = quantize_1x128(rng.standard_normal((m, k)))
    bq, sb = quantize_128x128(rng.standard_normal((l, n, k)))
    fp8 = lambda x: torch.from_numpy(np.asarray(x).view(np.uint8)).view(torch.float8_e4m3fn)  # noqa: E731
    return {"a_tensor": fp8(aq), "sfa_tensor": blockwise_sfa_layout(torch.from_numpy(sa)),
            "padded_offsets": torch.tensor(np.cumsum(sizes), dtype=torch.int32), "b_tensor": fp8(bq),
            "sfb_tensor": torch.from_numpy(sb)}, (aq, sa, bq, sb)


def _call(op, **over):
    kw, _ = _operands()
    kw.update(over)
    return op(**kw, inputs={"alpha": torch.ones(3)})


@pytest.fixture(scope="module")
def op():
    return fusegemm.Op("grouped_gemm_quant", arch="sm_90a", **BW)


def test_a_valid_call_reaches_the_device_check(op):
    with pytest.raises(ArgumentError, match="a_tensor.device"):
        _call(op)


@pytest.mark.parametrize("name,bad,match", [
    ("sfa_tensor", lambda kw: kw["sfa_tensor"].contiguous(), r"sfa_tensor.stride.*unit stride along M"),
    ("sfa_tensor", lambda kw: torch.empty_strided((768, 3), (2, 1536)).fill_(1.0),   # rows 2 floats apart
     r"sfa_tensor.stride.*unit stride along M"),
    ("sfa_tensor", lambda kw: torch.ones(768, 4), r"sfa_tensor.shape.*\(768, 3\)"),
    ("sfa_tensor", lambda kw: kw["sfa_tensor"].double(), r"sfa_tensor.dtype"),
    ("sfb_tensor", lambda kw: kw["sfb_tensor"][:, :1], r"sfb_tensor.shape.*\(3, 2, 3\)"),
    ("sfb_tensor", lambda kw: kw["sfb_tensor"].transpose(1, 2).contiguous().transpose(1, 2),
     r"sfb_tensor.stride.*contiguous"),
])
def test_bad_scales_are_named(op, name, bad, match):
    kw, _ = _operands()
    with pytest.raises(ArgumentError, match=match):
        op(**{**kw, name: bad(kw)}, inputs={"alpha": torch.ones(3)})


def test_a_pitch_that_is_not_16_bytes_is_refused(op):
    kw, (_, sa, _, _) = _operands(sizes=(256, 0, 512))
    buf = torch.zeros(3, 770)
    buf[:, :768] = torch.from_numpy(sa).t()
    with pytest.raises(ArgumentError, match=r"sfa_tensor.stride.*multiple of 4 floats"):
        op(**{**kw, "sfa_tensor": buf[:, :768].t()}, inputs={"alpha": torch.ones(3)})


def test_mx_scales_on_a_blockwise_op_are_refused(op):
    with pytest.raises(ArgumentError, match="sfa_tensor"):
        _call(op, sfa_tensor=torch.zeros(768 * 4, dtype=torch.uint8))


def test_reference_dequantizes_both_granularities(op):
    kw, (aq, sa, bq, sb) = _operands()
    ref = op.reference(*kw.values(), inputs={"alpha": torch.ones(3)})
    a = dequantize_1x128(aq, sa).astype(np.float64)
    want = np.concatenate([a[:256] @ dequantize_128x128(bq[0], sb[0]).astype(np.float64).T,
                           a[256:] @ dequantize_128x128(bq[2], sb[2]).astype(np.float64).T])
    got = np.asarray(ref["d"], dtype=np.float32)
    assert np.abs(got - want).max() <= 2.0 ** -8 * np.abs(want).max()


def test_sm100a_refuses_the_recipe_with_a_reason():
    with pytest.raises(UnsupportedError, match=r"sf_vec_size=128 is not implemented.*sm_100a.*runs on sm_90a"):
        fusegemm.Op("grouped_gemm_srelu", arch="sm_100a", **BW).check_support()


def test_spec_constraints_pair_fp32_scales_with_128():
    from fusegemm.base.errors import SpecError
    with pytest.raises((SpecError, UnsupportedError), match="sf_vec_size"):
        fusegemm.Op("grouped_gemm_quant", arch="sm_90a", sf_dtype="float32", sf_vec_size=32).check_support()


@pytest.mark.parametrize("spec,axes", [
    ("grouped_gemm_quant", {"d_dtype": "float8_e4m3fn"}),
    ("grouped_gemm_srelu", {"tile_n": 128, "weight_mode": "discrete"}),
    ("grouped_gemm_dswiglu", {"ab_dtype": "float8_e5m2"}),
])
def test_sm90a_kernels_compile_without_spills(spec, axes, session_cache):
    from fusegemm.generator.variants import make_variant
    from fusegemm.pipeline import get_kernel
    built = get_kernel(make_variant(spec, arch="sm_90a", **BW, **axes), session_cache)
    assert built.resources.local_bytes == 0, built.resources      # no register spills
    assert built.contract.threads == 384 and built.contract.tile_k == 128 and built.contract.sf_box_nb == 0
