"""Expert-major bands (FUSEGEMM_RASTER_EXPERT, fusegemm/scheduler.cuh) on the CPU: the band
raster as NVRTC evaluates it (grouped_block_coord, constexpr tables in a cubin) against an independent
model, the walk it gives an MoE problem (every tile once, bands inside one expert), and the
kernels built with the switch on both archs (no local memory). tests/gpu/test_row_ends_gpu.py
and bench/pingpong.py --also run it on the GPU."""
from __future__ import annotations

import random

import pytest

from fusegemm.generator.render import render
from fusegemm.generator.spec import find_spec
from fusegemm.generator.variants import make_variant
from fusegemm.runtime.compile import compile_source
from fusegemm.runtime.cubin_info import Cubin

GRIDS = [(1, 2, 16), (20, 3, 16), (16, 5, 16), (17, 56, 16), (9, 28, 8), (3, 7, 4), (40, 1, 16), (33, 2, 16)]


def model(m_blocks: int, n_blocks: int, band: int) -> list[tuple[int, int]]:
    """The tiles of an m_blocks x n_blocks grid in raster order, written from the definition: bands
    of `band` M blocks top to bottom (the last one what is left), inside a band N blocks left to
    right and, for each, the band's M blocks top to bottom."""
    out = []
    for first in range(0, m_blocks, band):
        rows = range(first, min(first + band, m_blocks))
        out += [(m, n) for n in range(n_blocks) for m in rows]
    return out


def _tables() -> Cubin:
    src = '#include "fusegemm/scheduler.cuh"\nnamespace fg_test {\ntemplate <int N> struct Ints { int v[N]; };\n'
    src += ("template <int N> constexpr Ints<N> coords(int m, int n, int band) {\n  Ints<N> out{};\n"
            "  for (int i = 0; i < m * n; ++i) {\n"
            "    const fusegemm::BlockCoord c = fusegemm::grouped_block_coord(i, m, n, band);\n"
            "    out.v[2 * i] = c.bm;\n    out.v[2 * i + 1] = c.bn;\n  }\n  return out;\n}\n}  // namespace fg_test\n")
    for i, (m, n, band) in enumerate(GRIDS):
        src += (f'extern "C" __device__ __attribute__((used)) const fg_test::Ints<{2 * m * n}> fg_band{i} = '
                f"fg_test::coords<{2 * m * n}>({m}, {n}, {band});\n")
    src += 'extern "C" __global__ void fg_probe() {}\n'
    return Cubin(compile_source(src, arch="sm_90a", kernel="fg_probe").data)


def test_grouped_block_coord_is_the_model():
    """fusegemm::grouped_block_coord, as NVRTC evaluates it, walks each grid in the model's order: a
    bijection onto the grid, M fastest inside a band, the last band shorter."""
    cub = _tables()
    for i, (m, n, band) in enumerate(GRIDS):
        flat = cub.global_ints(f"fg_band{i}", 2 * m * n)
        got = [(flat[2 * j], flat[2 * j + 1]) for j in range(m * n)]
        assert got == model(m, n, band), (m, n, band)


def expert_major_walk(blocks: list[int], n_blocks: int, band: int) -> list[tuple[int, int, int]]:
    """(expert, global M block, N block) of every linear tile of the expert-major walk, as the
    kernels compose it: linear // n_blocks is an M block of the tile's expert (every expert owns
    n_blocks tiles per block), then the expert's own grid banded (the model above)."""
    starts = [sum(blocks[:e]) for e in range(len(blocks))]
    out = []
    for linear in range(sum(blocks) * n_blocks):
        gb = linear // n_blocks
        e = next(x for x in range(len(blocks)) if starts[x] <= gb < starts[x] + blocks[x])
        m, n = model(blocks[e], n_blocks, band)[linear - starts[e] * n_blocks]
        out.append((e, starts[e] + m, n))
    return out


def test_the_expert_major_walk_covers_every_tile_once_and_keeps_bands_in_an_expert():
    """The composition the kernels make (the model's: each expert's own grid banded by grouped_block_coord,
    checked above against the compiled function) covers every tile once and never lets a band
    cross an expert. The kernels' expert lookup itself reads offsets on the device: the GPU runs
    check it (tests/gpu/test_row_ends_gpu.py under the switch, bench/pingpong.py's byte
    comparison)."""
    rng = random.Random(5)
    for _ in range(60):
        blocks = [rng.choice([0, 0, 1, 2, 7, 8, 9, 16, 17, 33]) for _ in range(rng.randint(1, 9))]
        n_blocks, band = rng.randint(1, 30), rng.choice([4, 8, 16])
        walk = expert_major_walk(blocks, n_blocks, band)
        total = sum(blocks)
        assert sorted((m, n) for _, m, n in walk) == [(m, n) for m in range(total) for n in range(n_blocks)]
        starts = [sum(blocks[:e]) for e in range(len(blocks))]
        for e, m, _ in walk:
            assert starts[e] <= m < starts[e] + blocks[e]
        # a band's tiles (consecutive runs of band * n_blocks tiles of one expert) stay in it
        for e in range(len(blocks)):
            mine = [w for w in walk if w[0] == e]
            assert mine == [w for w in walk[starts[e] * n_blocks:(starts[e] + blocks[e]) * n_blocks]]


@pytest.mark.parametrize("spec,axes,arch", [
    ("grouped_gemm", {}, "sm_90a"),
    ("grouped_gemm", {"tile_m": 64}, "sm_90a"),
    ("grouped_gemm_swiglu", {}, "sm_90a"),
    ("grouped_gemm_dswiglu_bf16", {"tile_m": 64, "b_major": "n"}, "sm_90a"),
    ("grouped_gemm_dswiglu", {"sf_dtype": "float32", "sf_vec_size": 128, "tile_m": 128, "cluster_m": 1}, "sm_90a"),
], ids=lambda x: x if isinstance(x, str) else ".".join(map(str, x.values())) or "default")
def test_expert_major_builds_without_local_memory(spec, axes, arch):
    """The switch changes the producer's walk only: the kernel compiles on both archs with no
    local memory, and its cubin differs from the default build's."""
    src = render(make_variant(find_spec(spec), arch=arch, **axes))
    on = compile_source(src.text, arch=arch, kernel=src.symbol, extra=("-DFUSEGEMM_RASTER_EXPERT=1",))
    off = compile_source(src.text, arch=arch, kernel=src.symbol)
    assert Cubin(on.data).resources(src.symbol).local_bytes == 0
    assert on.data != off.data


def test_cluster_walks_keep_their_bands():
    """The cluster kernels' block walk (GroupedClusterScheduler: sm_100a's default 2-CTA tiles,
    sm_90a's cluster variants) is not expert-major: the switch leaves their cubin as it was."""
    src = render(make_variant(find_spec("grouped_gemm"), arch="sm_100a"))
    on = compile_source(src.text, arch="sm_100a", kernel=src.symbol, extra=("-DFUSEGEMM_RASTER_EXPERT=1",))
    assert on.data == compile_source(src.text, arch="sm_100a", kernel=src.symbol).data
