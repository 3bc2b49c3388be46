"""The blockwise recipe's E8M0 (power-of-two, UE8M0) scales on sm_100a, on the CPU: the registry
runs sf_vec_size 128 with E8M0 scales as the MXFP8 kernel (tcgen05 kind::mxf8f6f4), each call
expanding the scale tensors into MX atoms (each 1x128 scale over its four 32-K blocks, each
128x128 one over its 128 rows too: exact, since a power of two scales its block's elements
alike). Checked here: the expansion against an independent numpy one, the op's variant and its
checks, its reference equal to sm_90a's blockwise reference, and the kernel it runs built
without spills. tests/gpu/test_blockwise_sm100_gpu.py runs the expansion with the MX kernel on
the H200 against the blockwise kernel, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.base.errors import ArgumentError, UnsupportedError  # noqa: E402
from fusegemm.formats import pack_sf  # noqa: E402
from fusegemm.formats.torch_blockwise import mx_scales_of_blockwise  # noqa: E402
from fusegemm.generator.variants import make_variant  # noqa: E402
from test_blockwise_e8m0 import E8, SPECS  # noqa: E402  (tests/unit/test_blockwise_e8m0.py)
from test_blockwise_e8m0 import _operands as _e8m0_problem  # noqa: E402

MX = {"sf_dtype": "float8_e8m0fnu", "sf_vec_size": 32}


def _operands():
    """A blockwise problem with power-of-two scales as E8M0 bytes, N and K not multiples of 128
    (test_blockwise_e8m0's builder)."""
    return _e8m0_problem(n=320, k=400)[1]


@pytest.mark.parametrize("spec", SPECS)
def test_e8m0_at_128_is_the_mx_kernel_on_sm100a(spec):
    bw, mx = make_variant(spec, arch="sm_100a", **E8), make_variant(spec, arch="sm_100a", **MX)
    assert bw.sf_vec_size == 32 and bw.readable == mx.readable and bw.choices == mx.choices
    op = fusegemm.Op(spec, arch="sm_100a", **E8)
    assert op.blockwise_mx and op.check_support()
    assert not fusegemm.Op(spec, arch="sm_100a", **MX).blockwise_mx          # MXFP8 itself: no expansion
    assert not fusegemm.Op(spec, arch="sm_90a", **E8).blockwise_mx           # sm_90a: the FP32-scale kernel
    with pytest.raises(UnsupportedError, match=r"sf_vec_size=128 is not implemented.*sm_100a"):
        fusegemm.Op(spec, arch="sm_100a", sf_dtype="float32", sf_vec_size=128).check_support()


@pytest.mark.parametrize("n,k", [(320, 400), (256, 128), (128, 1000)])
def test_the_expansion_is_the_repeated_scales_packed(n, k):
    rng = np.random.default_rng(k)
    m, l = 300, 3
    sa = rng.integers(100, 150, (m, -(-k // 128))).astype(np.uint8)
    sb = rng.integers(100, 150, (l, -(-n // 128), -(-k // 128))).astype(np.uint8)
    sfk = -(-k // 32)
    want_a = pack_sf(np.repeat(sa, 4, axis=1)[:, :sfk])
    want_b = pack_sf(np.repeat(np.repeat(sb, 128, axis=1)[:, :n], 4, axis=2)[:, :, :sfk], batch_first=True)
    # SFA in the recipe's M-contiguous layout (any strides are taken)
    ta = torch.from_numpy(sa.T.copy()).t().view(torch.float8_e8m0fnu)
    got_a, got_b = mx_scales_of_blockwise(ta, torch.from_numpy(sb), n=n, k=k)
    assert got_a.dtype == torch.float8_e8m0fnu and got_b.dtype == torch.uint8
    np.testing.assert_array_equal(got_a.view(torch.uint8).numpy(), want_a.reshape(got_a.shape))
    np.testing.assert_array_equal(got_b.numpy(), want_b.reshape(got_b.shape))


def test_the_op_expands_before_its_operand_parse():
    op = fusegemm.Op("grouped_gemm_quant", arch="sm_100a", **E8)
    e8 = _operands()
    from fusegemm.ops.scaled_layouts import mx_scale_operands
    names = [n for n in op._operand_names() if n in e8]
    pos, _ = mx_scale_operands(op, tuple(e8[n] for n in names), {}, None)
    got = dict(zip(names, pos))
    assert got["sfa_tensor"].shape == (1, 6, 4, 32, 4, 4) and got["sfb_tensor"].shape == (3, 3, 4, 32, 4, 4)
    with pytest.raises(ArgumentError, match="a_tensor.device"):       # past every operand check
        op(**e8, inputs={"alpha": torch.ones(3)})


@pytest.mark.parametrize("bad, match", [
    (lambda e: {"sfa_tensor": e["sfa_tensor"].view(torch.uint8).float()}, r"sfa_tensor.dtype: got float32; allowed: "
                                                                          r"E8M0 bytes"),
    (lambda e: {"sfa_tensor": e["sfa_tensor"][:, :3]}, r"sfa_tensor.shape: got \(768, 3\); allowed: \(768, 4\)"),
    (lambda e: {"sfb_tensor": e["sfb_tensor"][:2]}, r"sfb_tensor.shape: got \(2, 3, 4\); allowed: \(3, 3, 4\)"),
])
def test_bad_scales_are_named(bad, match):
    op = fusegemm.Op("grouped_gemm_quant", arch="sm_100a", **E8)
    e8 = _operands()
    with pytest.raises(ArgumentError, match=match):
        op(**{**e8, **bad(e8)}, inputs={"alpha": torch.ones(3)})


def test_the_reference_is_the_blockwise_reference():
    """sm_100a's op (MX kernel, expanded scales) and sm_90a's (FP32-scale kernel) have one
    reference: the blockwise products of the same values."""
    e8 = _operands()
    ins = {"alpha": torch.full((3,), 0.5), "prob": torch.rand(768, generator=torch.Generator().manual_seed(2)),
           "norm_const": 1.0}
    got = fusegemm.Op("grouped_gemm_quant", arch="sm_100a", d_dtype="float8_e4m3fn", **E8).reference(**e8, inputs=ins)
    want = fusegemm.Op("grouped_gemm_quant", arch="sm_90a", d_dtype="float8_e4m3fn", **E8).reference(**e8, inputs=ins)
    assert got.keys() == want.keys() and {"d", "sfd_row", "sfd_col"} <= set(want.keys())
    for key in want.keys():
        g, w = np.asarray(got[key]), np.asarray(want[key])
        assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes(), key


def test_the_sm100a_kernel_builds_without_spills(session_cache):
    from fusegemm.pipeline import get_kernel
    built = get_kernel(make_variant("grouped_gemm_quant", arch="sm_100a", d_dtype="float8_e4m3fn", **E8),
                       session_cache)
    assert built.resources.local_bytes == 0, built.resources
