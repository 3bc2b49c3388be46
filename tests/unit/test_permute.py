"""The MoE layer's permutation kernels (fusegemm/permute.py): both archs compile clean (no
local memory, the 64- and 72-byte parameter structs the host packs), CPU tensors take torch's route, and
the custom ops' fake implementations give the shapes torch.compile traces (opcheck on the CPU).
On the GPU: tests/gpu/test_permute_gpu.py."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm import routing  # noqa: E402
from fusegemm import permute  # noqa: E402

KERNELS = ("fusegemm_route_rows", "fusegemm_gather_rows", "fusegemm_sum_rows_float32", "fusegemm_sum_rows_bfloat16",
           "fusegemm_sum_rows_float16", "fusegemm_spread_rows")


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_permutation_kernels_compile_clean(arch):
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.cubin_info import Cubin
    cub = compile_source('#include "fusegemm/permute.cuh"\n', arch=arch, kernel=KERNELS[0])
    for name in KERNELS:
        res = Cubin(cub.data).resources(name)
        threads = permute._ROUTE_THREADS if name == "fusegemm_route_rows" else permute._THREADS
        assert res.local_bytes == 0 and res.max_threads == threads and res.registers <= 64, res
    assert set(permute._SUMS.values()) == set(KERNELS[2:5])
    assert permute._PARAMS.size == 64 and permute._ROUTE.size == 64 and permute._SPREAD.size == 72


def _gather_sass(arch, defines, kernel="fusegemm_gather_rows"):
    from fusegemm.runtime import disasm
    from fusegemm.runtime.cubin_info import Cubin
    from fusegemm.runtime.compile import compile_source
    # (the defines as SmallKernels.variant passes them to NVRTC)
    cub = compile_source('#include "fusegemm/permute.cuh"\n', arch=arch, kernel=kernel,
                         extra=permute._KERNELS.variant(defines).defines)
    res = Cubin(cub.data).resources(kernel)
    assert res.local_bytes == 0 and res.registers <= 64, res
    text = disasm.sass(cub.data)
    body = text[text.index(f".text.{kernel}:"):]
    body = body[:body.find(".text.", 1)] if ".text." in body[1:] else body   # this kernel's alone
    return [line.split(";")[0].split("*/")[-1].strip() for line in body.splitlines() if "/*" in line and ";" in line]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_gather_switches_keep_four_loads_in_flight_before_their_stores(arch):
    """FUSEGEMM_PERMUTE_GATHER_PIPELINE: a thread's whole group of four 16-byte loads is issued
    before its first store (the compiler had interleaved them two and two, and the default build
    waits for each load before its store); FUSEGEMM_PERMUTE_STREAM_STORES: every row store
    streaming (evict-first), and the loads still ahead of them."""
    plain = _gather_sass(arch, "-DFUSEGEMM_PERMUTE_STREAM_STORES=0")
    assert sum("LDG.E.128" in i for i in plain) == 1 and not any(".EF" in i for i in plain if "STG" in i)
    default = _gather_sass(arch, "")   # streaming stores by default (measured faster on the H200)
    assert sum("LDG.E.128" in i for i in default) == 1
    assert [i for i in default if "STG" in i] and all(".EF" in i for i in default if "STG" in i)
    for defines, streaming in (("-DFUSEGEMM_PERMUTE_GATHER_PIPELINE=1 -DFUSEGEMM_PERMUTE_STREAM_STORES=0", False),
                               ("-DFUSEGEMM_PERMUTE_GATHER_PIPELINE=1 -DFUSEGEMM_PERMUTE_STREAM_STORES=1", True)):
        sass = _gather_sass(arch, defines)
        mem = [i for i in sass if "LDG.E.128" in i or "STG.E" in i]
        runs, last, n = [], None, 0   # lengths of the runs of row loads and of stores, in order
        for i in mem:
            kind = "L" if "LDG.E.128" in i else "S"
            if kind == last:
                n += 1
            else:
                if last is not None:
                    runs.append((last, n))
                last, n = kind, 1
        runs.append((last, n))
        assert ("L", 4) in runs, (defines, runs)                  # a whole group's four loads together
        assert all(n <= 4 for kind, n in runs if kind == "L"), runs
        stores = [i for i in mem if "STG" in i]
        assert stores and all((".EF" in i) == streaming for i in stores), stores


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_token_order_gather_reads_each_token_once(arch):
    """fusegemm_spread_rows: a token's group of four 16-byte vectors is loaded once and stored to
    each of its k rows (streaming stores, as the row-order gather's), then the padding rows'
    zeros; 0 local memory. On sm_90a the whole kernel has those 4 row loads (no load of the row
    per destination); sm_100a's compiler makes several copies of the group loop (4 loads each)."""
    sass = _gather_sass(arch, "", "fusegemm_spread_rows")
    loads = sum("LDG.E.128" in i for i in sass)
    assert loads == 4 if arch == "sm_90a" else loads % 4 == 0, [i for i in sass if "LDG" in i]
    stores = [i for i in sass if "STG" in i]
    assert len(stores) > 4 and all(".EF" in i and ".128" in i for i in stores), stores


def test_cpu_tensors_take_torchs_route():
    x = torch.randn(8, 16).bfloat16()
    assert permute.gather_rows(x, torch.arange(8)) is None
    assert permute.sum_rows(x, torch.arange(8).view(4, 2)) is None
    r = routing.route(torch.randn(8, 4), 2)
    rows = routing.gather(x, r)
    assert torch.equal(rows, routing._rows_of_tokens_torch(x, r.token_of_row))
    # Torch's gather puts token t's copy at its row and zeros at padding rows.
    for t in range(8):
        for j in range(2):
            assert torch.equal(rows[r.row_of[t, j]], x[t])
    assert not rows[r.token_of_row < 0].any()


@pytest.mark.parametrize("op,args", [
    ("route_rows", lambda: (torch.tensor([[0, 2], [2, 1], [0, 1]]), 3, 1024)),
    ("gather_rows", lambda: (torch.randn(8, 16), torch.tensor([3, -1, 0, 7]), torch.tensor([[2], [-1], [-1], [0],
                                                                                            [-1], [-1], [-1], [3]]))),
    ("sum_rows", lambda: (torch.randn(8, 16), torch.tensor([[0, 1], [5, 2], [7, 7]]))),
])
def test_custom_ops_pass_opcheck(op, args):
    torch.library.opcheck(getattr(torch.ops.fusegemm, op), args())


def test_custom_ops_agree_with_torch_on_the_cpu():
    x = torch.randn(8, 16)
    idx = torch.tensor([3, -1, 0, 7])
    row_of = torch.tensor([[2], [-1], [-1], [0], [-1], [-1], [-1], [3]])
    assert torch.equal(torch.ops.fusegemm.gather_rows(x, idx, row_of), routing._rows_of_tokens_torch(x, idx))
    pairs = torch.tensor([[0, 1], [5, 2]])
    assert torch.equal(torch.ops.fusegemm.sum_rows(x, pairs), x[pairs].sum(1))


def test_route_rows_custom_op_equals_torchs_routing_on_the_cpu():
    experts = torch.tensor([[0, 2], [2, 1], [0, 1]])
    ends, row_of, token_of_row, row_ends = torch.ops.fusegemm.route_rows(experts, 3, 1024)
    want = routing._route_rows_torch(experts, 3, 1024)
    assert all(torch.equal(a, b) for a, b in zip((ends, row_of, token_of_row, row_ends), want))
    assert ends.tolist() == [256, 512, 768] and row_of.tolist() == [[0, 512], [513, 256], [1, 257]]
    assert row_ends.tolist() == [2, 258, 514] and row_ends.dtype == torch.int32   # each expert's 2 tokens


def test_permutations_pack_their_launches(monkeypatch):
    """What gather_rows and sum_rows hand the driver (their kernels stand in here; on the GPU:
    tests/gpu/test_permute_gpu.py): the 64-byte PermuteParams (source, destination, index, rows,
    source rows, both pitches in bytes, 16-byte vectors per row, k), a grid-stride grid over the
    rows, 256 threads, torch's current stream."""
    from fusegemm.runtime import launch as launch_mod
    calls = []
    monkeypatch.setattr(permute, "_rows_ok", lambda t: True)            # CPU tensors stand in for CUDA ones
    monkeypatch.setattr(permute._KERNELS, "function", lambda device, name: name)
    monkeypatch.setattr(permute._KERNELS, "_launches", {})
    monkeypatch.setattr(launch_mod, "prepare", lambda kernel, cfg: lambda params, stream: calls.append(
        (kernel, cfg, bytes(params._data.raw), stream)))
    monkeypatch.setattr("fusegemm.runtime.load.thread_context", lambda device: None)
    monkeypatch.setattr("fusegemm.runtime.tensors.resolve_stream", lambda stream, device: 77)
    x = torch.randn(10, 24)[:, :16]                                     # fp32 rows, pitch 96 bytes
    idx = torch.tensor([3, -1, 9, 0])
    out = permute.gather_rows(x, idx)
    kernel, cfg, raw, stream = calls[-1]
    assert kernel == "fusegemm_gather_rows" and stream == 77
    assert permute._PARAMS.unpack(raw) == (x.data_ptr(), out.data_ptr(), idx.data_ptr(), 4, 10, 96, 64, 4, 0)
    assert cfg.grid == (4, 1, 1) and cfg.block == (permute._THREADS, 1, 1)
    rows = torch.randn(5000, 8).bfloat16()
    pairs = torch.tensor([[0, 1, 2], [4, 3, 4999]])
    out = permute.sum_rows(rows, pairs)
    kernel, cfg, raw, _ = calls[-1]
    assert kernel == "fusegemm_sum_rows_bfloat16" and out.shape == (2, 8) and out.dtype == torch.bfloat16
    assert permute._PARAMS.unpack(raw) == (rows.data_ptr(), out.data_ptr(), pairs.data_ptr(), 2, 5000, 16, 16, 1, 3)
    assert cfg.grid == (2, 1, 1)
    assert permute.sum_rows(rows[:, :0], pairs[:0]).shape == (0, 0) and len(calls) == 2   # no rows: no launch
    # In token order (the routing's row_of beside the index): the 72-byte SpreadParams, k, and a
    # grid over the tokens and the padding scan's 32-row items (10 tokens + 1 item for 4 rows).
    row_of = torch.tensor([[2], [-1], [-1], [0], [-1], [-1], [-1], [-1], [-1], [1]])
    out = permute.gather_rows(x, idx, row_of)
    kernel, cfg, raw, _ = calls[-1]
    assert kernel == "fusegemm_spread_rows" and out.shape == (4, 16)
    assert permute._SPREAD.unpack(raw) == (x.data_ptr(), out.data_ptr(), idx.data_ptr(), 4, 10, 96, 64, 4, 1,
                                           row_of.data_ptr())
    assert cfg.grid == (11, 1, 1)
    assert permute.gather_rows(x, idx, row_of[:5]) is None   # not one entry per token: torch's route


def test_the_layers_gathers_pass_row_of_in_token_order_only(monkeypatch):
    """routing.TOKEN_ORDER (off until a GPU has run the token-order kernel): the layer's gather and
    its backward's (the combine's gradient) hand the kernel the routing's row_of only when it is
    on; the values are the same either way."""
    seen = []

    def spy(x, token_of_row, row_of):
        seen.append(row_of)
        return routing._rows_of_tokens_torch(x, token_of_row)
    monkeypatch.setattr(routing, "_rows_of_tokens", spy)
    x = torch.randn(8, 16, requires_grad=True)
    r = routing.route(torch.randn(8, 4), 2)
    off = routing.gather(x, r)
    routing.combine(torch.randn(r.rows, 16, requires_grad=True), r).sum().backward()
    assert len(seen) == 2 and all(s is None for s in seen)
    monkeypatch.setattr(routing, "TOKEN_ORDER", True)
    on = routing.gather(x, r)
    routing.combine(torch.randn(r.rows, 16, requires_grad=True), r).sum().backward()
    assert len(seen) == 4 and all(s is r.row_of for s in seen[2:])
    assert torch.equal(on, off)
