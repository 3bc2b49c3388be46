"""fusegemm.formats.torch_blockwise (the blockwise recipe's quantizers on torch tensors) on the
CPU: scales bit for bit those of the numpy helpers (fusegemm.formats.quantize_1x128 /
quantize_128x128, float64), values bit for bit the kernels' own 1x128 output quantization (the
interpreter's quantize_1x128_rows: fl32(x / s), then FP8), and the numpy helpers' except where
fl32(x / s) is an exact FP8 tie; power-of-two scales: the numpy helpers' exactly."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fusegemm.formats import quantize_1x128, quantize_128x128  # noqa: E402
from fusegemm.formats.torch_blockwise import quantize_1x128 as tq_1x128  # noqa: E402
from fusegemm.formats.torch_blockwise import quantize_128x128 as tq_128x128  # noqa: E402
from fusegemm.formats import torch_blockwise as tb  # noqa: E402
from fusegemm.interpret import _store, quantize_1x128_rows  # noqa: E402

DTYPES = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}


def _data(shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-9, 9, shape[:-1] + (1,)))
    x = x.astype(np.float32)
    x.reshape(-1, shape[-1])[1] = 0.0                                     # the 1e-4 floor
    x.reshape(-1, shape[-1])[2, :5] = np.float32(1e-4)                    # amax = float32(1e-4) < 1e-4
    return x


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("scales", ["amax", "pow2"])
@pytest.mark.parametrize("k", [128, 300, 1024])
def test_1x128_scales_and_values(dtype, scales, k):
    x = _data((70, k), seed=k)
    q, s = tq_1x128(torch.from_numpy(x), DTYPES[dtype], scales)
    ref_q, ref_s = quantize_1x128(x, dtype=dtype, scales=scales)
    assert q.dtype == DTYPES[dtype] and q.shape == (70, k) and s.dtype == torch.float32
    assert s.shape == (70, -(-k // 128)) and s.stride() == (1, 72)        # the kernels' SFA layout
    np.testing.assert_array_equal(s.numpy(), ref_s)
    y, ks = quantize_1x128_rows(x, np.float32(1.0), dtype, pow2=scales == "pow2")
    np.testing.assert_array_equal(ks, ref_s)
    got = q.view(torch.uint8).numpy()
    np.testing.assert_array_equal(got, _store(y, dtype).view(np.uint8))   # the kernels' own quantization
    same = got == np.asarray(ref_q).view(np.uint8)
    assert same.all() if scales == "pow2" else same.mean() > 0.999


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("scales", ["amax", "pow2"])
def test_128x128_scales_and_values(dtype, scales):
    w = _data((3, 200, 300), seed=5)
    q, s = tq_128x128(torch.from_numpy(w).to(torch.bfloat16), DTYPES[dtype], scales)
    ref_q, ref_s = quantize_128x128(torch.from_numpy(w).to(torch.bfloat16), dtype=dtype, scales=scales)
    assert q.shape == (3, 200, 300) and s.shape == (3, 2, 3) and s.is_contiguous()
    np.testing.assert_array_equal(s.numpy(), ref_s)
    same = q.view(torch.uint8).numpy() == np.asarray(ref_q).view(np.uint8)
    assert same.all() if scales == "pow2" else same.mean() > 0.999


def test_a_quotient_on_an_fp8_midpoint_rounds_to_even():
    """fl(0.93750006 / fl(268.80002 / 448)) = 1.5625, halfway between e4m3's 1.5 and 1.625: 1.5
    (t * fl(1 / s) is 1.5625001 and would give 1.625)."""
    x = torch.zeros(1, 128)
    x[0, :2] = torch.tensor([268.80002, 0.93750006])
    q, _ = tq_1x128(x)
    assert q.view(torch.uint8)[0, 1] == 0x3C


def test_nan_gives_its_block_a_nan_scale():
    x = torch.ones(2, 256)
    x[0, 3] = float("nan")
    _, s = tq_1x128(x)
    assert torch.isnan(s[0, 0]) and not torch.isnan(s[0, 1]) and not torch.isnan(s[1]).any()


@pytest.mark.parametrize("call, match", [
    (lambda: tq_1x128(np.ones((4, 128))), r"x: got \(4, 128\); allowed: a torch tensor \(M, K\)"),
    (lambda: tq_1x128(torch.ones(128)), r"x: got torch.Size\(\[128\]\)"),
    (lambda: tq_1x128(torch.ones(4, 128), torch.bfloat16), r"dtype: got torch.bfloat16"),
    (lambda: tq_128x128(torch.ones(4, 128), scales="ue8m0"), r"scales: got 'ue8m0'; allowed: 'amax', 'pow2'"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _plain_1x128(x, dtype, scales):
    """The quantizer written plainly (pad, |x|, amax, divide, cast): what the optimized one (one
    float32 copy divided in place, max |x| from aminmax) must equal."""
    from fusegemm.formats.blockwise import blockwise_sfa_layout
    from fusegemm.formats.torch_blockwise import BLOCK, _scale
    m, k = x.shape
    kb = -(-k // BLOCK)
    v = torch.nn.functional.pad(x.float(), (0, kb * BLOCK - k)).view(m, kb, BLOCK)
    s = _scale(v.abs().amax(-1), dtype, scales)
    return (v / s[:, :, None]).to(dtype).view(m, kb * BLOCK)[:, :k].contiguous(), blockwise_sfa_layout(s)


@pytest.mark.parametrize("src", [torch.bfloat16, torch.float32])
def test_the_in_place_quantizers_equal_the_plain_formula(src):
    """quantize_1x128 and quantize_wgrad (= quantize_1x128 of the transpose) against the plain
    formula: the same values and scales (a NaN block's bytes may differ in the NaN's sign), for
    both formats and scale rules, K a multiple of 128 or not, zeros, NaN and -inf; the input is
    not modified (a float32 input is copied before the in-place division)."""
    g = torch.Generator().manual_seed(0)
    for shape in ((300, 200), (256, 384)):
        x = (torch.randn(*shape, generator=g) * 10).to(src)
        x[0, 3], x[2, 5] = float("nan"), float("-inf")
        x[1] = 0
        before = x.clone()
        for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            for scales in ("amax", "pow2"):
                pairs = ((tb.quantize_1x128(x, dtype, scales), _plain_1x128(x, dtype, scales)),
                         (tb.quantize_wgrad(x, dtype, scales), _plain_1x128(x.t().contiguous(), dtype, scales)))
                for got, want in pairs:
                    assert torch.equal(got[0].float().nan_to_num(1e9), want[0].float().nan_to_num(1e9))
                    assert torch.equal(got[1].nan_to_num(-1.0), want[1].nan_to_num(-1.0))
        assert torch.equal(x.nan_to_num(7.0), before.nan_to_num(7.0))


def _plain_128x128(w, dtype, scales):
    """quantize_128x128 written plainly (pad, |w|, amax, divide, cast)."""
    from fusegemm.formats.torch_blockwise import BLOCK, _scale
    *lead, n, k = w.shape
    nb, kb = -(-n // BLOCK), -(-k // BLOCK)
    v = torch.nn.functional.pad(w.float(), (0, kb * BLOCK - k, 0, nb * BLOCK - n)).reshape(-1, nb, BLOCK, kb, BLOCK)
    s = _scale(v.abs().amax(dim=(2, 4)), dtype, scales)
    q = (v / s[:, :, None, :, None]).to(dtype).reshape(-1, nb * BLOCK, kb * BLOCK)[:, :n, :k]
    return q.reshape(*lead, n, k).contiguous(), s.reshape(*lead, nb, kb).contiguous()


@pytest.mark.parametrize("shape", [(2, 256, 384), (3, 200, 136), (128, 128)])
def test_the_in_place_128x128_quantizer_equals_the_plain_formula(shape):
    """quantize_128x128 (one float32 copy divided in place, max |w| from amax and amin) against
    the plain formula, both formats and scale rules, with zeros, NaN and -inf; w untouched."""
    g = torch.Generator().manual_seed(1)
    for src in (torch.bfloat16, torch.float32):
        w = (torch.randn(*shape, generator=g) * 3).to(src)
        w.view(-1)[7], w.view(-1)[300] = float("nan"), float("-inf")
        w.view(-1)[1000:1200] = 0
        before = w.clone()
        for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            for scales in ("amax", "pow2"):
                (q, s), (q0, s0) = tb.quantize_128x128(w, dtype, scales), _plain_128x128(w, dtype, scales)
                assert torch.equal(q.float().nan_to_num(1e9), q0.float().nan_to_num(1e9))
                assert torch.equal(s.nan_to_num(-1.0), s0.nan_to_num(-1.0))
        assert torch.equal(w.nan_to_num(7.0), before.nan_to_num(7.0))
