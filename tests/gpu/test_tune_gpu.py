"""fusegemm.tune on the H200: a tuning run measures every implemented configuration and records
the fastest; the wrapper launches a recorded configuration for calls of its bucket (a non-default
one is planted to see it chosen) and the result still equals the per-expert matmul reference."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm import tune, tuning_records  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEGEMM_CACHE_DIR", str(tmp_path))
    tuning_records.forget()
    yield tmp_path
    tuning_records.forget()


def _reference(a, b, alpha, padded):
    """alpha[e] * A_e @ B_e^T per expert, FP32, from the padded expert sizes."""
    ref = torch.zeros(a.shape[0], b.shape[1], device="cuda")
    start = 0
    for e, p in enumerate(padded):
        ref[start:start + p] = alpha[e] * (a[start:start + p].float() @ b[e].float().T)
        start += p
    return ref


def test_tune_measures_every_configuration_and_records_the_best(cache):
    res = tune.tune(experts=4, tokens=1000, n=512, k=256, rounds=1, iters=3, warmup=1)
    assert len(res.ms) >= 4 and res.default.label in res.ms and all(t > 0 for t in res.ms.values())
    assert res.ms[res.fastest.label] == min(res.ms.values())
    if res.best == res.default:                            # kept: the fastest is within the 5% margin
        assert res.ms[res.default.label] <= res.ms[res.fastest.label] * 1.05
    else:                                                  # a clear winner
        assert res.best == res.fastest and res.ms[res.default.label] > res.ms[res.best.label] * 1.05
    assert res.path is not None and res.path.is_file() and res.path.parent == cache / "tuned"
    tuning_records.forget()                                # read back from the file
    from fusegemm.ops.tuned import _device_identity
    arch, name = _device_identity(0)
    assert tuning_records.lookup("grouped_gemm", arch, name, res.bucket) == res.best


def test_the_wrapper_launches_the_recorded_configuration(cache):
    from fusegemm.ops import faces, scaled_seeds
    from fusegemm.ops import tuned as gg
    arch, name = gg._device_identity(0)
    sizes = [300, 0, 512, 200]
    padded = [-(-s // 256) * 256 for s in sizes]
    m, n, k = sum(padded), 384, 192
    bucket = tuning_records.Bucket.of(experts=4, m_rows=m, n=n, k=k)
    tuning_records.write(tuning_records.record_file("grouped_gemm", arch, name), bucket.key,
                         {"tile": [64, 128], "dynamic": True})
    faces._RESOLVED.clear()
    g = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(m, k, generator=g, device="cuda").bfloat16()
    b = torch.randn(4, n, k, generator=g, device="cuda").bfloat16()
    off = torch.tensor(padded, device="cuda").cumsum(0).to(torch.int32)
    alpha = torch.rand(4, generator=g, device="cuda") + 0.5
    before = set(scaled_seeds._OPS._ops)
    d = fusegemm.grouped_gemm(a, off, alpha, b_tensor=b)["d_tensor"]
    new = set(scaled_seeds._OPS._ops) - before
    assert any(_tile(key) == (64, 128) and dict(key[4])["scheduler"] == "dynamic"
               for key in set(scaled_seeds._OPS._ops)), new
    torch.testing.assert_close(d.float(), _reference(a, b, alpha, padded), rtol=1e-2, atol=1e-2)
    # A pinned configuration ignores the record.
    before = set(scaled_seeds._OPS._ops)
    fusegemm.grouped_gemm(a, off, alpha, b_tensor=b, mma_tiler_mn=(128, 256))
    assert all(_tile(key) == (128, 256) for key in set(scaled_seeds._OPS._ops) - before)


def _tile(key: tuple) -> tuple:
    """The tile of a preset op's cache key (spec, arch, device, e5m2 rule, its axes)."""
    axes = dict(key[4])
    return axes.get("tile_m"), axes.get("tile_n")


def test_first_call_tuning_records_the_calls_bucket_and_matches_the_reference(cache, monkeypatch):
    """FUSEGEMM_AUTOTUNE=1: the first wrapper call of an untuned bucket tunes it (a record lands
    in the cache under the call's own bucket), launches the winner, and the output equals the
    reference; a call of another argument signature in the same bucket does not tune again."""
    from fusegemm.ops import faces, scaled_seeds
    from fusegemm.ops import tuned as gg
    monkeypatch.setenv("FUSEGEMM_AUTOTUNE", "1")
    tune._first_done.clear()
    measured = []
    real = tune.tune
    monkeypatch.setattr(tune, "tune", lambda *a, **kw: measured.append(kw["bucket"].key) or
                        real(*a, **{**kw, "rounds": 1, "iters": 2, "warmup": 1}))
    faces._RESOLVED.clear()
    arch, name = gg._device_identity(0)
    sizes = [300, 0, 700]                       # 3 experts, 1280 rows: bucket of 512 rows per expert
    padded = [-(-s // 256) * 256 for s in sizes]
    m, n, k = sum(padded), 256, 128
    g = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(m, k, generator=g, device="cuda").bfloat16()
    b = torch.randn(3, n, k, generator=g, device="cuda").bfloat16()
    off = torch.tensor(padded, device="cuda").cumsum(0).to(torch.int32)
    alpha = torch.rand(3, generator=g, device="cuda") + 0.5
    d = fusegemm.grouped_gemm(a, off, alpha, b_tensor=b)["d_tensor"]
    bucket = tuning_records.Bucket.of(experts=3, m_rows=m, n=n, k=k)
    assert measured == [bucket.key]
    tuning_records.forget()                     # read back from the file
    assert tuning_records.lookup("grouped_gemm", arch, name, bucket) is not None
    torch.testing.assert_close(d.float(), _reference(a, b, alpha, padded), rtol=1e-2, atol=1e-2)
    fusegemm.grouped_gemm(a.unsqueeze(-1), off, alpha, b_tensor=b)   # (M, K, 1): new signature, same bucket
    assert len(measured) == 1
    tune._first_done.clear()
