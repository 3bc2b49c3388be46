"""Seed 001 grouped GEMM on the GPU: every feature against a float64 reference.

Tolerance per element: ``rel(dtype) * |ref| + 2**-20 * scale`` where ``rel`` is one unit in
the last place of the output dtype (bf16 2**-8, fp16 2**-11, fp32 2**-23: rounding of the
FP32 result plus one flip at a rounding boundary) and ``scale = |alpha| |A||B|^T +
|prob bias|`` bounds the FP32 accumulation-order error. Outputs are poisoned with NaN
first: rows below valid_m must all be written, rows at or past it never.

Run as a script for compute-sanitizer: ``python tests/gpu/test_grouped_gemm_gpu.py dense``.
"""
from __future__ import annotations

import os
import sys
import time

import pytest

torch = pytest.importorskip("torch") if __name__ != "__main__" else __import__("torch")

from fusegemm.presets import GroupedGemm, grouped_gemm  # noqa: E402

pytestmark = pytest.mark.gpu

DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
REL = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-23}
RAGGED = [256, 0, 768, 512, 0, 256, 1024, 0]     # empty experts, including the last


def make_problem(sizes, n, k, *, extra_rows=256, bias=None, prob=True, discrete=False,
                 canonical=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    l = len(sizes)
    valid_m = sum(sizes)
    m = valid_m + extra_rows
    a = (torch.rand((m, k), generator=g, device=dev) * 2 - 1).to(torch.bfloat16)
    b_lnk = (torch.rand((l, n, k), generator=g, device=dev) * 2 - 1).to(torch.bfloat16)
    offsets = torch.tensor([sum(sizes[: i + 1]) for i in range(l)], dtype=torch.int32, device=dev)
    alpha = torch.rand((l,), generator=g, device=dev) + 0.5
    p = torch.rand((m, 1, 1), generator=g, device=dev) if prob else None
    bias_t = None
    if bias is not None:
        bias_t = (torch.rand((l, n), generator=g, device=dev) * 2 - 1).to(DT[bias]).t()  # (N, L)
    prob_arg = p if not canonical or p is None else p.view(m)
    args = dict(a_tensor=a if canonical else a.unsqueeze(-1), padded_offsets=offsets,
                alpha_tensor=alpha, bias_tensor=bias_t, prob_tensor=prob_arg)
    if discrete:
        experts = [b_lnk[e].clone() for e in range(l)]
        args["b_ptrs"] = torch.tensor([w.data_ptr() for w in experts], dtype=torch.int64, device=dev)
        args["n"] = n
        keep = experts
    else:
        args["b_tensor"] = b_lnk if canonical else b_lnk.permute(1, 2, 0)
        keep = None
    return dict(args=args, a=a, b=b_lnk, offsets=offsets, alpha=alpha, prob=p, bias=bias_t,
                sizes=list(sizes), m=m, n=n, k=k, keep=keep)


def reference(pb):
    """float64 C, D (valid rows only) and the accumulation scale."""
    a, b = pb["a"].double(), pb["b"].double()
    valid_m = sum(pb["sizes"])
    g = torch.zeros((valid_m, pb["n"]), dtype=torch.float64, device="cuda")
    scale = torch.zeros_like(g)
    start = 0
    for e, size in enumerate(pb["sizes"]):
        if size:
            rows = slice(start, start + size)
            al = float(pb["alpha"][e])
            g[rows] = al * (a[rows] @ b[e].T)
            scale[rows] = abs(al) * (a[rows].abs() @ b[e].abs().T)
        start += size
    p = pb["prob"].double().view(-1)[:valid_m, None] if pb["prob"] is not None else 1.0
    if pb["bias"] is not None:
        bias = pb["bias"].double()                           # (N, L)
        expert = torch.repeat_interleave(torch.arange(len(pb["sizes"]), device="cuda"),
                                         torch.tensor(pb["sizes"], device="cuda"))
        pbias = p * bias.t()[expert]
        c = g + pbias
        return c, c, scale + pbias.abs()
    return g, p * g, scale


def check(out, ref, scale, dtype, valid_m, name):
    out2 = out.reshape(out.shape[0], -1)
    got = out2[:valid_m].double()
    assert torch.isfinite(got).all(), f"{name}: rows below valid_m left unwritten or non-finite"
    tol = REL[dtype] * ref.abs() + 2.0**-20 * scale + 1e-30
    err = (got - ref).abs()
    worst = float((err / tol).max()) if err.numel() else 0.0
    out_dir = os.environ.get("FUSEGEMM_TEST_OUT")
    if out_dir and err.numel():
        rel = float((err / ref.abs().clamp_min(1e-3)).max())
        with open(os.path.join(out_dir, "errors.txt"), "a") as fh:
            fh.write(f"{name}: {dtype} max_abs {float(err.max()):.3e} max_rel {rel:.3e} "
                     f"max_err/tol {worst:.3f}\n")
    assert worst <= 1.0, f"{name}: error {float(err.max()):.3e} exceeds tolerance (ratio {worst:.2f})"
    if out2.shape[0] > valid_m:
        assert torch.isnan(out2[valid_m:].float()).all(), f"{name}: rows at/past valid_m were written"
    return float(err.max()) if err.numel() else 0.0


def run_class(pb, *, c_dtype="bfloat16", d_dtype="bfloat16", generate_c=False, dynamic=False,
              tile=None, stream=None, cluster=None):
    args = pb["args"]
    shape = (pb["m"], pb["n"], 1) if args["a_tensor"].dim() == 3 else (pb["m"], pb["n"])
    d = torch.full(shape, float("nan"), dtype=DT[d_dtype], device="cuda")
    c = torch.full(shape, float("nan"), dtype=DT[c_dtype], device="cuda")
    discrete = "b_ptrs" in args
    op = GroupedGemm(args["a_tensor"], c, d, args["padded_offsets"], args["alpha_tensor"],
                     None if discrete else args["b_tensor"], args["bias_tensor"], args["prob_tensor"],
                     num_experts=len(pb["sizes"]) if discrete else None,
                     b_shape=(pb["n"], pb["k"]) if discrete else None, c_dtype=c_dtype,
                     d_dtype=d_dtype, generate_c=generate_c, use_dynamic_sched=dynamic,
                     mma_tiler_mn=tile, cluster_shape_mn=cluster)
    assert op.check_support()
    op.compile()
    op.execute(args["a_tensor"], c, d, args["padded_offsets"], args["alpha_tensor"],
               args.get("b_tensor"), args["bias_tensor"], args["prob_tensor"],
               b_ptrs=args.get("b_ptrs"), current_stream=stream)
    return op, c, d


def verify(pb, c, d, c_dtype, d_dtype, generate_c, name):
    torch.cuda.synchronize()
    rc, rd, scale = reference(pb)
    valid_m = sum(pb["sizes"])
    errs = {"d": check(d, rd, scale, d_dtype, valid_m, f"{name} D")}
    if generate_c:
        errs["c"] = check(c, rc, scale, c_dtype, valid_m, f"{name} C")
    else:
        assert torch.isnan(c.float()).all(), f"{name}: C written although generate_c=False"
    return errs


PAIRS = [(c, d) for c in DT for d in DT]

# Every kernel variant this module launches, compiled up front in parallel processes (a
# cold kernel takes seconds under NVRTC; the disk cache serves the tests afterwards).
VARIANTS = (
    [dict(c_dtype=c, d_dtype=d, generate_c=True) for c, d in PAIRS]
    + [dict(bias_dtype="bfloat16", generate_c=True, c_dtype="float32"),
       dict(bias_dtype="float16"), dict(bias_dtype="float32", generate_c=True, d_dtype="float16"),
       dict(), dict(scheduler="dynamic"), dict(weight_mode="discrete"),
       dict(weight_mode="discrete", scheduler="dynamic", bias_dtype="bfloat16"),
       dict(tile_n=128), dict(bias_dtype="bfloat16", generate_c=True),
       dict(bias_dtype="bfloat16", generate_c=True, scheduler="dynamic"),
       dict(bias_dtype="bfloat16", generate_c=True, weight_mode="discrete", scheduler="dynamic"),
       dict(bias_dtype="float32", generate_c=True, c_dtype="float32", d_dtype="float16")]
)


@pytest.fixture(scope="module", autouse=True)
def _prebuild():
    from fusegemm.build import build
    from fusegemm.generator.variants import make_variant
    from fusegemm.ops.device import device_arch
    arch = device_arch(0)
    base = dict(c_dtype="bfloat16", d_dtype="bfloat16")   # tiles and cluster: the arch's defaults
    vs = [make_variant("grouped_gemm", arch=arch, **{**base, **kw}) for kw in VARIANTS]
    failed = [r for r in build(vs, jobs=os.cpu_count() or 1) if not r.ok]
    assert not failed, "\n".join(f"{r.name}: {r.error}" for r in failed)


@pytest.mark.parametrize("c_dtype,d_dtype", PAIRS)
def test_output_dtype_pairs(c_dtype, d_dtype):
    pb = make_problem(RAGGED, 384, 200, seed=1)           # N tail tile, K not a multiple of 64
    _, c, d = run_class(pb, c_dtype=c_dtype, d_dtype=d_dtype, generate_c=True)
    verify(pb, c, d, c_dtype, d_dtype, True, f"c={c_dtype} d={d_dtype}")


@pytest.mark.parametrize("bias,generate_c,c_dtype,d_dtype", [
    ("bfloat16", True, "float32", "bfloat16"),
    ("float16", False, "bfloat16", "bfloat16"),
    ("float32", True, "bfloat16", "float16"),
])
def test_bias(bias, generate_c, c_dtype, d_dtype):
    pb = make_problem(RAGGED, 256, 512, bias=bias, seed=2)
    _, c, d = run_class(pb, c_dtype=c_dtype, d_dtype=d_dtype, generate_c=generate_c)
    verify(pb, c, d, c_dtype, d_dtype, generate_c, f"bias={bias}")


@pytest.mark.parametrize("discrete,dynamic,bias", [
    (False, True, None), (True, False, None), (True, True, "bfloat16"), (False, False, None),
])
def test_weights_and_scheduling(discrete, dynamic, bias):
    # More tiles than SMs: each CTA runs several tiles and the tile ring wraps.
    pb = make_problem([1024, 0, 2048, 256, 768, 0, 4096, 512], 1024, 320, bias=bias,
                      discrete=discrete, seed=3)
    _, c, d = run_class(pb, dynamic=dynamic)
    verify(pb, c, d, "bfloat16", "bfloat16", False, f"discrete={discrete} dynamic={dynamic}")


# sm_90a clusters (TMA multicast: B along cluster M, A along N; fusegemm/cluster.cuh): every shape
# up to 2x2, with tiles of 64 and 128 rows (cluster blocks of 128 and 256 rows: inside one expert),
# dense and discrete weights, on ragged and empty experts, with N ending inside a cluster block's
# second tile (a phantom tile that loads zeros and stores nothing) and a K tail. N-major weights
# in clusters: tests/gpu/test_epilogue_gpu.py (the seed API takes K-major B).
CLUSTER_CASES = [  # (cluster, tile, discrete, bias, generate_c)
    ((2, 1), (128, 256), False, None, False),
    ((1, 2), (128, 256), False, "bfloat16", True),
    ((2, 2), (128, 128), False, None, False),
    ((2, 1), (64, 256), False, None, True),
    ((2, 2), (64, 128), True, "float32", False),
    ((2, 1), (128, 256), True, None, False),
]


@pytest.mark.parametrize("cluster,tile,discrete,bias,generate_c", CLUSTER_CASES)
def test_clusters_multicast(cluster, tile, discrete, bias, generate_c):
    from fusegemm.ops.device import device_arch
    if device_arch(0) != "sm_90a":
        pytest.skip("sm_90a cluster shapes (sm_100a clusters are statically checked)")
    n = 3 * tile[1] - 72 if cluster[1] == 2 else 2 * tile[1] + 40   # odd N-tile count / an N tail
    pb = make_problem(RAGGED, n, 1000, bias=bias, discrete=discrete, seed=7)
    c_dtype = "float32" if generate_c else "bfloat16"
    op, c, d = run_class(pb, generate_c=generate_c, tile=tile, cluster=cluster, c_dtype=c_dtype)
    ln = op._launcher
    assert ln.cluster == cluster
    # One wave of whole clusters (the H200 runs 30 clusters of 2x2 at once: 120 of 132 SMs).
    assert ln.sms % (cluster[0] * cluster[1]) == 0 and ln.grid(type("S", (), {"m": pb["m"], "n": n})()) <= ln.sms
    verify(pb, c, d, c_dtype, "bfloat16", generate_c, f"cluster {cluster} tile {tile} discrete={discrete}")


# Ping-pong (TILE_M 64 on sm_90a: two consumer warpgroups on 64-row tiles in turn, mainloops
# ordered by named barriers) at short K (1 to 3 k-blocks per tile) on ragged experts, with both
# schedulers and discrete weights. The order itself is tested by the K-grouped case
# (tests/gpu/test_wgrad_gpu.py), which failed on the H200 with the order removed; these did not.
@pytest.mark.parametrize("k,tile,dynamic,discrete", [
    (64, (64, 128), False, False), (136, (64, 256), True, False), (192, (64, 128), False, True)])
def test_pingpong_short_k_many_tiles(k, tile, dynamic, discrete):
    sizes = [2048, 0, 4096, 256, 1792, 0, 3840, 512]
    pb = make_problem(sizes, 1000, k, discrete=discrete, seed=11)
    op, c, d = run_class(pb, tile=tile, dynamic=dynamic)
    from fusegemm.ops.device import device_arch
    if device_arch(0) == "sm_90a":
        assert op._launcher.contract.threads == 384, "TILE_M 64: two ping-pong consumer warpgroups"
    verify(pb, c, d, "bfloat16", "bfloat16", False, f"ping-pong k={k} tile {tile} dynamic={dynamic}")


# Ping-pong at TILE_M 128 (FUSEGEMM_SM90_PINGPONG_128=1, an A/B switch; fusegemm/sm90/grouped_gemm.cuh):
# each warpgroup a whole 128 x 128 tile, two m64 WGMMAs per k-step into two accumulator halves,
# the epilogue run per half. Short and long K, an N tail, empty experts, both schedulers,
# discrete weights, bias and C, a 2x1 cluster.
@pytest.mark.parametrize("k,dynamic,discrete,generate_c,cluster", [
    (64, False, False, False, None), (1000, False, False, True, None), (200, True, False, False, None),
    (520, False, True, True, None), (1000, False, False, False, (2, 1))])
def test_pingpong_128_rows_per_warpgroup(k, dynamic, discrete, generate_c, cluster):
    from fusegemm.runtime import config
    sizes = [2048, 0, 4096, 256, 1792, 0, 3840, 512]
    pb = make_problem(sizes, 1000, k, bias="float32" if generate_c else None, discrete=discrete, seed=19)
    with config.override(FUSEGEMM_NVRTC_EXTRA="-DFUSEGEMM_SM90_PINGPONG_128=1"):
        op, c, d = run_class(pb, tile=(128, 128), dynamic=dynamic, generate_c=generate_c, cluster=cluster)
    from fusegemm.ops.device import device_arch
    if device_arch(0) == "sm_90a":
        assert op._launcher.contract.threads == 384
    verify(pb, c, d, "bfloat16", "bfloat16", generate_c,
           f"ping-pong 128 k={k} dynamic={dynamic} discrete={discrete} cluster={cluster}")


# Deferred D stores (the default cooperative 128 x 256 tile on sm_90a): a tile's D is stored
# during the next tile's first k-blocks and the last one's at the kernel's end. Several tiles per
# CTA (460 tiles), K of 1, 4 and 9 k-blocks (fewer k-blocks than the 4 column chunks included),
# an N tail, empty experts, both schedulers and discrete weights.
@pytest.mark.parametrize("k,dynamic,discrete", [(64, False, False), (200, True, False), (520, False, True),
                                                (520, True, True)])
def test_deferred_stores_many_tiles_per_cta(k, dynamic, discrete):
    sizes = [2048, 0, 4096, 256, 1792, 0, 3840, 512]
    pb = make_problem(sizes, 1000, k, discrete=discrete, seed=15)
    _, c, d = run_class(pb, tile=(128, 256), dynamic=dynamic)
    verify(pb, c, d, "bfloat16", "bfloat16", False, f"deferred k={k} dynamic={dynamic} discrete={discrete}")


def test_single_expert_no_prob():
    pb = make_problem([512], 256, 128, prob=False, seed=4)
    _, c, d = run_class(pb)
    verify(pb, c, d, "bfloat16", "bfloat16", False, "L=1")


@pytest.mark.parametrize("discrete", [False, True])
def test_many_experts(discrete):
    sizes = [0] * 300
    for e, s in ((0, 256), (17, 512), (150, 256), (255, 768), (299, 256)):
        sizes[e] = s
    pb = make_problem(sizes, 256, 64, discrete=discrete, seed=5)
    _, c, d = run_class(pb)
    verify(pb, c, d, "bfloat16", "bfloat16", False, f"L=300 discrete={discrete}")


def test_all_experts_empty_writes_nothing():
    pb = make_problem([0, 0, 0], 128, 64, extra_rows=512, seed=6)
    _, c, d = run_class(pb)
    torch.cuda.synchronize()
    assert torch.isnan(d.float()).all()


def test_tile_n_128_and_canonical_layouts():
    pb = make_problem(RAGGED, 520, 136, canonical=True, seed=7)
    _, c, d = run_class(pb, tile=(128, 128))
    assert d.dim() == 2
    verify(pb, c, d, "bfloat16", "bfloat16", False, "tile 128x128, 2-D A")


def test_wrapper_matches_class_and_caches():
    pb = make_problem(RAGGED, 384, 200, bias="bfloat16", seed=8)
    res = grouped_gemm(**pb["args"], generate_c=True, c_dtype=torch.float32)
    d, c = res
    assert res["d_tensor"] is d and res["c_tensor"] is c
    torch.cuda.synchronize()
    rc, rd, scale = reference(pb)
    valid_m = sum(pb["sizes"])
    check(c[:valid_m], rc, scale, "float32", valid_m, "wrapper C")
    check(d[:valid_m], rd, scale, "bfloat16", valid_m, "wrapper D")
    from fusegemm.ops.scaled_seeds import _OPS
    before = len(_OPS._ops)
    grouped_gemm(**pb["args"], generate_c=True, c_dtype=torch.float32)
    assert len(_OPS._ops) == before, "a second identical call must reuse the compiled op"


def test_wrapper_with_discrete_weights_of_another_n():
    """Discrete weights carry no shape: the wrapper's op holds N, so a call with another N gets an op
    of its own (found by the GPU fuzzing: the second N was refused with the first one's shape)."""
    for n in (64, 136, 64):
        pb = make_problem([256, 0, 512], n, 72, discrete=True, seed=n)
        d = grouped_gemm(**pb["args"])["d_tensor"]
        torch.cuda.synchronize()
        rc, rd, scale = reference(pb)
        valid_m = sum(pb["sizes"])
        check(d[:valid_m], rd, scale, "bfloat16", valid_m, f"wrapper, discrete N {n}")


def test_fast_paths_recheck_alignment_and_follow_new_data():
    """A repeat call with the signature of an earlier one takes the host fast path (wrapper and
    class): it must still refuse a misaligned base and compute with the new addresses' data."""
    from fusegemm.base.errors import ArgumentError
    pb = make_problem([256, 512, 0], 128, 64, prob=False, canonical=True, seed=12)
    args = dict(pb["args"])
    m, k = pb["m"], pb["k"]
    big = torch.zeros(m * k + 8, dtype=torch.bfloat16, device="cuda")
    aligned_a, shifted_a = big[:m * k].view(m, k), big[1:m * k + 1].view(m, k)   # same signature
    aligned_a.copy_(pb["a"])
    d_first = grouped_gemm(**{**args, "a_tensor": aligned_a})[0].clone()
    for _ in range(2):   # the second wrapper call is a fast-path hit
        with pytest.raises(ArgumentError, match="a_tensor"):
            grouped_gemm(**{**args, "a_tensor": shifted_a})
    op = GroupedGemm(aligned_a, None, torch.empty_like(d_first), args["padded_offsets"], args["alpha_tensor"],
                     args["b_tensor"]).compile()
    d = torch.empty_like(d_first)
    op.execute(aligned_a, d_tensor=d, padded_offsets=args["padded_offsets"], alpha_tensor=args["alpha_tensor"],
               b_tensor=args["b_tensor"])
    with pytest.raises(ArgumentError, match="a_tensor"):
        op.execute(shifted_a, d_tensor=d, padded_offsets=args["padded_offsets"],
                   alpha_tensor=args["alpha_tensor"], b_tensor=args["b_tensor"])
    # New data at a new address, same signature: results follow the data.
    pb2 = make_problem([256, 512, 0], 128, 64, prob=False, canonical=True, seed=13)
    d2 = grouped_gemm(**{**args, "a_tensor": pb2["a"]})[0]
    torch.cuda.synchronize()
    rc, rd, scale = reference({**pb, "a": pb2["a"]})
    valid_m = sum(pb["sizes"])
    check(d2[:valid_m], rd, scale, "bfloat16", valid_m, "fast-path wrapper D")
    check(d[:valid_m], reference(pb)[1], scale, "bfloat16", valid_m, "fast-path class D")


def test_offsets_past_the_rows_never_write_outside_the_outputs():
    """padded_offsets live on the device, unchecked by default: a last offset past A's rows must
    give no store outside C/D (the kernel clamps the tile space to the allocation); with
    FUSEGEMM_VALIDATE_OFFSETS the host refuses them first."""
    from fusegemm.base.errors import ArgumentError
    pb = make_problem([256, 256], 128, 64, prob=False, canonical=True, extra_rows=0, seed=14)
    args = dict(pb["args"])
    m = pb["m"]
    bad = torch.tensor([256, 4096], dtype=torch.int32, device="cuda")     # 4096 > m = 512
    guard = torch.full((m + 512, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    d = guard[:m]
    op = GroupedGemm(pb["a"], None, d, bad, args["alpha_tensor"], args["b_tensor"]).compile()
    op.execute(pb["a"], d_tensor=d, padded_offsets=bad, alpha_tensor=args["alpha_tensor"], b_tensor=args["b_tensor"])
    torch.cuda.synchronize()
    assert torch.isnan(guard[m:].float()).all(), "a store landed past D's rows"
    rc, rd, scale = reference(pb)                                          # rows < m: experts as given
    check(d, rd, scale, "bfloat16", m, "clamped D")
    with pytest.raises(ArgumentError, match=r"padded_offsets\[-1\]: got 4096; allowed: <= 512"):
        op.execute(pb["a"], d_tensor=d, padded_offsets=bad, alpha_tensor=args["alpha_tensor"],
                   b_tensor=args["b_tensor"], validate_offsets=True)


def test_matches_project_reference():
    ref_mod = pytest.importorskip("fusegemm.reference")
    pb = make_problem(RAGGED, 256, 192, bias="float32", seed=9)
    res = grouped_gemm(**pb["args"], generate_c=True, c_dtype=torch.float32, d_dtype=torch.float16)
    ref = ref_mod.grouped_gemm(**{k: v for k, v in pb["args"].items()}, generate_c=True,
                               c_dtype="float32", d_dtype="float16", acc_dtype="float64")
    valid_m = sum(pb["sizes"])
    import numpy as np
    for name, dt in (("d_tensor", "float16"), ("c_tensor", "float32")):
        got = res[name].float().cpu().numpy()[:valid_m].astype(np.float64)
        want = np.asarray(ref[name], dtype=np.float64)[:valid_m]
        ulp = 2 * REL[dt] * np.abs(want) + 1e-4   # both rounded: one unit in the last place
        assert np.all(np.abs(got - want) <= ulp), f"{name} differs from fusegemm.reference"


@pytest.mark.parametrize("discrete,dynamic", [(False, False), (False, True), (True, True)])
def test_cuda_graph_replay_after_in_place_changes(discrete, dynamic):
    pb = make_problem(RAGGED, 384, 200, bias="bfloat16", discrete=discrete, seed=10)
    args = pb["args"]
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        op, c, d = run_class(pb, dynamic=dynamic, generate_c=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        op.execute(args["a_tensor"], c, d, args["padded_offsets"], args["alpha_tensor"],
                   args.get("b_tensor"), args["bias_tensor"], args["prob_tensor"],
                   b_ptrs=args.get("b_ptrs"), validate_offsets=True)
    # New values in the same buffers: A, B (or the pointed-to experts), offsets, alpha.
    new = make_problem([512, 256, 0, 1024, 256, 0, 256, 512], 384, 200, bias="bfloat16",
                       discrete=discrete, seed=11)
    pb["a"].copy_(new["a"])
    pb["b"].copy_(new["b"])
    if discrete:
        for e, w in enumerate(pb["keep"]):
            w.copy_(new["b"][e])
    pb["offsets"].copy_(new["offsets"])
    pb["alpha"].copy_(new["alpha"])
    pb["prob"].copy_(new["prob"])
    pb["bias"].copy_(new["bias"])
    pb["sizes"] = new["sizes"]
    c.fill_(float("nan"))
    d.fill_(float("nan"))
    graph.replay()
    graph.replay()   # twice: the counter reset and the workspace are part of the graph
    verify(pb, c, d, "bfloat16", "bfloat16", True, f"graph discrete={discrete} dyn={dynamic}")


def _host_us(call, reps=200, rounds=5):
    for _ in range(50):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            call()
        times.append((time.perf_counter() - t0) / reps * 1e6)
        torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def test_host_time_per_execute(record_property, monkeypatch):
    pb = make_problem([256, 256], 256, 64, seed=12)
    args = pb["args"]
    op, c, d = run_class(pb)
    call = lambda: op.execute(args["a_tensor"], c, d, args["padded_offsets"], args["alpha_tensor"],
                              args["b_tensor"], None, args["prob_tensor"])
    us = _host_us(call)
    # Breakdown: the same calls with the entry's prepared driver launch replaced by a no-op.
    # The engine's memo entries that launch through a prepared driver call: this pattern's among
    # them (the op is shared across tests; an empty problem's entry launches nothing, go None).
    entries = [e for e in op.op._memo.values() if e.go is not None]
    assert entries
    for e in entries:
        monkeypatch.setattr(e, "go", lambda *a: None)
    python_us = _host_us(call)
    monkeypatch.undo()
    record_property("host_us_per_execute", us)
    text = f"execute {us:.2f} us (python part {python_us:.2f} us, driver launch {us - python_us:.2f} us)"
    print("\n" + text)
    out = os.environ.get("FUSEGEMM_TEST_OUT")
    if out:
        with open(os.path.join(out, "host_time.txt"), "w") as fh:
            fh.write(text + "\n")
    assert us < 100.0, f"execute() costs {us:.1f} us of host time"


def _sanitize_main(mode: str) -> None:
    """Small problem for compute-sanitizer (one launch per mode)."""
    pb = make_problem([256, 0, 512], 256, 136, bias="bfloat16", discrete=mode == "discrete",
                      seed=13)
    _, c, d = run_class(pb, generate_c=True, dynamic=True)
    verify(pb, c, d, "bfloat16", "bfloat16", True, f"sanitize {mode}")
    print(f"sanitize {mode}: ok")


if __name__ == "__main__":
    _sanitize_main(sys.argv[1] if len(sys.argv) > 1 else "dense")
