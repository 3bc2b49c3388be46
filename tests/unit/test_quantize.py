"""The blockwise recipe's quantization kernels (fusegemm/quantize.py): both archs compile clean
(no local memory, 256 threads, static shared memory under 48 KB, the 152-byte parameter struct
the host packs), what each function packs for the driver, and the torch route (CPU tensors,
tensors the kernel does not serve) giving torch_blockwise's values. On the GPU, bit for bit
against torch_blockwise: tests/gpu/test_quantize_gpu.py."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm import quantize as qz  # noqa: E402
from fusegemm.formats import torch_blockwise as bw  # noqa: E402

KERNELS = ("fusegemm_quantize_bfloat16", "fusegemm_quantize_float16", "fusegemm_quantize_float8_e4m3fn")


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_quantization_kernels_compile_clean(arch):
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.cubin_info import Cubin
    cub = compile_source('#include "fusegemm/quantize.cuh"\n', arch=arch, kernel=KERNELS[0])
    for name in KERNELS:
        res = Cubin(cub.data).resources(name)
        # at most 64 registers: four or more CTAs of 256 threads per SM (the kernel lives on the
        # loads each CTA has in flight)
        assert res.local_bytes == 0 and res.max_threads == qz._THREADS and res.registers <= 64, res
        assert 128 * 128 * 2 <= res.static_shared_bytes <= 48 * 1024, res
    assert set(qz._SOURCES.values()) == set(KERNELS) and qz._PARAMS.size == 152


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_row_batch_switch_compiles_clean(batch):
    """FUSEGEMM_QUANTIZE_ROW_BATCH (the row pass's loads in flight where the tile is not staged
    by cp.async: the FP8 source, and 2-byte ones under FUSEGEMM_QUANTIZE_STAGE_ASYNC=0): the
    default (4) and the batches beside it compile without local memory on both archs, and the
    warp's loads of a batch are issued together (sm_90a SASS: at most 40 instructions apart, where
    one row a time has each load wait for the previous row's divisions)."""

    from fusegemm.runtime import disasm
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.cubin_info import Cubin
    extra = ("-DFUSEGEMM_QUANTIZE_STAGE_ASYNC=0",) + (() if batch == 4 else (f"-DFUSEGEMM_QUANTIZE_ROW_BATCH={batch}",))
    for arch in ("sm_90a", "sm_100a"):
        cub = compile_source('#include "fusegemm/quantize.cuh"\n', arch=arch, kernel=KERNELS[0], extra=extra)
        for name in KERNELS:
            res = Cubin(cub.data).resources(name)
            assert res.local_bytes == 0 and res.registers <= 64, (arch, res)
        if arch == "sm_90a" and batch > 1 and disasm.available():
            ops = disasm.opcodes(_function(disasm.sass(cub.data), KERNELS[0]))
            loads = [i for i, op in enumerate(ops) if op.startswith("LDG")]
            assert len(loads) >= batch and max(b - a for a, b in zip(loads, loads[1:batch])) <= 40, loads[:batch]


def test_block_transpose_switch_compiles_clean():
    """FUSEGEMM_QUANTIZE_BLOCK_TRANSPOSE=1 (the weights' transposed copy made from q's bytes through
    shared memory): compiles without local memory on both archs within the register budget, also
    at 6 CTAs per SM (FUSEGEMM_QUANTIZE_MIN_CTAS, the default), and carries the transpose: at least
    48 more byte permutes (3 per 4-byte word of a lane's four 16-byte columns) than the
    column-pass build, the default (sm_90a SASS). Other values are refused at compile time."""
    from fusegemm.runtime import disasm
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.cubin_info import Cubin
    prmt = {}
    on = ("-DFUSEGEMM_QUANTIZE_BLOCK_TRANSPOSE=1",)
    for extra in (on, on + ("-DFUSEGEMM_QUANTIZE_MIN_CTAS=0",), ()):
        for arch in ("sm_90a", "sm_100a"):
            cub = compile_source('#include "fusegemm/quantize.cuh"\n', arch=arch, kernel=KERNELS[0], extra=extra)
            for name in KERNELS:
                res = Cubin(cub.data).resources(name)
                assert res.local_bytes == 0 and res.registers <= 64, (arch, extra, res)
                if "-DFUSEGEMM_QUANTIZE_MIN_CTAS=0" not in extra:
                    assert res.registers <= 40, (arch, res)   # 65536 / (6 x 256), in steps of 8
            if arch == "sm_90a" and disasm.available():
                sass = disasm.sass(cub.data)
                prmt[extra] = [sum(op.startswith("PRMT") for op in disasm.opcodes(_function(sass, n))) for n in KERNELS]
    with pytest.raises(Exception, match="BLOCK_TRANSPOSE"):
        compile_source('#include "fusegemm/quantize.cuh"\n', arch="sm_90a", kernel=KERNELS[0],
                       extra=("-DFUSEGEMM_QUANTIZE_BLOCK_TRANSPOSE=2",))
    if not prmt:
        pytest.skip("no disassembler (pip install nvidia-cuda-nvdisasm): resources checked, SASS not")
    assert all(a - b >= 48 for a, b in zip(prmt[on], prmt[()])), prmt


def test_passes_spend_few_instructions_per_value():
    """The packed passes (quantize.cuh's header comment; sm_90a SASS of every kernel): maxima over
    16-bit |x| pairs (max.u16x2: VIMNMX.U16x2), the element format chosen once per tile (no
    predicated FP8 conversion: the runtime flag made every conversion a predicated pair), and the
    three-instruction division (no sign copy, LOP3 0xb8 with 0x80000000, after the correction)."""
    import re

    from fusegemm.runtime import disasm
    from fusegemm.runtime.compile import compile_source
    if not disasm.available():
        pytest.skip("no disassembler (pip install nvidia-cuda-nvdisasm)")
    sass = disasm.sass(compile_source('#include "fusegemm/quantize.cuh"\n', arch="sm_90a", kernel=KERNELS[0]).data)
    for name in KERNELS:
        fn = _function(sass, name)
        ops = disasm.opcodes(fn)
        assert any(op.startswith(("VIMNMX.U16", "VIMNMX3.U16")) for op in ops), name   # (U16x2)
        assert any(op.startswith("F2FP") for op in ops), name
        assert not re.search(r"@!?P\d\s+F2FP", fn), name
        assert not re.search(r"LOP3\.LUT R\d+, R\d+, 0x80000000, R\d+, 0xb8", fn), name


def _function(sass: str, name: str) -> str:
    import re
    return next(f for f in re.split(r"\n\s*\.text\.", sass) if f.startswith(name))


def test_two_byte_sources_stage_the_tile_by_cp_async():
    """By default the 2-byte sources' tiles arrive by cp.async, all 32 KB in flight before the
    row pass: eight 16-byte LDGSTS per thread and no register load of the source (sm_90a SASS);
    the FP8 source still loads through registers (it is dequantized on the way)."""
    from fusegemm.runtime import disasm
    from fusegemm.runtime.compile import compile_source
    if not disasm.available():
        pytest.skip("no disassembler (pip install nvidia-cuda-nvdisasm)")
    sass = disasm.sass(compile_source('#include "fusegemm/quantize.cuh"\n', arch="sm_90a", kernel=KERNELS[0]).data)
    for name in KERNELS[:2]:
        ops = disasm.opcodes(_function(sass, name))
        assert sum(op.startswith("LDGSTS.E.BYPASS") and op.endswith(".128") for op in ops) == 8, name
        assert not [op for op in ops if op.startswith("LDG.")], name
    ops = disasm.opcodes(_function(sass, KERNELS[2]))
    assert not [op for op in ops if op.startswith("LDGSTS")] and [op for op in ops if op.startswith("LDG.")]


def test_no_division_slow_path():
    """Every division is div_by_scale (common.cuh: the values by ScaleDivisor, with no branch per
    value for non-finite scales; the scales by div_by_elem_max): no div.rn range check (FCHK) or
    slow-path call in any of the kernels on either arch."""
    from fusegemm.runtime import disasm
    from fusegemm.runtime.compile import compile_source
    if not disasm.available():
        pytest.skip("no disassembler (pip install nvidia-cuda-nvdisasm)")
    for arch in ("sm_90a", "sm_100a"):
        ops = disasm.opcodes(disasm.sass(compile_source('#include "fusegemm/quantize.cuh"\n', arch=arch,
                                                        kernel=KERNELS[0]).data))
        assert not [op for op in ops if op.startswith(("FCHK", "CALL"))], arch


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(
        a.view(torch.uint8) if a.element_size() == 1 else a, b.view(torch.uint8) if b.element_size() == 1 else b)


def test_cpu_tensors_take_torch_blockwise_route():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(272, 384, generator=g).bfloat16()
    for got, want in [(qz.quantize_1x128(x), bw.quantize_1x128(x)),
                      (qz.quantize_wgrad(x), bw.quantize_wgrad(x)),
                      (qz.quantize_1x128(x, torch.float8_e5m2, "pow2"),
                       bw.quantize_1x128(x, torch.float8_e5m2, "pow2"))]:
        assert all(_same(a, b) for a, b in zip(got, want))
    (q, s), (qt, st) = qz.quantize_both(x)
    assert all(_same(a, b) for a, b in zip((q, s, qt, st), (*bw.quantize_1x128(x), *bw.quantize_wgrad(x))))
    w = torch.randn(3, 200, 256, generator=g)
    (wq, sw), (wt, swt) = qz.quantize_128x128(w, transposed=True)
    want = bw.quantize_128x128(w)
    assert _same(wq, want[0]) and _same(sw, want[1])
    assert all(_same(a, b) for a, b in zip((wt, swt), bw.transposed_128x128(*want)))
    hq, sh = bw.quantize_1x128(x)
    for via in (torch.bfloat16, torch.float32):
        got = qz.requantize_wgrad(hq, sh, via=via)
        assert all(_same(a, b) for a, b in zip(got, bw.quantize_wgrad(bw.dequantize_1x128(hq, sh).to(via))))
    with pytest.raises(ValueError, match="scales: got 'e8m0'"):   # torch_blockwise's checks name the argument
        qz.quantize_1x128(x, scales="e8m0")
    with pytest.raises(ValueError, match=r"^q: got torch.bfloat16 \(272, 384\); allowed: an FP8"):
        qz.requantize_wgrad(x, sh)
    with pytest.raises(ValueError, match=r"^s: got torch.float32 \(272, 2\); allowed: q's float scales of shape "
                                         r"\(272, 3\)"):
        qz.requantize_wgrad(hq, sh[:, :2])


def test_what_the_kernel_does_not_serve(monkeypatch):
    """Sizes that are not multiples of 16, unaligned pitches, other dtypes and devices: torch's
    route (_served is False)."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    ok = torch.zeros(32, 256, dtype=torch.bfloat16)
    assert qz._served(ok) and qz._served(torch.zeros(2, 128, 64, dtype=torch.bfloat16), batched=True)
    assert qz._served(torch.zeros(32, 64, dtype=torch.float8_e4m3fn))
    for bad in (torch.zeros(24, 256, dtype=torch.bfloat16), torch.zeros(32, 40, dtype=torch.bfloat16),
                torch.zeros(32, 264, dtype=torch.bfloat16)[:, 4:260],                         # 8-byte start
                torch.zeros(32, 260, dtype=torch.bfloat16)[:, :256],                          # 520-byte pitch
                torch.zeros(32, 256), torch.zeros(32, 256, dtype=torch.bfloat16).t(), torch.zeros(0, 256).bfloat16(),
                torch.zeros(32, 256, dtype=torch.float8_e5m2)):
        assert not qz._served(bad), (bad.shape, bad.stride(), bad.dtype)
    assert not qz._served(torch.zeros(32, 256, dtype=torch.bfloat16), batched=True)   # a batch is 3-D


def test_launches_pack_the_parameter_struct(monkeypatch):
    """What each function hands the driver (its kernel stands in here; on the GPU:
    tests/gpu/test_quantize_gpu.py): QuantizeParams' pointers, pitches and batch strides, sizes,
    mode and flags; a grid of 128 x 128 tiles (column tiles, row tiles, batches), 256 threads."""
    calls = []
    monkeypatch.setattr(qz, "_served", lambda t, batched=False: True)   # CPU tensors stand in for CUDA ones
    monkeypatch.setattr(qz._KERNELS, "run_on", lambda lead, name, grid, block, raw: calls.append(
        (name, grid, block, qz._PARAMS.unpack(raw))) or True)
    y = torch.zeros(272, 384, dtype=torch.bfloat16)
    (q, s), (qt, st) = qz.quantize_both(y, scales="pow2")
    name, grid, block, p = calls[-1]
    assert name == "fusegemm_quantize_bfloat16" and grid == (3, 3, 1) and block == (256, 1, 1)
    assert q.shape == (272, 384) and s.shape == (272, 3) and s.stride() == (1, 272)
    assert qt.shape == (384, 272) and st.shape == (384, 3) and st.stride() == (1, 384)
    assert p == (y.data_ptr(), 0, q.data_ptr(), s.data_ptr(), qt.data_ptr(), st.data_ptr(),
                 384, 0, 0, 384, 272 * 384, 272, 0, 272, 272 * 384, 384, 0, 272, 384, 0, qz._POW2)
    qz.quantize_wgrad(torch.zeros(16, 16, dtype=torch.float16), torch.float8_e5m2)
    name, grid, _, p = calls[-1]
    assert name == "fusegemm_quantize_float16" and grid == (1, 1, 1) and p[2] == p[3] == 0 and p[-1] == qz._E5M2
    w = torch.zeros(5, 200, 400, dtype=torch.bfloat16)
    (wq, sw), (wt, swt) = qz.quantize_128x128(w, transposed=True)
    name, grid, _, p = calls[-1]
    assert grid == (4, 2, 5) and wt.shape == (5, 400, 200) and swt.shape == (5, 4, 2) and sw.shape == (5, 2, 4)
    assert p == (w.data_ptr(), 0, wq.data_ptr(), sw.data_ptr(), wt.data_ptr(), swt.data_ptr(),
                 400, 200 * 400, 0, 400, 200 * 400, 4, 8, 200, 200 * 400, 2, 8, 200, 400, 1, 0)
    hq = torch.zeros(256, 128, dtype=torch.float8_e4m3fn)
    from fusegemm.formats import blockwise_sfa_layout
    sh = blockwise_sfa_layout(torch.ones(256, 1))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    qt, st = qz.requantize_wgrad(hq, sh)
    name, grid, _, p = calls[-1]
    assert name == "fusegemm_quantize_float8_e4m3fn" and p[1] == sh.data_ptr() and p[8] == sh.stride(1) == 256
    assert qt.shape == (128, 256) and p[2] == 0 and p[4] == qt.data_ptr()


def test_small_kernels_built_under_other_defines_load_their_own_module(monkeypatch):
    """Two SmallKernels of one header, the second compiled under other NVRTC defines (what
    bench/quantize.py --also builds): each loads its own cubin, because the module key carries the
    cubin's digest; with the header's path alone the second would get the first one's kernels."""
    from fusegemm.ops import device
    from fusegemm.ops.small_kernels import SmallKernels
    from fusegemm.runtime import config, load
    loaded = {}

    class Modules:
        def get(self, cubin, name, *, key, smem_bytes, device):
            return loaded.setdefault(key, (cubin, name))
    monkeypatch.setattr(load, "default_modules", lambda: Modules())
    monkeypatch.setattr(device, "device_arch", lambda d: "sm_90a")
    base = SmallKernels(qz._KERNELS.header, "quantize", "torch")
    other = SmallKernels(qz._KERNELS.header, "quantize", "torch")
    first = base.function(0, KERNELS[0])
    with config.override(FUSEGEMM_NVRTC_EXTRA="-DFUSEGEMM_QUANTIZE_STAGE_ASYNC=0"):
        second = other.function(0, KERNELS[0])
    assert first[0] != second[0] and len(loaded) == 2
    assert base.function(0, KERNELS[0]) is first                 # each instance keeps its own
    # variant(): the same build through the instance's own defines (bench --also, tests/gpu)
    third = base.variant("-DFUSEGEMM_QUANTIZE_STAGE_ASYNC=0")
    assert third.defines == ("-DFUSEGEMM_QUANTIZE_STAGE_ASYNC=0",) and base.defines == ()
    assert third.function(0, KERNELS[0]) is second and len(loaded) == 2
