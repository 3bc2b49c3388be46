"""Ping-pong tiles of the sm_90a blockwise kernel (tile_m 64, fusegemm/sm90/blockwise_promote.cuh):
each consumer warpgroup runs whole 64 x 128 tiles of its own, the two in turn, with two temporary
accumulator sets. Integer problems with power-of-two scales against the numpy interpreter (bit for
bit but dprob); realistic values against the cooperative tiles (128 x 256 and 128 x 128, each also
with the two-set mainloop, FUSEGEMM_SM90_BW_TWO_TEMPS=1), which promote each element's k-blocks in
the same order: every output byte for byte (dprob and dbias: FP32 atomics across tiles, in any
order, within 2^-16 of their largest); and the first-run gate's cases of the class. Not yet run
on a GPU (written in a session without one): the registry gates tile_m 64
(registry.UNEXECUTED_MODES) until these pass."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import scaled_problems  # noqa: E402  (tests/gpu/scaled_problems.py)
import test_blockwise_gpu as blockwise  # noqa: E402  (its _run and _check against the interpreter)
from op_helpers import same_outputs  # noqa: E402  (tests/gpu/op_helpers.py)

PINGPONG = {"tile_m": 64, "tile_n": 128}


@pytest.fixture(autouse=True)
def _trusted(monkeypatch):
    """These tests are the check the first-run gate stands in for (one test runs the gate)."""
    monkeypatch.setenv("FUSEGEMM_TRUST_UNVERIFIED", "1")


@pytest.mark.parametrize("sizes,n,k", [
    ([1024, 0, 2048, 768, 256], 1024, 640),   # 512 tiles: several per CTA and warpgroup; 5 k-blocks (odd)
    ([2048, 256, 0, 1792], 1024, 208),        # 2 k-blocks (even), a K tail (K a multiple of 16: TMA rows)
    ([3840, 256], 1024, 96),                  # one k-block
    ([256, 512], 320, 384),                   # an N tail (N a multiple of 64: gate/up blocks)
], ids=["odd_k_blocks", "even_k_blocks", "one_k_block", "n_tail"])
def test_pingpong_exact_against_the_interpreter(sizes, n, k):
    """Integer problems with power-of-two scales: D, D_col and both SFDs bit for bit; dprob (sums of
    sigmoid terms, atomics across tiles) within 1e-5 of its largest magnitude."""
    _, out, ref, _, _ = blockwise._run("grouped_gemm_dswiglu", sizes, n, k, exact=True, seed=len(sizes) + n + k,
                                       **PINGPONG)
    blockwise._check(out, ref, exact=False, valid=sum(sizes))


@pytest.mark.parametrize("sizes,n,k,axes,discrete", [
    ([1024, 0, 768, 256], 512, 640, {}, True),                                  # per-expert B and SFB pointers
    ([512, 256], 384, 400, {"d_dtype": "float8_e4m3fn"}, True),                 # and FP8 D (both SFDs), K tail
    ([256, 512], 256, 256, {"d_dtype": "float8_e4m3fn", "discrete_col_sfd": True}, False),
], ids=["discrete", "discrete_fp8", "discrete_col_sfd"])
def test_pingpong_srelu_exact_against_the_interpreter(sizes, n, k, axes, discrete):
    """sReLU's ping-pong tiles where the byte comparison with the cooperative tiles does not reach:
    discrete weights (each expert's B and its scales through pointer tables) and SFD_col in the
    discrete (per-expert tile) order; every output bit for bit."""
    _, out, ref, _, _ = blockwise._run("grouped_gemm_srelu", sizes, n, k, exact=True, seed=len(sizes) + n + k,
                                       discrete=discrete, **PINGPONG, **axes)
    blockwise._check(out, ref, exact=True, valid=sum(sizes))


def test_the_first_run_gate_passes_the_pingpong_class(monkeypatch):
    """Without trust, the first launch of the ping-pong class runs its cases (ragged and empty
    experts with tails, every CTA busy, several tiles per warpgroup) in the watchdog child: they
    pass."""
    from fusegemm import verify
    from fusegemm.generator.config_class import config_class
    from fusegemm.generator.spec import find_spec
    from fusegemm.generator.variants import make_variant
    monkeypatch.delenv("FUSEGEMM_TRUST_UNVERIFIED", raising=False)
    cls = config_class(make_variant(find_spec("grouped_gemm_dswiglu"), arch="sm_90a", sf_dtype="float32",
                                    sf_vec_size=128, cluster_m=1, **PINGPONG))
    rows, problem = verify.check_class(cls, 0)
    assert problem is None and rows and all(r.status == "pass" for r in rows), [(r.case, r.status, r.detail)
                                                                                for r in rows]

TILES = {"coop_256": {"tile_m": 128, "tile_n": 256}, "coop_128": {"tile_m": 128, "tile_n": 128},
         "pingpong": PINGPONG, "coop_256_two_sets": {"tile_m": 128, "tile_n": 256},
         "coop_128_two_sets": {"tile_m": 128, "tile_n": 128}}
# The cooperative tiles' two-set mainloop (FUSEGEMM_SM90_BW_TWO_TEMPS, off by default): the same order
TWO_SETS = "-DFUSEGEMM_SM90_BW_TWO_TEMPS=1"
BUILDS = {name: TWO_SETS if name.endswith("_two_sets") else "" for name in TILES}


@pytest.mark.parametrize("sizes,n,k", [
    ([2048, 0, 4096, 1792, 256], 2048, 1536),   # ragged and empty experts, 12 k-blocks, many tiles per CTA
    ([256] * 48, 1024, 1008),                   # 48 experts, K tail (8 k-blocks, the last partial)
    ([256], 384, 256),                          # L = 1, 12 tiles: fewer than the CTAs, N 384
], ids=["ragged", "many_experts", "one_expert"])
@pytest.mark.parametrize("spec,axes", [
    ("grouped_gemm_dswiglu", {}),
    ("grouped_gemm_dswiglu", {"d_dtype": "float8_e5m2", "prob_dtype": "bfloat16"}),
    ("grouped_gemm_dglu_mx", {"d_dtype": "bfloat16", "generate_dbias": True}),   # the fp8_block layer's dSwiGLU
    ("grouped_gemm_dglu_mx", {"d_dtype": "float8_e4m3fn"}),
    ("grouped_gemm_srelu", {}),                                  # C and D bf16, per-expert amax
    ("grouped_gemm_srelu", {"d_dtype": "float8_e4m3fn"}),        # FP8 D, SFD by rows and columns
], ids=["e4m3", "e5m2", "dglu_bf16_dbias", "dglu_fp8", "srelu_bf16", "srelu_fp8"])
def test_pingpong_gives_the_cooperative_bytes(spec, axes, sizes, n, k):
    outs = scaled_problems.outputs_per_build(spec, "blockwise", axes, BUILDS, sizes, n, k,
                                             seed=sum(sizes) + n + k, input_seed=7, build_axes=TILES)
    base = outs["coop_256"]
    for name in (name for name in TILES if name != "coop_256"):
        # dprob and dbias: sums by atomics (per row, per warp and column), in any order
        same_outputs(outs[name], base, f"{spec} {axes} {name} against 128 x 256 tiles",
                     dprob_atol=scaled_problems.dprob_atol(base),
                     dbias_atol=scaled_problems.dprob_atol(base, "dbias"))
