"""SwiGLU forward on block-scaled operands (spec grouped_gemm_glu_mx) on the CPU: its kernels
compile for both archs without spills, the interpreter agrees with an independent float64
SwiGLU, ``fusegemm.grouped_gemm_glu`` with ``sfa_tensor`` runs this spec (every check up to the
device), the axes its epilogue reads reach the kernel, and selftest has a case for it.
(tests/gpu/test_glu_mx_gpu.py runs it.)"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.base.errors import ArgumentError, UnsupportedError  # noqa: E402
from fusegemm.output_compare import to_device  # noqa: E402
from fusegemm.formats import (dequantize_128x128, dequantize_1x128, dequantize_blockwise, pack_sf,  # noqa: E402
                              quantize_128x128, quantize_1x128, quantize_blockwise)

SPEC = "grouped_gemm_glu_mx"
MX = {"sf_dtype": "float8_e8m0fnu", "sf_vec_size": 32}
BW = {"sf_dtype": "float32", "sf_vec_size": 128}


@pytest.mark.parametrize("arch,axes", [
    ("sm_90a", {**MX}),
    ("sm_90a", {**MX, "d_dtype": "float8_e4m3fn", "generate_c": True, "bias_dtype": "bfloat16",
                "weight_mode": "discrete", "tile_n": 128}),
    ("sm_90a", {**BW, "generate_c": True}),
    ("sm_90a", {**BW, "d_dtype": "float8_e4m3fn", "bias_dtype": "bfloat16", "weight_mode": "discrete"}),
    ("sm_100a", {**MX}),
    ("sm_100a", {**MX, "d_dtype": "float8_e4m3fn", "generate_c": True, "bias_dtype": "bfloat16",
                 "weight_mode": "discrete", "tile_m": 128, "tile_n": 128, "cluster_m": 1}),
])
def test_kernels_compile_without_spills(arch, axes, session_cache):
    from fusegemm.generator.variants import make_variant
    from fusegemm.pipeline import get_kernel
    built = get_kernel(make_variant(SPEC, arch=arch, **axes), session_cache)
    assert built.resources.local_bytes == 0, built.resources
    if arch == "sm_100a":
        assert 0 < built.contract.tmem_cols <= 512


def _t(x):
    """A numpy array (ml_dtypes FP8 / E8M0 or float32) as a CPU torch tensor of its dtype."""
    return to_device(x, "cpu")


def _problem(recipe, sizes=(256, 0, 512), n_acc=256, k=384, seed=0):
    rng = np.random.default_rng(seed)
    m, l = sum(sizes), len(sizes)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((l, n_acc, k)).astype(np.float32) * np.float32(k ** -0.5)
    if recipe == "mx":
        aq, sa = quantize_blockwise(x, ab_dtype="float8_e4m3fn", sf_vec_size=32)
        bq, sb = quantize_blockwise(w, ab_dtype="float8_e4m3fn", sf_vec_size=32)
        a64, b64 = (dequantize_blockwise(q, s, sf_vec_size=32) for q, s in ((aq, sa), (bq, sb)))
        sfa, sfb = _t(pack_sf(sa)), _t(pack_sf(sb, batch_first=True))
    else:
        from fusegemm.formats import blockwise_sfa_layout
        aq, sa = quantize_1x128(x, "float8_e4m3fn")
        bq, sb = quantize_128x128(w, "float8_e4m3fn")
        a64, b64 = dequantize_1x128(aq, sa), dequantize_128x128(bq, sb)
        sfa, sfb = blockwise_sfa_layout(torch.from_numpy(sa)), torch.from_numpy(sb)
    ops = (_t(aq), sfa, torch.tensor(np.cumsum(sizes), dtype=torch.int32), _t(bq), sfb)
    ins = {"alpha": torch.from_numpy(rng.uniform(0.5, 1.5, l).astype(np.float32)),
           "prob": torch.from_numpy(rng.uniform(0, 1, m).astype(np.float32))}
    return ops, ins, a64.astype(np.float64), b64.astype(np.float64)


def _swiglu64(a64, b64, sizes, ins):
    j = np.arange(b64.shape[1] // 2)
    gate, up = (j // 32) * 64 + j % 32, (j // 32) * 64 + 32 + j % 32
    out, start = [], 0
    for e, rows in enumerate(sizes):
        g = a64[start:start + rows] @ b64[e].T * float(ins["alpha"][e])
        out.append(g[:, up] * g[:, gate] / (1 + np.exp(-g[:, gate])))
        start += rows
    return np.concatenate(out) * ins["prob"].double().numpy()[:, None]


@pytest.mark.parametrize("recipe", ["mx", "blockwise"])
def test_interpreter_is_swiglu_of_the_dequantized_operands(recipe):
    sizes = (256, 0, 512)
    ops, ins, a64, b64 = _problem(recipe, sizes)
    op = fusegemm.Op(SPEC, arch="sm_90a", **(MX if recipe == "mx" else BW), d_dtype="float16")
    d = np.asarray(op.reference(*ops, inputs=ins)["d"], np.float64)
    want = _swiglu64(a64, b64, sizes, ins)
    assert d.shape == want.shape == (768, 128)
    assert np.abs(d - want).max() <= 2.0 ** -10 * np.abs(want).max()
    # a swapped gate/up role would not pass
    j = np.arange(128)
    g = a64[:256] @ b64[0].T * float(ins["alpha"][0])
    swapped = g[:, (j // 32) * 64 + j % 32] * 1 / (1 + np.exp(-g[:, (j // 32) * 64 + 32 + j % 32])) * g[
        :, (j // 32) * 64 + 32 + j % 32] * ins["prob"][:256].double().numpy()[:, None]
    assert np.abs(d[:256] - swapped).max() > 0.1 * np.abs(want).max()


def _wrapper_args(recipe):
    (a, sfa, off, b, sfb), ins, _, _ = _problem(recipe)
    return dict(a_tensor=a, sfa_tensor=sfa, padded_offsets=off, alpha_tensor=ins["alpha"], b_tensor=b,
                sfb_tensor=sfb, prob_tensor=ins["prob"], sf_vec_size=32 if recipe == "mx" else 128)


def test_the_glu_wrapper_with_scales_runs_the_block_scaled_spec(monkeypatch):
    from fusegemm.ops import scaled_seeds
    seen = []
    real = scaled_seeds._op
    monkeypatch.setattr(scaled_seeds, "_op", lambda spec, *a: seen.append(spec) or real(spec, *a))
    with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu"):
        fusegemm.grouped_gemm_glu(**_wrapper_args("mx"), d_dtype=torch.float8_e4m3fn, generate_c=True,
                                  norm_const_tensor=torch.ones(1))
    with pytest.raises(ArgumentError, match=r"^norm_const_tensor: got None; allowed: a scalar input"):
        fusegemm.grouped_gemm_glu(**_wrapper_args("mx"), d_dtype=torch.float8_e4m3fn)   # SFD needs it
    # The blockwise recipe runs on sm_90a only: validated there, it reaches the device check too.
    monkeypatch.setattr(scaled_seeds, "VALIDATION_ARCH", "sm_90a")
    with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu"):
        fusegemm.grouped_gemm_glu(**_wrapper_args("blockwise"))
    assert set(seen) == {SPEC}
    with pytest.raises(ArgumentError, match=r"^sf_vec_size: got 64; allowed: 16, 32 \(MX scales\), 128"):
        fusegemm.grouped_gemm_glu(**{**_wrapper_args("mx"), "sf_vec_size": 64})
    with pytest.raises(ArgumentError, match=r"^glu_clamp_max: got 5\.0; allowed: 7\.0\. a GeGLU parameter"):
        fusegemm.grouped_gemm_glu(**_wrapper_args("mx"), glu_clamp_max=5.0)


def test_sm100a_refuses_the_blockwise_recipe():
    with pytest.raises(UnsupportedError, match=r"sf_vec_size=128 is not implemented.*sm_100a"):
        fusegemm.Op(SPEC, arch="sm_100a", **BW).check_support()


def test_axes_the_epilogue_reads_reach_the_kernel():
    """generate_c is no axis of the block-scaled kernel's own, but the spec's rule reads it (a
    ``when: generate_c`` output): it reaches the source and the kernel's name."""
    from fusegemm.generator import registry
    from fusegemm.generator.render import kernel_name
    from fusegemm.generator.spec import find_spec
    from fusegemm.generator.variants import make_variant
    spec = find_spec(SPEC)
    row = registry.lookup(spec.kernel, "sm_90a")
    assert "generate_c" not in row.source_axes
    row.reaching(["generate_c"], spec.epilogue.axes_read())
    with pytest.raises(UnsupportedError, match=r"generate_c: does not reach"):
        row.reaching(["generate_c"])
    names = {kernel_name(make_variant(SPEC, arch="sm_90a", generate_c=g), row) for g in (False, True)}
    assert {n.split(".")[-3] for n in names} == {"noc", "genc"}


def test_selftest_has_a_case_for_the_spec():
    from fusegemm import selftest
    cases = selftest.RUNNERS["grouped_gemm_srelu"]()
    assert [c for c in cases if c[1].get("spec") == SPEC]
