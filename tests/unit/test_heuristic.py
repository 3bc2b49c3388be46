"""fusegemm.heuristic (the sm_100a roofline model): what it chooses and why, that every choice it
can make is a configuration the sm_100a kernel implements and compiles without spills, and that
the wrapper uses it on sm_100a only when no tuning record exists."""
from __future__ import annotations

from types import SimpleNamespace

from fusegemm import heuristic as h
from fusegemm import tuning_records

SHAPES = {   # the benchmark's MoE shapes (rows per expert, N, K) and the sweep's corners
    "dsv3-fc1": ([2048] * 8, 4096, 7168), "dsv3-fc2": ([2048] * 8, 7168, 2048),
    "mixtral-fc1": ([4096] * 8, 28672, 4096), "qwen3-fc1": ([512] * 32, 1536, 2048),
    **{f"L{e}-t{t}": ([t] * e, 4096, 7168) for e in (8, 32, 256) for t in (256, 512, 2048, 8192)},
}


def test_large_problems_keep_the_default_and_small_ones_fill_the_machine():
    for name in ("dsv3-fc1", "mixtral-fc1", "L32-t2048", "L256-t8192"):
        assert h.choose(*SHAPES[name]) == h.DEFAULT, name
    # 8 experts x 512 rows, N 4096: 256x256 2-CTA tiles give 16 x 16 = 256 tiles on 74 units (3.5
    # waves, the last half idle); 1-CTA tiles on 148 units quantise better.
    c = h.choose(*SHAPES["L8-t512"])
    assert c.tile[0] <= 128 and h.estimate_us(c, *SHAPES["L8-t512"]) < 0.95 * h.estimate_us(h.DEFAULT, *SHAPES["L8-t512"])


def test_the_model_is_a_roofline():
    rows, n, k = SHAPES["dsv3-fc1"]
    t = h.estimate_us(h.DEFAULT, rows, n, k)
    flops = 2.0 * sum(rows) * n * k
    assert flops / (t - h.B200.fixed_us) / 1e6 <= h.B200.bf16_tflops      # never above the peak
    assert h.estimate_us(h.DEFAULT, rows, n, 2 * k) > 1.9 * (t - h.B200.fixed_us)   # linear in K
    assert h.estimate_us(h.DEFAULT, [0, 0], n, k) == h.B200.fixed_us      # no rows: launch only
    big = h.estimate_us(h.Config((128, 128), (1, 1)), rows, n, k)
    assert big > h.estimate_us(h.Config((128, 128), (2, 2)), rows, n, k)  # multicast saves L2 traffic


def test_every_choice_is_implemented_and_compiles_clean(tmp_path, monkeypatch):
    from fusegemm.build import build
    from fusegemm.generator import registry
    from fusegemm.generator.spec import find_spec
    from fusegemm.generator.variants import make_variant
    from fusegemm.runtime.cache import KernelCache
    spec = find_spec("grouped_gemm")
    chosen = {h.choose(*s) for s in SHAPES.values()}
    assert len(chosen) >= 2
    vs = []
    for c in chosen:
        v = make_variant(spec, arch="sm_100a", tile_m=c.tile[0], tile_n=c.tile[1], cluster_m=c.cluster[0],
                         cluster_n=c.cluster[1])
        registry.resolve(v.kernel, v.arch, v.choices)
        vs.append(v)
    rows = build(vs, cache=KernelCache(tmp_path))
    assert rows and all(r.ok and r.spill_bytes == 0 for r in rows), rows


def test_the_wrapper_uses_the_model_on_sm100a_only(tmp_path, monkeypatch):
    from fusegemm.ops import tuned as gg
    monkeypatch.setenv("FUSEGEMM_CACHE_DIR", str(tmp_path))
    tuning_records.forget()
    small = SimpleNamespace(l=8, m=8 * 512, n=4096, k=7168, bias=None, b_ptrs=None)
    want = h.choose([small.m], small.n, small.k)
    assert want != h.DEFAULT
    monkeypatch.setattr(gg, "_device_identity", lambda device: ("sm_100a", "NVIDIA B200"))
    assert gg._tuned(small, 0, None, "bfloat16", "k") == (want.tile, "static", want.cluster)
    assert gg._tuned(SimpleNamespace(**{**vars(small), "bias": SimpleNamespace(dtype="bfloat16")}), 0, None,
                     "bfloat16", "k") == \
        (None, "static", None)                                          # bias: tile N 256, the default
    bucket = tuning_records.Bucket.of(experts=8, m_rows=small.m, n=small.n, k=small.k)
    tuning_records.write(tuning_records.record_file("grouped_gemm", "sm_100a", "NVIDIA B200"), bucket.key,
                         {"tile": [256, 256], "dynamic": True})
    assert gg._tuned(small, 0, None, "bfloat16", "k") == ((256, 256), "dynamic", None)   # a measurement wins
    monkeypatch.setattr(gg, "_device_identity", lambda device: ("sm_90a", "NVIDIA H200"))
    assert gg._tuned(small, 0, None, "bfloat16", "k") == (None, "static", None)        # sm_90a: the default
    tuning_records.forget()
