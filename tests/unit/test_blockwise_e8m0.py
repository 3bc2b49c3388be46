"""The blockwise recipe with E8M0 (power-of-two) scales on the CPU (issue 31's second scale dtype,
DeepSeek-V3.1's UE8M0): the byte conversions against torch's own float8_e8m0fnu casts, the
registry running sf_dtype e8m0 at sf_vec_size 128 as the FP32-scale kernel (one variant, one
cubin), the op converting E8M0 scale tensors before its operand parse, and the reference giving
the same outputs as with the float32 values they encode. tests/gpu/test_blockwise_e8m0_gpu.py
runs them."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.base.errors import ArgumentError, UnsupportedError  # noqa: E402
from fusegemm.formats import (blockwise_sfa_layout, e8m0_bytes, e8m0_to_float32, quantize_1x128,  # noqa: E402
                              quantize_128x128)
from fusegemm.generator.variants import make_variant  # noqa: E402

BW = {"sf_dtype": "float32", "sf_vec_size": 128}
E8 = {"sf_dtype": "float8_e8m0fnu", "sf_vec_size": 128}
SPECS = ("grouped_gemm_quant", "grouped_gemm_srelu", "grouped_gemm_dswiglu", "grouped_gemm_glu_mx",
         "grouped_gemm_dglu_mx", "grouped_gemm_dsrelu_mx")


def test_every_byte_converts_as_torch_casts_it():
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    theirs = b.view(torch.float8_e8m0fnu).to(torch.float32)         # torch's own decoding
    for x in (b, b.view(torch.float8_e8m0fnu)):
        ours = e8m0_to_float32(x)
        assert ours.dtype == torch.float32
        assert torch.equal(ours[:255], theirs[:255]) and torch.isnan(ours[255]) and torch.isnan(theirs[255])
    np.testing.assert_array_equal(e8m0_to_float32(b.numpy())[:255], theirs[:255].numpy())
    assert e8m0_to_float32(b.numpy())[0] == np.float32(2.0 ** -127)       # 0x00: the FP32 subnormal


def test_power_of_two_scales_round_trip_and_others_are_refused():
    f = e8m0_to_float32(np.arange(256, dtype=np.uint8))
    np.testing.assert_array_equal(e8m0_bytes(f), np.arange(256, dtype=np.uint8))
    assert e8m0_bytes(torch.from_numpy(f)).dtype == torch.uint8
    _, s = quantize_1x128(np.random.default_rng(0).standard_normal((64, 256)), scales="pow2")
    np.testing.assert_array_equal(e8m0_to_float32(e8m0_bytes(s)), s)    # the recipe's own scales
    for bad in (3.0, 0.0, -2.0, np.inf, 2.0 ** -128):
        with pytest.raises(ValueError, match=r"^scales\[1\]: got .*; allowed: powers of two from 2\^-127"):
            e8m0_bytes(np.array([1.0, bad], dtype=np.float32))


@pytest.mark.parametrize("spec", SPECS)
def test_e8m0_at_128_is_the_fp32_scale_kernel(spec):
    e8, f32 = make_variant(spec, arch="sm_90a", **E8), make_variant(spec, arch="sm_90a", **BW)
    assert e8.sf_dtype == "float32" and e8.readable == f32.readable and e8.choices == f32.choices
    assert fusegemm.Op(spec, arch="sm_90a", **E8).check_support()
    # MXFP8 keeps its E8M0 kernel: the mapping is conditional on sf_vec_size 128
    assert make_variant(spec, arch="sm_90a", sf_dtype="float8_e8m0fnu", sf_vec_size=32).sf_dtype == "float8_e8m0fnu"


def test_sm100a_refuses_the_recipe_with_fp32_scales():
    """(Its E8M0 scales run on the MX kernel: tests/unit/test_blockwise_sm100.py.)"""
    with pytest.raises(UnsupportedError, match=r"sf_vec_size=128 is not implemented.*sm_100a"):
        fusegemm.Op("grouped_gemm_srelu", arch="sm_100a", **BW).check_support()


def test_discrete_weights_take_fp32_scales_only():
    with pytest.raises(UnsupportedError, match=r"E8M0 blockwise scales are converted to FP32 on the device per "
                                               r"call, which a discrete weights' pointer table hides"):
        fusegemm.Op("grouped_gemm_srelu", arch="sm_90a", weight_mode="discrete", **E8)


def test_a_conditional_runs_as_may_name_a_source_axis_an_unconditional_one_may_not():
    from fusegemm.generator.implementation import RunsAs
    from fusegemm.generator.registry import lookup
    row = lookup("grouped_gemm_quant", "sm_90a")
    assert "sf_dtype" in row.source_axes
    with pytest.raises(ValueError, match="source_axes"):
        type(row)(**{**{f: getattr(row, f) for f in row.__dataclass_fields__},
                     "runs_as": (RunsAs("sf_dtype", "float8_e8m0fnu", "float32", "x"),)})


def _operands(sizes=(256, 0, 512), n=256, k=384, seed=1):
    """A blockwise problem with power-of-two scales: the FP32 tensors and their E8M0 bytes."""
    rng = np.random.default_rng(seed)
    m, l = sum(sizes), len(sizes)
    aq, sa = quantize_1x128(rng.standard_normal((m, k)), scales="pow2")
    bq, sb = quantize_128x128(rng.standard_normal((l, n, k)), scales="pow2")
    fp8 = lambda x: torch.from_numpy(np.asarray(x).view(np.uint8)).view(torch.float8_e4m3fn)  # noqa: E731
    common = {"a_tensor": fp8(aq), "padded_offsets": torch.tensor(np.cumsum(sizes), dtype=torch.int32),
              "b_tensor": fp8(bq)}
    f32 = dict(common, sfa_tensor=blockwise_sfa_layout(torch.from_numpy(sa)), sfb_tensor=torch.from_numpy(sb))
    e8 = dict(common, sfa_tensor=e8m0_bytes(torch.from_numpy(sa)).view(torch.float8_e8m0fnu),
              sfb_tensor=e8m0_bytes(torch.from_numpy(sb)))            # (any layout; uint8 is E8M0 too)
    return f32, e8


def test_the_op_converts_e8m0_scales_before_its_operand_parse():
    op = fusegemm.Op("grouped_gemm_quant", arch="sm_90a", **E8)
    assert op.e8m0_scales and op.variant.sf_dtype == "float32"
    f32, e8 = _operands()
    from fusegemm.ops.scaled_layouts import e8m0_scale_operands
    names = [n for n in op._operand_names() if n in e8]                # the positional operands
    pos, _ = e8m0_scale_operands(op, tuple(e8[n] for n in names), {}, None)
    got = dict(zip(names, pos))
    assert got["sfa_tensor"].dtype == torch.float32 and got["sfa_tensor"].stride() == f32["sfa_tensor"].stride()
    assert torch.equal(got["sfa_tensor"], f32["sfa_tensor"]) and torch.equal(got["sfb_tensor"], f32["sfb_tensor"])
    same, _ = e8m0_scale_operands(op, tuple(f32[n] for n in names), {}, None)
    assert all(x is f32[n] for x, n in zip(same, names))              # FP32 scales pass untouched
    with pytest.raises(ArgumentError, match="a_tensor.device"):       # past every operand check
        op(**e8, inputs={"alpha": torch.ones(3)})


def test_the_reference_on_e8m0_scales_is_the_reference_on_their_values():
    f32, e8 = _operands()
    op = fusegemm.Op("grouped_gemm_quant", arch="sm_90a", d_dtype="float8_e4m3fn", **E8)
    ins = {"alpha": torch.full((3,), 0.5), "prob": torch.rand(768, generator=torch.Generator().manual_seed(2)),
           "norm_const": 1.0}
    want, got = op.reference(**f32, inputs=ins), op.reference(**e8, inputs=ins)
    assert got.keys() == want.keys() and {"d", "sfd_row", "sfd_col"} <= set(want.keys())
    for key in want.keys():
        g, w = np.asarray(got[key]), np.asarray(want[key])
        assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes(), key


def test_the_wrapper_takes_e8m0_scales_at_128(monkeypatch):
    from fusegemm.ops import scaled_seeds
    monkeypatch.setattr(scaled_seeds, "VALIDATION_ARCH", "sm_90a")   # (CPU tensors: the arch to validate for)
    f32, e8 = _operands()
    with pytest.raises(ArgumentError, match="a_tensor.device"):
        fusegemm.grouped_gemm_quant(a_tensor=e8["a_tensor"], sfa_tensor=e8["sfa_tensor"],
                                    padded_offsets=e8["padded_offsets"], alpha_tensor=torch.ones(3),
                                    b_tensor=e8["b_tensor"], sfb_tensor=e8["sfb_tensor"], sf_vec_size=128)


def test_execute_converts_too():
    """``execute`` (caller outputs) takes the same conversion before its checks."""
    f32, e8 = _operands()
    op = fusegemm.Op("grouped_gemm_quant", arch="sm_90a", **E8)
    outs = {name: torch.empty(shape, dtype=getattr(torch, store))
            for name, (shape, store, _) in op.epilogue.buffers(256, 768, 3).items()}
    with pytest.raises(ArgumentError, match="a_tensor.device"):
        op.execute(**e8, outputs=outs, inputs={"alpha": torch.ones(3)})
    with pytest.raises(ArgumentError, match=r"sfa_tensor.dtype: got int16"):   # not E8M0 bytes: named
        op.execute(**dict(e8, sfa_tensor=torch.zeros(768, 3, dtype=torch.int16)), outputs=outs,
                   inputs={"alpha": torch.ones(3)})
