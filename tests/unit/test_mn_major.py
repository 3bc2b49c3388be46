"""The K-major copy of MN-major block-scaled operands on the CPU (fusegemm/ops/scaled_layouts.py):
its kernel compiles clean for both archs, and each operand form launches it with the geometry and
strides the kernel reads (the values it writes: tests/gpu/test_mn_major_gpu.py; what the CPU
fallback writes: tests/unit/test_seed_compat.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm.ops import scaled_layouts  # noqa: E402


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_transpose_kernel_compiles_clean(arch):
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.cubin_info import Cubin
    cub = compile_source('#include "fusegemm/transpose.cuh"\n', arch=arch, kernel="fusegemm_transpose_u8")
    res = Cubin(cub.data).resources("fusegemm_transpose_u8")
    assert res.local_bytes == 0 and res.max_threads >= 256, res
    # the [c][r] tile of 68-byte columns (ptxas adds the 1 KB it reserves for aligned externs)
    assert 64 * 68 <= res.static_shared_bytes <= 64 * 68 + 1024, res
    assert scaled_layouts._TRANSPOSE_PARAMS.size == 56   # the header's static_assert


class _FakeCuda:
    """A (rows, K[, L]) or (L, rows, K) float8 tensor's geometry as the copy reads it, on 'cuda'."""

    def __init__(self, t, ptr=4096):
        self.t, self.ptr = t, ptr
        self.shape, self.is_cuda, self.dtype, self.device = t.shape, True, t.dtype, "meta"

    def dim(self):
        return self.t.dim()

    def stride(self, i=None):
        return self.t.stride() if i is None else self.t.stride(i)

    def element_size(self):
        return 1

    def data_ptr(self):
        return self.ptr


@pytest.mark.parametrize("form", ["rows_k_l", "canonical", "two_d"])
def test_each_form_launches_the_kernel_with_its_strides(monkeypatch, form):
    launched = []
    monkeypatch.setattr(scaled_layouts._TRANSPOSE, "launch",
                        lambda device, name, grid, block, raw, stream: launched.append(
                            (name, grid, block, scaled_layouts._TRANSPOSE_PARAMS.unpack(raw), stream)) or True)
    monkeypatch.setattr(torch, "empty", lambda shape, dtype, device: _Alloc(shape))
    rows, k, l = 200, 320, 3
    base = torch.zeros(l, k, rows, dtype=torch.float8_e4m3fn)     # rows contiguous
    if form == "rows_k_l":
        t, dims = base.permute(2, 1, 0), 3                        # (rows, K, L), strides (1, rows, rows K)
    elif form == "canonical":
        t, dims = base.permute(0, 2, 1), 0                        # (L, rows, K), strides (rows K, 1, rows)
    else:
        t, dims = base[0].t(), 3                                  # (rows, K), strides (1, rows)
    out = scaled_layouts._k_major_copy(_FakeCuda(t), dims, stream=7, device=0)
    (name, grid, block, params, stream), = launched
    batch = 1 if form == "two_d" else l
    assert name == "fusegemm_transpose_u8" and block == (256, 1, 1) and stream == 7
    assert grid == (4, 5, batch)                                  # ceil(200 / 64), 320 / 64
    src, dst, src_ptrs, ld, lb, r, c, aligned, _ = params
    assert (src, src_ptrs, ld, r, c, aligned) == (4096, 0, rows, rows, k, 1)
    assert lb == (0 if form == "two_d" else rows * k)
    assert out.shape == (t.shape if form != "two_d" else (rows, k))


class _Alloc:
    """torch.empty's stand-in: the (batch, rows, K) buffer, permutable and indexable."""

    def __init__(self, shape):
        self.shape = tuple(shape)

    def data_ptr(self):
        return 1 << 20

    def permute(self, *order):
        return _Alloc(tuple(self.shape[i] for i in order))

    def __getitem__(self, i):
        return _Alloc(self.shape[1:])


def test_no_launch_where_the_kernel_cannot_run(monkeypatch):
    """K not a multiple of 16 bytes, or a CPU tensor: torch's copy (the parse then judges K)."""
    monkeypatch.setattr(scaled_layouts._TRANSPOSE, "launch", lambda *a: pytest.fail("launched"))
    t = torch.zeros(2, 40, 64, dtype=torch.float8_e4m3fn).permute(0, 2, 1)   # (2, 64, 40), K = 40
    out = scaled_layouts._k_major_copy(t, 0, stream=None, device=0)
    assert out.is_contiguous() and out.shape == t.shape
