"""The sm_100a block-scaled kernel's gathered scale copies (fusegemm/gather.cuh GatherSfRows), run on
the H200: no Blackwell GPU exists for the project, so the arch-neutral helper that copies a gathered
row's MX scale words runs here in a probe kernel, exactly as the sm_100a producer lanes call it
(lane l: problem rows 4 l .. 4 l + 3 of a 128-row atom, their tokens resolved once, one k-atom's
words copied by 4-byte cp.async into the stage's atom), and the atoms it fills are compared with
``pack_sf`` of the rows gathered in numpy (tokens past the source and -1: zero bytes)."""
from __future__ import annotations

import struct

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

_PROBE = r"""
#include "fusegemm/gather.cuh"

struct ProbeParams {
  const int* index;        // (m,) tokens of the problem rows
  const uint32_t* src;     // atom buffer of `rows` token rows
  uint32_t* out;           // atom buffer of the m problem rows
  int m, rows, k_atoms;
  unsigned pitch;          // k_atoms * 128 words
};

// Block b, k-atom blockIdx.y: the 128 problem rows of atom group b, one warp.
extern "C" __global__ void __launch_bounds__(32) fg_sf_gather_probe(const __grid_constant__ ProbeParams p) {
  __shared__ __align__(128) uint32_t atom[128];
  const int lane = threadIdx.x, ka = blockIdx.y;
  const int r = blockIdx.x * 128 + 4 * lane;
  int tokens[4];
  for (int j = 0; j < 4; ++j) tokens[j] = r + j < p.m ? p.index[r + j] : -1;
  fusegemm::GatherSfRows rows;
  rows.resolve(tokens, p.rows, p.pitch);
  rows.copy(fusegemm::smem_u32(atom), p.src, ka, 4 * lane);
  fusegemm::cp_async_commit();
  fusegemm::cp_async_wait_all();
  __syncwarp();
  for (int w = lane; w < 128; w += 32) p.out[(blockIdx.x * p.k_atoms + ka) * 128 + w] = atom[w];
}
"""


def test_gathered_scale_words_land_where_pack_sf_puts_the_gathered_rows():
    import torch

    from fusegemm.formats import pack_sf
    from fusegemm.reference._operands import rows_through
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.launch import LaunchConfig, ParamBuffer, launch
    from fusegemm.runtime.load import default_modules

    cub = compile_source(_PROBE, arch="sm_90a", kernel="fg_sf_gather_probe")
    kernel = default_modules().get(cub.data, "fg_sf_gather_probe", key="sf_gather_probe", smem_bytes=0, device=0)
    rng = np.random.default_rng(11)
    for t, m, sfk in ((300, 512, 20), (130, 256, 4), (1000, 384, 7)):
        logical = rng.integers(1, 256, (t, sfk), dtype=np.uint8)   # no zero byte: a missed copy shows
        index = rng.integers(0, t, m).astype(np.int32)
        index[::17] = -1
        index[5] = t          # past the source
        index[6] = t + 1000
        k_atoms = -(-sfk // 4)
        want = pack_sf(rows_through(logical, index)).reshape(-1).view(np.uint32)
        src = torch.from_numpy(pack_sf(logical).reshape(-1).view(np.int32).copy()).cuda()
        idx = torch.from_numpy(index).cuda()
        out = torch.full((want.size,), -1, dtype=torch.int32, device="cuda")
        params = ParamBuffer(40)
        params.fill(struct.pack("<QQQiiiI", idx.data_ptr(), src.data_ptr(), out.data_ptr(),
                                m, t, k_atoms, k_atoms * 128))
        launch(kernel, LaunchConfig(grid=(-(-m // 128), k_atoms, 1), block=(32, 1, 1)), params,
               torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        got = out.cpu().numpy().view(np.uint32)
        np.testing.assert_array_equal(got, want, err_msg=f"T {t}, M {m}, sfk {sfk}")
