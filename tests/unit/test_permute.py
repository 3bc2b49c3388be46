"""The MoE layer's permutation kernels (fusegemm/permute.py): both archs compile clean (no
local memory, the 64-byte parameter struct the host packs), CPU tensors take torch's route, and
the custom ops' fake implementations give the shapes torch.compile traces (opcheck on the CPU).
On the GPU: tests/gpu/test_permute_gpu.py."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm import routing  # noqa: E402
from fusegemm import permute  # noqa: E402

KERNELS = ("fusegemm_route_rows", "fusegemm_gather_rows", "fusegemm_sum_rows_float32", "fusegemm_sum_rows_bfloat16",
           "fusegemm_sum_rows_float16")


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_permutation_kernels_compile_clean(arch):
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.cubin_info import Cubin
    cub = compile_source('#include "fusegemm/permute.cuh"\n', arch=arch, kernel=KERNELS[0])
    for name in KERNELS:
        res = Cubin(cub.data).resources(name)
        threads = permute._ROUTE_THREADS if name == "fusegemm_route_rows" else permute._THREADS
        assert res.local_bytes == 0 and res.max_threads == threads and res.registers <= 64, res
    assert set(permute._SUMS.values()) == set(KERNELS[2:])
    assert permute._PARAMS.size == 64 and permute._ROUTE.size == 56


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
    ("gather_rows", lambda: (torch.randn(8, 16), torch.tensor([3, -1, 0, 7]))),
    ("sum_rows", lambda: (torch.randn(8, 16), torch.tensor([[0, 1], [5, 2], [7, 7]]))),
])
def test_custom_ops_pass_opcheck(op, args):
    torch.library.opcheck(getattr(torch.ops.fusegemm, op), args())


def test_custom_ops_agree_with_torch_on_the_cpu():
    x = torch.randn(8, 16)
    idx = torch.tensor([3, -1, 0, 7])
    assert torch.equal(torch.ops.fusegemm.gather_rows(x, idx), routing._rows_of_tokens_torch(x, idx))
    pairs = torch.tensor([[0, 1], [5, 2]])
    assert torch.equal(torch.ops.fusegemm.sum_rows(x, pairs), x[pairs].sum(1))


def test_route_rows_custom_op_equals_torchs_routing_on_the_cpu():
    experts = torch.tensor([[0, 2], [2, 1], [0, 1]])
    ends, row_of, token_of_row = torch.ops.fusegemm.route_rows(experts, 3, 1024)
    want = routing._route_rows_torch(experts, 3, 1024)
    assert torch.equal(ends, want[0]) and torch.equal(row_of, want[1]) and torch.equal(token_of_row, want[2])
    assert ends.tolist() == [256, 512, 768] and row_of.tolist() == [[0, 512], [513, 256], [1, 257]]
