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
    """The kernel (0 local memory; its parameter struct is the 88 bytes tail.py packs: the header
    static_asserts the size) compiles without CUTLASS in well under a second."""
    from fusegemm.ops import tail
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.cubin_info import Cubin
    cub = compile_source('#include "fusegemm/zero_tail.cuh"\n', arch=arch, kernel=tail._KERNEL)
    res = Cubin(cub.data).resources(tail._KERNEL)
    assert res.local_bytes == 0 and res.max_threads == tail._THREADS, res
    assert cub.seconds < 5.0
    assert tail._PARAMS.size == 88 == struct.calcsize("<4Q4qQiiQ")


def test_zero_tail_packs_one_launch_per_four_buffers(monkeypatch):
    """The launch's parameter bytes name each buffer, its row bytes, the offsets and the rows
    (the 88-byte ZeroTailParams; the row ends' address last, 0 without), four buffers per
    launch, blockIdx.y choosing the buffer; a buffer
    whose rows are not 16-byte whole is zeroed whole instead (before the op's launch)."""
    from fusegemm.ops import tail
    from fusegemm.runtime import launch as launch_mod
    calls = []
    monkeypatch.setattr(tail._KERNELS, "function", lambda device, name: "kernel")
    monkeypatch.setattr(tail._KERNELS, "_launches", {})
    monkeypatch.setattr(launch_mod, "prepare", lambda kernel, cfg: lambda params, stream: calls.append(
        (cfg, bytes(params._data.raw), stream)))
    m = 512
    bufs = [torch.ones(m, 64, dtype=torch.bfloat16) for _ in range(5)]
    odd = torch.ones(m, 3, dtype=torch.bfloat16)           # 6-byte rows: no 16-byte stores
    tail.zero_tail(bufs + [odd], 0x1234, 7, m, 99, 0)
    assert not odd.any() and all(b.all() for b in bufs)     # only the odd one zeroed on the host
    assert len(calls) == 2
    for (cfg, raw, stream), group in zip(calls, (bufs[:4], bufs[4:])):
        fields = tail._PARAMS.unpack(raw)
        assert fields[:4] == tuple([b.data_ptr() for b in group] + [0] * (4 - len(group)))
        assert fields[4:8] == tuple([128] * len(group) + [0] * (4 - len(group)))
        assert fields[8:] == (0x1234, 7, m, 0) and stream == 99
        assert cfg.grid[1] == len(group) and cfg.block == (tail._THREADS, 1, 1)
    calls.clear()
    tail.zero_tail(bufs[:1], 0x1234, 7, m, 99, 0, row_ends_ptr=0x5678)
    assert tail._PARAMS.unpack(calls[0][1])[8:] == (0x1234, 7, m, 0x5678)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_scattered_outputs_kernels_compile_clean(arch):
    """The scattered outputs' two kernels (the named rows' mask, the unnamed rows' zeros) come from
    the tail's header: 0 local memory, 256 threads, the 112-byte ZeroUnnamedParams tail.py packs."""
    from fusegemm.ops import tail
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.cubin_info import Cubin
    cub = compile_source('#include "fusegemm/zero_tail.cuh"\n', arch=arch, kernel="fusegemm_zero_unnamed")
    for name in ("fusegemm_mark_named", "fusegemm_zero_unnamed"):
        res = Cubin(cub.data).resources(name)
        assert res.local_bytes == 0 and res.max_threads == tail._THREADS, (name, res)
    assert tail._UNNAMED.size == 112


def test_zero_unnamed_clears_a_mask_and_launches_mark_then_zero(monkeypatch):
    """zero_unnamed: a mask of ceil(d_rows / 32) words zeroed on the stream, then the mark kernel
    over the problem's rows and the zero kernel over the output rows (a warp a row, blockIdx.y the
    buffer), both with the same parameter bytes (buffers, row bytes, index, offsets, row ends, mask,
    L, M, d_rows); no mark launch without problem rows; False (nothing done) where a buffer's rows
    are not 16-byte whole, more than four buffers are given or the kernels are unavailable."""
    from fusegemm.ops import device as device_mod
    from fusegemm.ops import tail
    from fusegemm.runtime import launch as launch_mod
    from fusegemm.runtime import load
    calls, memsets = [], []

    class _Driver:
        def cuMemsetD32Async(self, ptr, value, words, stream):
            memsets.append((ptr, value, words, stream))
            return (0,)
    monkeypatch.setattr(load, "driver", lambda: _Driver())
    monkeypatch.setattr(load, "check", lambda r, what: None)
    monkeypatch.setattr(device_mod, "record_stream", lambda t, stream: None)
    monkeypatch.setattr(tail._KERNELS, "function", lambda device, name: name)
    monkeypatch.setattr(tail._KERNELS, "_launches", {})
    monkeypatch.setattr(launch_mod, "prepare", lambda kernel, cfg: lambda params, stream: calls.append(
        (kernel, cfg, bytes(params._data.raw), stream)))
    rows = 300
    bufs = [torch.ones(rows, 64, dtype=torch.bfloat16), torch.ones(rows, 8, dtype=torch.float32)]
    assert tail.zero_unnamed(bufs, 0x1000, rows, 0x2000, 3, 768, 99, 0, row_ends_ptr=0x3000)
    assert all(b.all() for b in bufs)                    # nothing zeroed on the host
    (mask, value, words, stream), = memsets
    assert value == 0 and words == 10 and stream == 99   # ceil(300 / 32)
    assert [c[0] for c in calls] == ["fusegemm_mark_named", "fusegemm_zero_unnamed"]
    mark, zero = calls
    assert mark[1].grid == (3, 1, 1) and zero[1].grid == (38, 2, 1)   # 768 / 256 rows; 300 / 8 warps
    assert mark[2] == zero[2] and mark[3] == zero[3] == 99
    fields = tail._UNNAMED.unpack(mark[2])
    assert fields[:4] == (bufs[0].data_ptr(), bufs[1].data_ptr(), 0, 0)
    assert fields[4:8] == (128, 32, 0, 0)
    assert fields[8:11] == (0x1000, 0x2000, 0x3000) and fields[11] == mask
    assert fields[12:] == (3, 768, rows, 0)
    calls.clear()
    assert tail.zero_unnamed(bufs[:1], 0x1000, rows, 0x2000, 3, 0, 99, 0)
    assert [c[0] for c in calls] == ["fusegemm_zero_unnamed"]   # no problem rows: nothing named
    calls.clear()
    odd = torch.ones(rows, 3, dtype=torch.bfloat16)
    assert not tail.zero_unnamed([odd], 0x1000, rows, 0x2000, 3, 768, 99, 0)
    assert not tail.zero_unnamed([bufs[0]] * 5, 0x1000, rows, 0x2000, 3, 768, 99, 0)
    monkeypatch.setattr(tail._KERNELS, "function", lambda device, name: None)
    assert not tail.zero_unnamed(bufs, 0x1000, rows, 0x2000, 3, 768, 99, 0)
    assert calls == [] and odd.all()


def test_zero_tail_without_its_kernel_zeroes_whole_buffers(monkeypatch):
    """No NVRTC (a process running from a kernel bundle only): every buffer is zero-filled whole,
    as the ops did before, and nothing is launched."""
    from fusegemm.ops import tail
    from fusegemm.runtime import launch as launch_mod
    monkeypatch.setattr(tail._KERNELS, "function", lambda device, name: None)
    monkeypatch.setattr(tail._KERNELS, "_launches", {})
    monkeypatch.setattr(launch_mod, "prepare", lambda *a: pytest.fail("launched without a kernel"))
    bufs = [torch.ones(256, 64), torch.ones(256, 8, dtype=torch.bfloat16)]
    tail.zero_tail(bufs, 0, 2, 256, 0, 0)
    assert not any(b.any() for b in bufs)


def test_a_failed_compile_is_remembered_and_means_whole_fills(monkeypatch, caplog):
    """The kernel is compiled once per arch and process; a compile that fails (no NVRTC) is
    logged once and not retried, and _kernel answers None (whole fills) from then on."""
    from fusegemm.base.errors import ToolchainError
    from fusegemm.ops import device, tail
    from fusegemm.runtime import compile as compile_mod
    tries = []

    def no_nvrtc(*a, **k):
        tries.append(1)
        raise ToolchainError("libnvrtc not found")
    monkeypatch.setattr(tail._KERNELS, "_cubins", {})
    monkeypatch.setattr(tail._KERNELS, "_functions", {})
    monkeypatch.setattr(device, "device_arch", lambda d: "sm_90a")
    monkeypatch.setattr(compile_mod, "compile_source", no_nvrtc)
    with caplog.at_level("INFO", logger="fusegemm"):
        assert tail._kernel(0) is None and tail._kernel(1) is None
    assert len(tries) == 1
    assert sum("tail-zeroing kernel is unavailable (ToolchainError" in r.message for r in caplog.records) == 1


def test_epilogue_gemm_compile_loads_the_tail_kernel_once(monkeypatch):
    """EpilogueGemm.compile() loads the tail kernel with its own, and an op with scattered outputs
    the unnamed rows' two as well (a first call inside a CUDA-graph capture then loads no module);
    later compile() calls, which every call makes, do not."""
    from fusegemm import EpilogueGemm
    from fusegemm.ops import engine, tail
    loads = []
    monkeypatch.setattr(engine.LoadedKernel, "build", classmethod(lambda cls, v, d: "launcher"))
    monkeypatch.setattr(tail._KERNELS, "function", lambda device, name: loads.append((device, name)) or "kernel")
    op = EpilogueGemm("grouped_gemm", arch="sm_90a", device=3)
    assert op.compile() is op and op.compile() is op
    assert loads == [(3, tail._KERNEL)]
    loads.clear()
    op = EpilogueGemm("grouped_gemm", arch="sm_90a", device=3, d_scatter=True)
    assert op.compile() is op and op.compile() is op
    assert loads == [(3, tail._KERNEL), (3, "fusegemm_mark_named"), (3, "fusegemm_zero_unnamed")]
