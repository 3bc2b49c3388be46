"""The sm_90a epilogue paths that issue 31's block-scaled work moved, compiled on the CPU: the
block-scaled kernels run the BF16 kernel's fragment paths (FUSEGEMM_SM90_BS_FRAGMENT), an 8-bit D
quantized along rows only is quantized on the fragment (FUSEGEMM_SM90_FRAG_QUANT, both kernel
families), and the engine path runs on four warps per warpgroup (FUSEGEMM_SM90_ENGINE_WARPS):
0 spills, and the SASS shows the path taken against the A/B switch that restores the engine
(the engine synchronises each warpgroup with a named barrier per block; the fragment paths with
__syncwarp only). What the H200 runs is checked in tests/gpu (against the interpreter) and
measured in bench/blockscaled.py (--also)."""
from __future__ import annotations

import pytest

from fusegemm.generator.render import render
from fusegemm.generator.variants import make_variant
from fusegemm.runtime import disasm
from fusegemm.runtime.compile import compile_source
from fusegemm.runtime.cubin_info import Cubin

BW = dict(sf_dtype="float32", sf_vec_size=128)


def _compile(spec, axes, extra=()):
    src = render(make_variant(spec, arch="sm_90a", **axes))
    cub = compile_source(src.text, arch="sm_90a", kernel=src.symbol, extra=extra)
    assert Cubin(cub.data).resources(src.symbol).local_bytes == 0, (spec, axes, extra, "spills / local memory")
    return cub


def _named_barriers(cub) -> int:
    hist = disasm.sass_histogram(cub.data)
    return sum(n for op, n in hist.items() if op.startswith("BAR.SYNC") or op.startswith("BAR.ARV"))


@pytest.mark.parametrize("spec,axes,switch", [
    # block-scaled kernels, 16-bit outputs: element-wise (GEMM + alpha), reducing (sReLU: amax), paired (SwiGLU)
    ("grouped_gemm_quant", dict(BW, d_dtype="bfloat16"), "FUSEGEMM_SM90_BS_FRAGMENT"),
    ("grouped_gemm_srelu", dict(BW), "FUSEGEMM_SM90_BS_FRAGMENT"),
    ("grouped_gemm_srelu", {}, "FUSEGEMM_SM90_BS_FRAGMENT"),
    ("grouped_gemm_glu_mx", dict(BW), "FUSEGEMM_SM90_BS_FRAGMENT"),
    # an FP8 D with SFD_row only: quantized on the fragment (BF16 kernel, cooperative and
    # ping-pong; both block-scaled mainloops)
    ("grouped_gemm_swiglu", {}, "FUSEGEMM_SM90_FRAG_QUANT"),
    ("grouped_gemm_swiglu", dict(tile_m=64), "FUSEGEMM_SM90_FRAG_QUANT"),
    ("grouped_gemm_glu_mx", dict(BW, d_dtype="float8_e4m3fn"), "FUSEGEMM_SM90_FRAG_QUANT"),
    ("grouped_gemm_glu_mx", dict(d_dtype="float8_e4m3fn"), "FUSEGEMM_SM90_FRAG_QUANT"),
], ids=lambda x: x if isinstance(x, str) else ".".join(map(str, x.values())) or "default")
def test_fragment_paths(spec, axes, switch):
    cub = _compile(spec, axes)
    engine = _compile(spec, axes, (f"-D{switch}=0",))
    if not disasm.available():
        pytest.skip("nvdisasm is not installed: resources checked, SASS not")
    assert _named_barriers(cub) < _named_barriers(engine), (spec, axes)
    if switch == "FUSEGEMM_SM90_FRAG_QUANT":
        hist = disasm.sass_histogram(cub.data)
        # each row's block max: two butterfly shuffles per row, role and block; FP8 pairs staged by u16
        assert disasm.count_prefix(hist, "SHFL.BFLY") > 0 and disasm.count_prefix(hist, "STS.U16") > 0, hist


@pytest.mark.parametrize("spec,axes", [
    ("grouped_gemm_quant", dict(BW, d_dtype="float8_e4m3fn")),
    ("grouped_gemm_dswiglu", dict(BW)),
    ("grouped_gemm_dswiglu", {}),
], ids=lambda x: x if isinstance(x, str) else ".".join(map(str, x.values())) or "default")
def test_column_quantization_stays_on_the_engine(spec, axes):
    """A D quantized along columns too (SFD_col) runs on the engine whatever FUSEGEMM_SM90_FRAG_QUANT
    says: its fragment path measured slower and was removed (sm90/epilogue.cuh). The same SASS
    with the switch off means the default build did not take a fragment path for it."""
    if not disasm.available():
        pytest.skip("nvdisasm is not installed: the SASS cannot be compared")
    on = disasm.sass_histogram(_compile(spec, axes).data)
    off = disasm.sass_histogram(_compile(spec, axes, ("-DFUSEGEMM_SM90_FRAG_QUANT=0",)).data)
    assert on == off, (spec, axes)


@pytest.mark.parametrize("spec,axes", [
    ("grouped_gemm_quant", dict(BW, d_dtype="float8_e4m3fn")),
    ("grouped_gemm_srelu", dict(BW, d_dtype="float8_e4m3fn")),   # C and D at 256 columns: two engine warps
    ("grouped_gemm_dswiglu", dict(BW)),                          # row sums handed over to warps 0 and 1
    ("grouped_gemm_dswiglu", {}),
    ("gemm_amax", {}),                                           # batched: the engine always
], ids=lambda x: x if isinstance(x, str) else ".".join(map(str, x.values())) or "default")
def test_engine_paths_compile_without_spills(spec, axes):
    # The engine (the default for these rules; FUSEGEMM_SM90_FRAG_QUANT=0 for all), four and two warps.
    _compile(spec, axes, ("-DFUSEGEMM_SM90_FRAG_QUANT=0",))
    _compile(spec, axes, ("-DFUSEGEMM_SM90_FRAG_QUANT=0", "-DFUSEGEMM_SM90_ENGINE_WARPS=2"))
