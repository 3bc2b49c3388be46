"""Zeros past the last padded offset (fusegemm/ops/tail.py): which buffers an op allocates
uninitialised (the row outputs, whose rows below the last offset the kernel stores), what keeps
its fill (SF buffers, amax, dprob), and the tail kernel compiled on both archs. On the GPU:
tests/gpu/test_epilogue_gpu.py and test_wgrad_gpu.py (outputs on memory full of NaN bytes)."""
from __future__ import annotations

import math
import struct

import pytest

from fusegemm.generator.spec import find_spec
from fusegemm.generator.variants import make_variant

torch = pytest.importorskip("torch")


def _resolved(spec, **axes):
    v = make_variant(spec, arch="sm_90a", **axes)
    return find_spec(spec).epilogue.resolve(v.choices)


@pytest.mark.parametrize("spec,axes,rows", [
    ("grouped_gemm_swiglu", dict(d_dtype="float8_e4m3fn", generate_c=True, c_dtype="bfloat16"), {"c", "d"}),
    ("grouped_gemm_dswiglu_bf16", {}, {"d"}),
    ("grouped_gemm_dswiglu", {}, {"c", "d", "d_col"}),
])
def test_row_buffers_are_the_outputs_and_their_column_copies(spec, axes, rows):
    r = _resolved(spec, **axes)
    assert set(r.row_buffers()) == rows & set(r.buffers(256, 512, 4))
    for name in r.row_buffers():
        assert r.buffers(256, 512, 4)[name][0][0] == 512     # one row per problem row


def test_rows_written_leaves_only_the_row_outputs_uninitialised(monkeypatch):
    """Every other buffer keeps its fill (amax -inf, SF and dprob 0); the row outputs come from
    torch.empty, and nothing else does."""
    from fusegemm.ops import device
    r = _resolved("grouped_gemm_dswiglu")
    made = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: made.append(a[0]) or real_empty(*a, **k))
    out = device.alloc_outputs(r, 256, 512, 4, "cpu", rows_written=True)
    monkeypatch.setattr(torch, "empty", real_empty)
    shapes = r.buffers(256, 512, 4)
    assert sorted(made) == sorted(shapes[n][0] for n in r.row_buffers())
    for name, t in out.items():
        if name not in r.row_buffers():
            fill = shapes[name][2]
            assert (t.float() == fill).all() if not math.isinf(fill) else torch.isinf(t).all(), name
    filled = device.alloc_outputs(r, 256, 512, 4, "cpu")
    assert all(not t.float().any() for n, t in filled.items() if n in r.row_buffers())


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_tail_kernel_compiles_clean(arch):
    """The kernel (0 local memory; its parameter struct is the 80 bytes tail.py packs: the header
    static_asserts the size) compiles without CUTLASS in well under a second."""
    from fusegemm.ops import tail
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.inspect import Cubin
    cub = compile_source(tail._SOURCE, arch=arch, kernel=tail._KERNEL)
    res = Cubin(cub.data).resources(tail._KERNEL)
    assert res.local_bytes == 0 and res.max_threads == tail._THREADS, res
    assert cub.seconds < 5.0
    assert tail._PARAMS.size == 80 == struct.calcsize("<4Q4qQii")
