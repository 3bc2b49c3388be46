"""The blockwise recipe's quantization kernels (fusegemm/quantize.py, templates/include/fusegemm/
quantize.cuh) on the GPU, bit for bit against fusegemm.formats.torch_blockwise's torch operations
on the same device: FP8 bytes, float32 scales, shapes and strides. Every case also proves the
kernel ran (a launch recorded for it), since a fallback to torch's route would match trivially.

Inputs are seeded: normal values at several magnitudes, rows and columns not multiples of 128
(tails of 16), a strided source, batched weights, and blocks holding zeros only (the 1e-4 amax
floor), a NaN, an Inf, bfloat16's largest finite values and negative zeros."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from fusegemm import quantize as qz  # noqa: E402
from fusegemm.formats import torch_blockwise as bw  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


@pytest.fixture
def launches(monkeypatch):
    """The kernel names launched during the test (a launch the driver refused is not recorded)."""
    seen = []
    run_on = qz._KERNELS.run_on

    def recorded(lead, name, grid, block, raw):
        ok = run_on(lead, name, grid, block, raw)
        if ok:
            seen.append(name)
        return ok
    monkeypatch.setattr(qz._KERNELS, "run_on", recorded)
    return seen


def _same(got, want):
    """Equal dtype, shape, strides and bits: FP8 as bytes, float32 scales as their bits where
    either is a number (a NaN scale is NaN in both, its payload whatever the division left: the
    kernel keeps the source's NaN, torch's division makes its own)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    assert got.stride() == want.stride(), (got.stride(), want.stride())
    if got.element_size() == 1:
        diff = (got.view(torch.uint8) != want.view(torch.uint8))
    else:
        diff = (got.view(torch.int32) != want.view(torch.int32)) & ~(got.isnan() & want.isnan())
    assert not bool(diff.any()), f"{int(diff.sum())} of {diff.numel()} differ, first at {diff.nonzero()[0].tolist()}"


def _activations(rows, cols, dtype, seed, special=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, cols, device="cuda", generator=g)
    # magnitudes from 1e-3 to 1e3 by row block: each block's scale differs
    x = x * torch.logspace(-3, 3, steps=-(-rows // 16), device="cuda").repeat_interleave(16)[:rows, None]
    x = x.to(dtype)
    if special:
        x[:16, :128] = 0                                        # zeros only: the amax floor
        if cols > 256:
            x[20, 130] = float("nan")                           # a NaN block (row 20, cols 128..255)
            x[40, 300] = float("inf")
            x[60, 260:264] = torch.finfo(dtype).max             # largest finite values
        if rows > 70:
            x[70, :8] = -0.0                                    # -0 / s is -0: byte 0x80 (the fast division's sign)
    return x


SHAPES = [(16, 128), (144, 7168), (272, 400), (1040, 2048)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_activation_quantizations_match_torch_blockwise(launches, rows, cols, dtype):
    """quantize_1x128, quantize_wgrad and quantize_both, e4m3 with amax scales."""
    x = _activations(rows, cols, dtype, seed=rows + cols, special=True)
    want_q, want_t = bw.quantize_1x128(x), bw.quantize_wgrad(x)
    for got, want in [(qz.quantize_1x128(x), want_q), (qz.quantize_wgrad(x), want_t)]:
        _same(got[0], want[0])
        _same(got[1], want[1])
    (q, s), (qt, st) = qz.quantize_both(x)
    for got, want in zip((q, s, qt, st), (*want_q, *want_t)):
        _same(got, want)
    assert launches == [qz._SOURCES[str(dtype)]] * 3


@pytest.mark.parametrize("dtype,scales", [(E5M2, "amax"), (E4M3, "pow2"), (E5M2, "pow2")])
def test_element_formats_and_power_of_two_scales(launches, dtype, scales):
    x = _activations(400, 1024, torch.bfloat16, seed=7, special=True)
    (q, s), (qt, st) = qz.quantize_both(x, dtype, scales)
    for got, want in zip((q, s, qt, st), (*bw.quantize_1x128(x, dtype, scales), *bw.quantize_wgrad(x, dtype, scales))):
        _same(got, want)
    w = _activations(384, 640, torch.bfloat16, seed=8).reshape(3, 128, 640)
    for got, want in zip(qz.quantize_128x128(w, dtype, scales), bw.quantize_128x128(w, dtype, scales)):
        _same(got, want)
    # the transposed copy (FUSEGEMM_QUANTIZE_BLOCK_TRANSPOSE: q's bytes permuted, not requantized)
    both = qz.quantize_128x128(w, dtype, scales, transposed=True)
    want = bw.quantize_128x128(w, dtype, scales)
    for got, exp in zip((*both[0], *both[1]), (*want, *bw.transposed_128x128(*want))):
        # (transposed_128x128's contiguous() keeps a size-1 dimension's stride: compared dense)
        _same(got, torch.empty(exp.shape, dtype=exp.dtype, device=exp.device).copy_(exp))
    assert len(launches) == 3


def test_a_strided_source(launches):
    """A column slice of a wider matrix: the kernel reads the pitch, the outputs are dense."""
    base = _activations(256, 1024 + 64, torch.bfloat16, seed=11)
    x = base[:, 32:32 + 1024]
    assert not x.is_contiguous() and qz._served(x)
    (q, s), (qt, st) = qz.quantize_both(x)
    for got, want in zip((q, s, qt, st), (*bw.quantize_1x128(x), *bw.quantize_wgrad(x))):
        _same(got, want)
    assert len(launches) == 1


@pytest.mark.parametrize("shape", [(7168, 2048), (8, 4096, 7168), (3, 208, 336), (1, 16, 16)])
def test_weights_match_torch_blockwise(launches, shape):
    """quantize_128x128 with the transposed copy: one scale per 128 x 128 block (partial blocks at
    the tails), the transpose equal to transposed_128x128 of torch's result."""
    g = torch.Generator(device="cuda").manual_seed(sum(shape))
    w = (torch.randn(shape, device="cuda", generator=g) * 0.02).bfloat16()
    if w.dim() == 3 and shape[1] >= 256:
        w[0, 128:256, :128] = 0                                 # an all-zero block
        w[-1, 5, 7] = float("nan")
    (q, s), (qt, st) = qz.quantize_128x128(w, transposed=True)
    want = bw.quantize_128x128(w)
    _same(q, want[0])
    _same(s, want[1])
    want_t = bw.transposed_128x128(*want)
    _same(qt, want_t[0])
    _same(st, want_t[1])
    q2, s2 = qz.quantize_128x128(w)
    _same(q2, want[0])
    _same(s2, want[1])
    assert len(launches) == 2


@pytest.mark.parametrize("rows,cols", [(272, 2048), (4096, 512)])
def test_requantize_for_the_weight_gradient(launches, rows, cols):
    """fc1's FP8 h (1x128 scales) -> bfloat16 -> quantized along the tokens, in one pass."""
    h = _activations(rows, cols, torch.bfloat16, seed=rows, special=True)
    hq, sh = bw.quantize_1x128(h)
    got = qz.requantize_wgrad(hq, sh)
    want = bw.quantize_wgrad(bw.dequantize_1x128(hq, sh).to(torch.bfloat16))
    _same(got[0], want[0])
    _same(got[1], want[1])
    assert launches == ["fusegemm_quantize_float8_e4m3fn"]


def test_what_the_kernel_does_not_serve_takes_torch_route(launches):
    """Rows not a multiple of 16 and float32 sources: torch's operations, the same values."""
    x = _activations(100, 256, torch.bfloat16, seed=3)
    _same(qz.quantize_1x128(x)[0], bw.quantize_1x128(x)[0])
    y = _activations(128, 256, torch.float32, seed=4)
    _same(qz.quantize_wgrad(y)[0], bw.quantize_wgrad(y)[0])
    assert launches == []


@pytest.mark.parametrize("dtype,scales", [(E4M3, "amax"), (E5M2, "amax"), (E4M3, "pow2")])
def test_torch_blockwise_on_cuda_matches_numpy(dtype, scales):
    """The reference chain: torch_blockwise on CUDA against fusegemm.formats.blockwise (numpy,
    float64 quotients): scales bit for bit (torch divided by the CPU number 448 through its float32
    reciprocal until the kernel test found it), values equal except where ``fl32(x / s)`` lands
    exactly halfway between two FP8 values: numpy rounds the exact quotient once, torch (and the
    kernels) round it to float32 first and the tie to even. With bfloat16 sources x / amax is
    often a short fraction, so 448 x / amax sits within float32's rounding of a midpoint for
    about 1e-3 of the values (never with power-of-two scales: the quotient is exact)."""
    import numpy as np

    from fusegemm.formats import blockwise as nb
    x = _activations(272, 1024, torch.bfloat16, seed=5)
    w = _activations(256, 384, torch.bfloat16, seed=6).reshape(2, 128, 384)
    for (q, s), (nq, ns) in [(bw.quantize_1x128(x, dtype, scales), nb.quantize_1x128(x.cpu(), dtype, scales)),
                             (bw.quantize_128x128(w, dtype, scales), nb.quantize_128x128(w.cpu(), dtype, scales))]:
        assert np.array_equal(s.cpu().numpy().view(np.int32), ns.view(np.int32))
        same = q.cpu().view(torch.uint8).numpy() == nq.view(np.uint8)
        assert same.mean() >= (1.0 if scales == "pow2" else 0.995), same.mean()
        # every difference is a tie: fl32(x / s) halfway between torch's and numpy's FP8 values
        src, scale = (x, s) if q.dim() == 2 else (w, s.repeat_interleave(128, -2))
        quotient = (src.float() / scale.repeat_interleave(128, -1)[..., :src.shape[-1]]).cpu().numpy()
        a, b = q.cpu().float().numpy(), nq.astype(np.float32)
        assert np.array_equal((a + b)[~same] / 2, quotient[~same])
