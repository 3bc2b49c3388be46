"""fusegemm.tune on the CPU: shape parsing, buckets, the record store (atomic, per device model,
corrupted or malformed records read as none, read-only caches keep records in the process), the
wrapper's use of a record, and `fusegemm tune` without a GPU. The measuring itself runs on the
H200 (tests/gpu/test_tune_gpu.py)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from fusegemm import tune, tuning_records
from fusegemm.base.errors import ArgumentError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FUSEGEMM_CACHE_READONLY", raising=False)
    monkeypatch.delenv("FUSEGEMM_DISABLE_DISK_CACHE", raising=False)
    tuning_records.forget()
    yield tmp_path
    tuning_records.forget()


def test_parse_shape():
    assert tune.parse_shape("experts=8, tokens=16384,n=4096,k=7168") == dict(experts=8, tokens=16384, n=4096, k=7168)
    for bad, why in [("experts=8,tokens=1,n=2", "missing k"), ("experts=0,tokens=1,n=2,k=3", "positive"),
                     ("experts=8,tokens=1,n=2,k=3,m=4", "positive"), ("experts=8,experts=8,tokens=1,n=2,k=3", "once")]:
        with pytest.raises(ArgumentError, match=f"--shape: got .*{why}"):
            tune.parse_shape(bad)


def test_buckets_round_rows_per_expert_to_a_power_of_two():
    b = tuning_records.Bucket.of(experts=8, m_rows=8 * 2304, n=4096, k=7168)
    assert b.rows == 2048 and b.key == "L8.r2048.n4096.k7168.dbfloat16.noc.nobias.dense.bk"
    assert tuning_records.Bucket.of(experts=8, m_rows=8 * 3072, n=4096, k=7168).rows == 4096     # nearest
    assert tuning_records.Bucket.of(experts=4, m_rows=1024, n=256, k=256, c_dtype="float32", discrete=True).key.endswith(
        "cfloat32.nobias.discrete.bk")


def test_records_round_trip_per_device_model(cache):
    b = tuning_records.Bucket.of(experts=8, m_rows=16384, n=4096, k=7168)
    path = tuning_records.record_file("grouped_gemm", "sm_90a", "NVIDIA H200")
    assert path == cache / "tuned" / "grouped_gemm.sm_90a.nvidia-h200.json"
    assert tuning_records.write(path, b.key, {"tile": [64, 256], "dynamic": True}) == path
    other = tuning_records.Bucket.of(experts=8, m_rows=16384, n=2048, k=7168)
    tuning_records.write(path, other.key, {"tile": [128, 128], "dynamic": False})       # a second record keeps the first
    assert tuning_records.lookup("grouped_gemm", "sm_90a", "NVIDIA H200", b) == tuning_records.Candidate((64, 256), "dynamic")
    assert tuning_records.lookup("grouped_gemm", "sm_90a", "NVIDIA H200", other) == tuning_records.Candidate((128, 128), "static")
    assert tuning_records.lookup("grouped_gemm", "sm_90a", "NVIDIA H100 80GB HBM3", b) is None
    assert set(json.loads(path.read_text())["records"]) == {b.key, other.key}
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]           # no temp files left


def test_corrupted_or_malformed_records_read_as_none(cache):
    b = tuning_records.Bucket.of(experts=2, m_rows=512, n=256, k=256)
    path = tuning_records.record_file("grouped_gemm", "sm_90a", "NVIDIA H200")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert tuning_records.lookup("grouped_gemm", "sm_90a", "NVIDIA H200", b) is None
    path.write_text(json.dumps({"records": {b.key: {"tile": "big", "dynamic": 1}}}))
    assert tuning_records.lookup("grouped_gemm", "sm_90a", "NVIDIA H200", b) is None
    tuning_records.write(path, b.key, {"tile": [128, 256], "dynamic": False})                 # rewrites a bad file
    assert tuning_records.lookup("grouped_gemm", "sm_90a", "NVIDIA H200", b) == tuning_records.Candidate((128, 256), "static")


def test_a_record_names_its_scheduler_stream_k_included(cache, monkeypatch):
    """A record names its scheduler (static, dynamic or streamk, the tuner's stream-K candidates);
    a record written before stream-K (``dynamic`` alone) still reads; an unknown scheduler is a
    malformed record; the wrapper's configuration takes the recorded scheduler as its axis."""
    from fusegemm.ops import tuned as gg
    C = tuning_records.Candidate
    assert [C((64, 256), s).label for s in ("static", "dynamic", "streamk")] == \
        ["64x256:static", "64x256:dynamic", "64x256:streamk"]
    assert [(c.dynamic, c.stream_k) for c in (C((64, 256)), C((64, 256), "dynamic"), C((64, 256), "streamk"))] == \
        [(False, False), (True, False), (False, True)]
    with pytest.raises(ValueError, match="allowed: static, dynamic, streamk"):
        C((64, 256), "clever")
    path = tuning_records.record_file("grouped_gemm", "sm_90a", "NVIDIA H200")
    b = tuning_records.Bucket.of(experts=1, m_rows=512, n=2048, k=8192)
    tuning_records.write(path, b.key, {"tile": [128, 256], "dynamic": False, "scheduler": "streamk"})
    assert tuning_records.lookup("grouped_gemm", "sm_90a", "NVIDIA H200", b) == C((128, 256), "streamk")
    monkeypatch.setattr(gg, "_device_identity", lambda device: ("sm_90a", "NVIDIA H200"))
    call = SimpleNamespace(l=1, m=512, n=2048, k=8192, bias=None, b_ptrs=None)
    assert gg._tuned(call, 0, None, "bfloat16", "k") == ((128, 256), "streamk", None)
    tuning_records.write(path, b.key, {"tile": [128, 256], "dynamic": True})              # an older record
    assert tuning_records.lookup("grouped_gemm", "sm_90a", "NVIDIA H200", b) == C((128, 256), "dynamic")
    tuning_records.write(path, b.key, {"tile": [128, 256], "dynamic": False, "scheduler": "clever"})
    assert tuning_records.lookup("grouped_gemm", "sm_90a", "NVIDIA H200", b) is None
    tuning_records.forget()


def test_the_tuner_skips_stream_k_where_the_kernel_does_not_implement_it(monkeypatch):
    """tune's stream-K candidate (the spec-driven op: not a seed argument) is skipped, with the
    registry's reason, on an arch whose kernel has no stream-K (sm_100a), before any launch."""
    monkeypatch.setattr("fusegemm.ops.device.device_arch", lambda device: "sm_100a")
    said = []
    got = tune._stream_k_candidate("grouped_gemm", tuning_records.Candidate((128, 256), "streamk"), 0,
                                   "bfloat16", (None, None, None), None, said.append)
    assert got is None and said == ["skipped 128x256:streamk: scheduler='streamk' is not implemented for "
                                    "grouped_gemm on sm_100a; implemented: static, dynamic (the stream-K "
                                    "remainder (scheduler streamk) is the sm_90a BF16 grouped kernel's)"]


def test_a_read_only_cache_keeps_the_record_in_the_process(cache, monkeypatch):
    monkeypatch.setenv("FUSEGEMM_CACHE_READONLY", "1")
    b = tuning_records.Bucket.of(experts=2, m_rows=512, n=256, k=256)
    path = tuning_records.record_file("grouped_gemm", "sm_90a", "X")
    tuning_records.remember(path, b.key, {"tile": [64, 128], "dynamic": False})
    assert tuning_records.write(path, b.key, {"tile": [64, 128], "dynamic": False}) is None and not path.exists()
    assert tuning_records.lookup("grouped_gemm", "sm_90a", "X", b) == tuning_records.Candidate((64, 128), "static")


def test_the_wrapper_uses_the_record_of_its_bucket(cache, monkeypatch):
    from fusegemm.ops import tuned as gg
    monkeypatch.setattr(gg, "_device_identity", lambda device: ("sm_90a", "NVIDIA H200"))
    call = SimpleNamespace(l=8, m=16384, n=4096, k=7168, bias=None, b_ptrs=None)
    assert gg._tuned(call, 0, None, "bfloat16", "k") == (None, "static", None)            # no record: the default
    b = tuning_records.Bucket.of(experts=8, m_rows=16384, n=4096, k=7168)
    from fusegemm.ops import faces
    faces._RESOLVED["memoised call"] = "its configuration"
    tuning_records.write(tuning_records.record_file("grouped_gemm", "sm_90a", "NVIDIA H200"), b.key,
                         {"tile": [64, 256], "dynamic": True})
    assert "memoised call" not in faces._RESOLVED     # the store told the wrapper: calls re-resolve
    assert gg._tuned(call, 0, None, "bfloat16", "k") == ((64, 256), "dynamic", None)
    assert gg._tuned(call, 0, "bfloat16", "bfloat16", "k") == (None, "static", None)     # with C: another bucket


def test_cli_without_a_gpu_exits_3(monkeypatch):
    from fusegemm import selftest as st
    from fusegemm.cli import main
    monkeypatch.setattr(st, "detect_arch", lambda: (None, "no CUDA GPU present"))
    r = CliRunner().invoke(main, ["tune", "grouped_gemm", "--shape", "experts=8,tokens=4096,n=512,k=512"])
    assert r.exit_code == 3 and "nothing measured: no CUDA GPU present" in r.output
    r = CliRunner().invoke(main, ["tune", "gemm_amax", "--shape", "experts=8,tokens=4096,n=512,k=512"])
    assert r.exit_code == 1 and "tuning is implemented for grouped_gemm" in r.output
    r = CliRunner().invoke(main, ["tune", "grouped_gemm", "--shape", "experts=8"])
    assert r.exit_code == 1 and "missing tokens, n, k" in r.output


@pytest.fixture
def first(cache, monkeypatch):
    """The wrapper's configuration choice on a fake H200 with FUSEGEMM_AUTOTUNE=1 and tune()
    replaced by a recorder (the measuring runs on the H200: tests/gpu/test_tune_gpu.py)."""
    from fusegemm.ops import tuned as gg
    from fusegemm.runtime import tensors
    monkeypatch.setattr(gg, "_device_identity", lambda device: ("sm_90a", "NVIDIA H200"))
    monkeypatch.setattr(gg, "resolve_stream", lambda stream, device: 7 if stream is None else stream)
    monkeypatch.setattr(tensors, "is_capturing", lambda stream: stream == 99)
    monkeypatch.setenv("FUSEGEMM_AUTOTUNE", "1")
    tune._first_done.clear()
    calls = []

    def fake_tune(spec, *, experts, tokens, n, k, d_dtype, device, bucket, **kw):
        assert kw.get("gated_modes") is False     # a user's call never waits on first-run gates
        calls.append(dict(spec=spec, experts=experts, tokens=tokens, n=n, k=k, d_dtype=d_dtype, device=device,
                          bucket=bucket.key))
        if n == 999:
            raise RuntimeError("out of memory")
        best = tuning_records.Candidate((64, 256), "dynamic")
        tuning_records.remember(tuning_records.record_file(spec, "sm_90a", "NVIDIA H200"), bucket.key,
                                {"tile": [64, 256], "dynamic": True})
        return SimpleNamespace(best=best, ms={best.label: 1.0, "128x256:static": 1.2})
    monkeypatch.setattr(tune, "tune", fake_tune)
    yield gg, calls
    tune._first_done.clear()


def test_first_call_tuning_tunes_the_calls_bucket_once(first):
    gg, calls = first
    call = SimpleNamespace(l=8, m=8 * 2304, n=4096, k=7168, bias=None, b_ptrs=None)
    assert gg._tuned(call, 0, None, "bfloat16", "k") == ((64, 256), "dynamic", None)
    bucket = tuning_records.Bucket.of(experts=8, m_rows=8 * 2304, n=4096, k=7168)
    assert calls == [dict(spec="grouped_gemm", experts=8, tokens=8 * 2304, n=4096, k=7168, d_dtype="bfloat16",
                          device=0, bucket=bucket.key)]
    assert gg._tuned(call, 0, None, "bfloat16", "k") == ((64, 256), "dynamic", None)      # the record now
    assert len(calls) == 1


def test_first_call_tuning_is_opt_in_and_skips_what_it_cannot_measure(first, monkeypatch):
    gg, calls = first
    call = SimpleNamespace(l=8, m=4096, n=512, k=512, bias=None, b_ptrs=None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FUSEGEMM_AUTOTUNE", "0")
        assert gg._tuned(call, 0, None, "bfloat16", "k") == (None, "static", None)
    assert gg._tuned(call, 0, "bfloat16", "bfloat16", "k") == (None, "static", None)    # with C
    assert gg._tuned(call, 0, None, "bfloat16", "n") == (None, "static", None)          # N-major weights
    assert gg._tuned(SimpleNamespace(**{**vars(call), "b_ptrs": object()}), 0, None, "bfloat16", "k") == \
        (None, "static", None)                                                         # discrete weights
    assert gg._tuned(call, 0, None, "bfloat16", "k", 99) == (None, "static", None)      # capturing a graph
    from fusegemm.ops.prepared import dry_run
    with dry_run():
        assert gg._tuned(call, 0, None, "bfloat16", "k") == (None, "static", None)      # fake tensors
    assert calls == []


def test_a_failed_tuning_gives_the_default_and_is_not_retried(first, caplog):
    gg, calls = first
    call = SimpleNamespace(l=4, m=1024, n=999, k=512, bias=None, b_ptrs=None)
    with caplog.at_level("WARNING", logger="fusegemm"):
        assert gg._tuned(call, 0, None, "bfloat16", "k") == (None, "static", None)
        assert gg._tuned(call, 0, None, "bfloat16", "k") == (None, "static", None)
    assert len(calls) == 1
    assert "failed (RuntimeError: out of memory); launching the default" in caplog.text


def test_calls_made_while_tuning_are_not_tuned(first, monkeypatch):
    """The first-run verification of an unexecuted arch runs selftest cases through the
    wrappers while an op compiles, and tuning compiles ops: those nested calls get their
    default instead of a nested tuning (or a deadlock on the tuning lock)."""
    gg, calls = first
    inner = SimpleNamespace(l=2, m=512, n=256, k=256, bias=None, b_ptrs=None)
    seen = []
    real = tune.tune

    def nesting_tune(spec, **kw):
        seen.append(gg._tuned(inner, 0, None, "bfloat16", "k"))
        return real(spec, **kw)
    monkeypatch.setattr(tune, "tune", nesting_tune)
    outer = SimpleNamespace(l=8, m=4096, n=512, k=512, bias=None, b_ptrs=None)
    import threading
    got = []
    t = threading.Thread(target=lambda: got.append(gg._tuned(outer, 0, None, "bfloat16", "k")), daemon=True)
    t.start()
    t.join(timeout=20)
    assert got == [((64, 256), "dynamic", None)], "the nested call deadlocked or tuned"
    assert seen == [(None, "static", None)] and [c["n"] for c in calls] == [512]


def test_tune_refuses_a_bucket_of_other_options():
    with pytest.raises(ArgumentError, match=r"^bucket: got .*noc.nobias.discrete.bk; allowed: options "
                                            r"dbfloat16.noc.nobias.dense.bk"):
        tune.tune(experts=2, tokens=512, n=256, k=256,
                  bucket=tuning_records.Bucket.of(experts=2, m_rows=512, n=256, k=256, discrete=True))


def test_calls_made_by_a_first_run_verification_are_not_tuned(first, monkeypatch):
    """The first-run verification of an unexecuted arch runs selftest cases through the wrapper:
    they launch the default (tuning there would record the selftest's shapes, verify a tuned
    configuration instead of the default, and could deadlock against a thread that holds the
    tuning lock while waiting to verify). Calls of no rows (an empty rank) are not tuned either:
    nothing to measure, and their bucket (r1) belongs to real shapes."""
    from fusegemm import verify
    gg, calls = first
    call = SimpleNamespace(l=6, m=3072, n=256, k=200, bias=None, b_ptrs=None)
    monkeypatch.setattr(verify._local, "active", True, raising=False)
    assert gg._tuned(call, 0, None, "bfloat16", "k") == (None, "static", None)
    monkeypatch.setattr(verify._local, "active", False)
    assert gg._tuned(SimpleNamespace(**{**vars(call), "m": 0}), 0, None, "bfloat16", "k") == (None, "static", None)
    assert calls == []
    assert gg._tuned(call, 0, None, "bfloat16", "k") == ((64, 256), "dynamic", None)     # outside: tuned
    assert len(calls) == 1
