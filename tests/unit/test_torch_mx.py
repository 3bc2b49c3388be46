"""fusegemm.formats.torch_mx (the MoE layer's on-device MXFP8 quantizer) against the numpy
formats it must equal bit for bit: elements, E8M0 scales, the SF atom packing, dequantization,
on edge blocks (all zero, a power of two exactly at the format's maximum, tiny values, an
infinity that saturates the scale) and strided inputs."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fusegemm import formats  # noqa: E402
from fusegemm.formats import torch_mx  # noqa: E402


def _bytes(t):
    return t.view(torch.uint8).numpy() if isinstance(t, torch.Tensor) else np.asarray(t).view(np.uint8)


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 200, 256, generator=g) * torch.logspace(-30, 30, 256)[None, None, :]).bfloat16()
    x[0, 0, :32] = 0                               # all zero: the smallest scale, code 0
    x[1, 3, 32:64] = 448 * 2.0 ** 5                # amax / 448 exactly a power of two: no round-up
    x[1, 4, 32:64] = 450 * 2.0 ** 5                # the next bfloat16 above: rounds up
    x[2, 5, 64:96] = -2.0 ** -130                  # subnormal in FP32's range
    return x


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_quantize_equals_formats(dtype):
    x = _inputs()
    q, sf = torch_mx.quantize_mx(x, dtype)
    qn, sfn = formats.quantize_blockwise(x, ab_dtype=str(dtype).split(".")[1])
    assert q.dtype == dtype and sf.dtype == torch.float8_e8m0fnu and q.shape == x.shape and sf.shape == (3, 200, 8)
    assert np.array_equal(_bytes(q), _bytes(qn)) and np.array_equal(_bytes(sf), _bytes(sfn))
    assert _bytes(sf)[0, 0, 0] == 0 and _bytes(sf)[1, 4, 1] == _bytes(sf)[1, 3, 1] + 1
    d = torch_mx.dequantize_mx(q, sf)
    assert np.array_equal(d.numpy(), formats.dequantize_blockwise(qn, sfn, sf_vec_size=32))


def test_strided_input_and_saturation():
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(1))
    x[5, 40] = float("inf")
    q, sf = torch_mx.quantize_mx(x.t())            # a transposed view: q comes back row-major
    assert q.is_contiguous() and q.shape == (96, 64)
    qn, sfn = formats.quantize_blockwise(x.t().contiguous(), ab_dtype="float8_e4m3fn")
    assert np.array_equal(_bytes(q), _bytes(qn)) and np.array_equal(_bytes(sf), _bytes(sfn))
    assert _bytes(sf)[40, 0] == 254                # the infinite block's scale saturates


def test_pack_and_unpack_match_the_atom_layout():
    sf = torch_mx.quantize_mx(_inputs())[1]         # (3, 200, 8): two row tiles (one partial), two k tiles
    phys = torch_mx.pack_sf(sf)
    want = formats.pack_sf(np.moveaxis(_bytes(sf), 0, -1))
    assert phys.shape == (3, 2, 2, 32, 4, 4) and np.array_equal(_bytes(phys), want.reshape(phys.shape))
    pad = phys.view(torch.uint8)[:, 1]              # rows 200..255: m % 128 = 72..127
    assert pad[:, :, 8:, 2].eq(0).all() and pad[:, :, :, 3].eq(0).all() and pad[:, :, :8, 2].ne(0).any()
    view = torch_mx.kernel_view(phys)
    assert view.shape == (32, 4, 2, 4, 2, 3)
    for form in (phys, view):
        assert torch.equal(torch_mx.unpack_sf(form, 200, 8).view(torch.uint8), sf.view(torch.uint8))
    two_d = torch_mx.pack_sf(sf[1])
    assert torch.equal(two_d.view(torch.uint8), phys[1:2].view(torch.uint8))


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="x: got torch.float32 \\(4, 48\\); allowed: .*multiple of 32"):
        torch_mx.quantize_mx(torch.zeros(4, 48))
    with pytest.raises(ValueError, match="dtype: got torch.bfloat16; allowed"):
        torch_mx.quantize_mx(torch.zeros(4, 32), torch.bfloat16)
    with pytest.raises(ValueError, match="sf: got shape \\(4, 4\\)"):
        torch_mx.unpack_sf(torch.zeros(4, 4, dtype=torch.uint8), 4, 1)
    with pytest.raises(ValueError, match="sf: got shape \\(8,\\)"):
        torch_mx.pack_sf(torch.zeros(8, dtype=torch.uint8))
