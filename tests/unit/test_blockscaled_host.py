"""The block-scaled op's host path without a GPU: the tensor maps and launch values it builds
from validated operands (grouped and batched), and the output comparison the GPU tests and
selftest rely on (it must be able to fail)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fusegemm.base.contract import KernelContract  # noqa: E402
from fusegemm.output_compare import compare_outputs  # noqa: E402
from fusegemm.ops.blockscaled import BlockScaledGemm  # noqa: E402
from fusegemm.ops.scaled_operands import parse_batched, parse_scaled, scaled_maps  # noqa: E402
from fusegemm.problems import make_batched_problem, make_grouped_problem  # noqa: E402
from fusegemm.tupledict import TupleDict  # noqa: E402

from test_scaled_errors import _cpu  # noqa: E402


class _Maps:
    """Records the tiled() calls of a launcher's TensorMapCache."""

    def __init__(self):
        self.calls = []

    def tiled(self, address, dtype, shape, strides, box, swizzle=128, *rest):
        self.calls.append(dict(address=address, dtype=dtype, shape=shape, strides=strides, box=box, swizzle=swizzle))
        return b"\0" * 128


class _Launcher:
    def __init__(self, contract):
        self.contract = contract
        self.tmaps = _Maps()


def _contract(**over):
    base = dict(threads=384, smem_bytes=1, min_cluster_m=1, min_cluster_n=1, max_cluster_ctas=1, ctas_per_tile=1,
                tile_m=128, tile_n=256, tile_k=128, m_aligned=256, box_a_inner=128, box_a_outer=128,
                box_b_inner=128, box_b_outer=128, swizzle_a=128, swizzle_b=128, tma_dtype_a=0, tma_dtype_b=0,
                tmap_slot_stride=0, tmem_cols=0, sf_box_k=1, sf_box_nb=1)
    base.update(over)
    return KernelContract(**base)


def test_grouped_maps_follow_the_operands_and_the_contract():
    pb = make_grouped_problem("grouped_gemm_srelu", num_experts=3, tokens=[256, 0, 300], n=384, k=320, seed=0)
    kw = {k: _cpu(v) for k, v in pb.kwargs(sf_vec_size=32).items()}
    call = parse_scaled(kw["a_tensor"], kw["sfa_tensor"], kw["padded_offsets"], kw["b_tensor"], kw["sfb_tensor"],
                        None, None, None, 32)
    op = BlockScaledGemm("grouped_gemm_srelu", arch="sm_90a")
    op._launcher = _Launcher(_contract())
    scaled_maps(op._launcher, call)
    a, b, sfa, sfb = op._launcher.tmaps.calls
    m = call.m
    assert (a["shape"], a["strides"], a["box"], a["swizzle"]) == ((320, m), (320,), (128, 128), 128)
    assert (b["shape"], b["strides"], b["box"]) == ((320, 384, 3), (320, 384 * 320), (128, 128, 1))
    kt, mt, nt = 3, m // 128, 3                     # sfk = 10 -> 3 K atoms; N 384 -> 3 atoms
    assert (sfa["dtype"], sfa["shape"], sfa["strides"], sfa["swizzle"]) == (
        "uint32", (128, kt, mt, 1), (512, kt * 512, mt * kt * 512), 0)
    assert (sfb["shape"], sfb["strides"], sfb["box"]) == ((128, kt, nt, 3), (512, kt * 512, nt * kt * 512),
                                                          (128, 1, 1, 1))
    assert sfa["address"] == kw["sfa_tensor"].data_ptr() and sfb["address"] == kw["sfb_tensor"].data_ptr()


@pytest.mark.parametrize("cd_major", ["n", "m"])
def test_batched_maps_and_launch_values(cd_major):
    """Seed 004: A and SFA carry the batch; m_rows is M of one batch; the grid covers L * ceil(M/128)
    row blocks; an M-major C has rows of M."""
    pb = make_batched_problem(m=200, n=264, k=320, batch=3, seed=0)
    kw = {k: _cpu(v) for k, v in pb.kwargs().items()}
    call = parse_batched(kw["a_tensor"], kw["b_tensor"], kw["sfa_tensor"], kw["sfb_tensor"], 32)
    assert (call.m, call.n, call.l, call.a_lstride, call.b_strides) == (200, 264, 3, 200 * 320, (320, 264 * 320))
    op = BlockScaledGemm("gemm_amax", arch="sm_90a", cd_major=cd_major, tile_n=128)
    ln = _Launcher(_contract(tile_n=128))
    captured = {}
    ln.grid = lambda s: captured.setdefault("shape", s) and 7
    ln.scalars = lambda s: {"m_rows": s.m, "n": s.n, "k": s.k, "num_experts": s.l, "cluster_m": 1, "cluster_n": 1}
    op._launcher = ln
    v = op._launch_values(call, {"c": 1000, "amax": 2000})
    a, b, sfa, sfb = ln.tmaps.calls
    assert (a["shape"], a["strides"], a["box"]) == ((320, 200, 3), (320, 200 * 320), (128, 128, 1))
    assert sfa["shape"] == (128, 3, 2, 3) and sfb["shape"] == (128, 3, 3, 3)
    assert captured["shape"].m == 3 * 256                     # L * ceil(200 / 128) * 128 rows of tiles
    assert (v["m_rows"], v["num_experts"], v["offsets"], v["c_out"], v["amax"]) == (200, 3, 0, 1000, 2000)
    assert v["ldc"] == (200 if cd_major == "m" else 264)


def test_compare_outputs_can_fail():
    import ml_dtypes
    ref = TupleDict(d=np.array([1.0, 2.0, np.nan], np.float32),
                    q=np.array([1, 2, 3], np.uint8).view(ml_dtypes.float8_e4m3fn))
    same = TupleDict(d=torch.tensor([1.0, 2.0, float("nan")]), q=torch.tensor([1, 2, 3], dtype=torch.uint8)
                     .view(torch.float8_e4m3fn))
    assert compare_outputs(ref, same, exact=True) == (0.0, None)
    off_byte = TupleDict(d=same["d"], q=torch.tensor([1, 2, 4], dtype=torch.uint8).view(torch.float8_e4m3fn))
    assert "1 bytes differ" in compare_outputs(ref, off_byte, exact=False)[1]
    no_nan = TupleDict(d=torch.tensor([1.0, 2.0, 3.0]), q=same["q"])
    assert "NaN" in compare_outputs(ref, no_nan, exact=False)[1]
    near = TupleDict(d=torch.tensor([1.0, 2.0 + 1e-6, float("nan")]), q=same["q"])
    assert compare_outputs(ref, near, exact=False, rtol=1e-5)[1] is None
    assert "outside the tolerance" in compare_outputs(ref, near, exact=True)[1]
    assert "outside the tolerance" in compare_outputs(ref, near, exact=False, rtol=1e-8)[1]
    missing = TupleDict(d=same["d"], q=None)
    assert "missing" in compare_outputs(ref, missing, exact=True)[1]
    bf = TupleDict(d=np.array([256.0], np.float32).astype(ml_dtypes.bfloat16))
    assert compare_outputs(bf, TupleDict(d=torch.tensor([258.0], dtype=torch.bfloat16)), exact=False)[1] is None
    assert compare_outputs(bf, TupleDict(d=torch.tensor([260.0], dtype=torch.bfloat16)), exact=False)[1] is not None
