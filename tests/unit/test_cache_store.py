"""The disk cache: atomic entries, one compile under concurrency, corrupted entries rebuilt."""
from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from fusegemm import pipeline
from fusegemm.generator.variants import make_variant
from fusegemm.runtime.cache import KernelCache

# The sm_90a BF16 grouped GEMM is among the cheapest real kernels to compile (about 2 s); the
# block-scaled kernels take longer, and these tests compile several times.
VARIANT = dict(spec="grouped_gemm", arch="sm_90a")


def get_or_build(v, cache):
    return pipeline.get_kernel(v, cache)


def _variant():
    return make_variant(VARIANT["spec"], arch=VARIANT["arch"])


def _count_compiles(monkeypatch, log: Path):
    real = pipeline._compile

    def counted(planned):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(planned)
    monkeypatch.setattr(pipeline, "_compile", counted)


def test_entry_layout_and_hit(tmp_path, monkeypatch):
    log = tmp_path / "compiles"
    _count_compiles(monkeypatch, log)
    store = KernelCache(tmp_path / "cache", disk=True)
    first = get_or_build(_variant(), store)
    assert not first.cached and first.path is not None
    assert sorted(p.name for p in first.path.iterdir()) == ["kernel.cu",
                                                            "kernel.cubin", "meta.json"]
    meta = json.loads((first.path / "meta.json").read_text())
    assert meta["kernel"] == first.kernel_name and meta["cubin_size"] == len(first.cubin)
    assert set(meta["key_fields"]) == {"cache_schema", "package_version", "source", "headers",
                                       "nvrtc_version", "options", "arch"}
    # a new cache object (new process, in effect) reads it from disk
    again = get_or_build(_variant(), KernelCache(tmp_path / "cache", disk=True))
    assert again.cached and again.cubin == first.cubin
    assert log.read_text().count("\n") == 1
    # no temp or trash folders are left behind
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith((".tmp", ".trash"))] == []


@pytest.mark.parametrize("damage", ["truncate_cubin", "flip_byte", "delete_meta", "garbage_meta",
                                    "meta_not_object", "delete_cubin"])
def test_corrupted_entry_is_rebuilt(tmp_path, monkeypatch, damage):
    root = tmp_path / "cache"
    good = get_or_build(_variant(), KernelCache(root, disk=True))
    cub, meta = good.path / "kernel.cubin", good.path / "meta.json"
    if damage == "truncate_cubin":
        cub.write_bytes(good.cubin[: len(good.cubin) // 2])
    elif damage == "flip_byte":
        data = bytearray(good.cubin)
        data[1000] ^= 0xFF
        cub.write_bytes(bytes(data))
    elif damage == "delete_meta":
        meta.unlink()
    elif damage == "garbage_meta":
        meta.write_text("{not json")
    elif damage == "meta_not_object":
        meta.write_text("[1, 2]")
    else:
        cub.unlink()
    log = tmp_path / "compiles"
    _count_compiles(monkeypatch, log)
    rebuilt = get_or_build(_variant(), KernelCache(root, disk=True))
    assert not rebuilt.cached and rebuilt.cubin == good.cubin
    assert log.read_text().count("\n") == 1
    assert get_or_build(_variant(), KernelCache(root, disk=True)).cached


def _builder(root: str, log: str, barrier) -> str:
    # runs in a forked child: count compiles, wait for every builder, then race
    real = pipeline._compile

    def counted(planned):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(planned)
    pipeline._compile = counted
    barrier.wait()
    b = get_or_build(_variant(), KernelCache(Path(root), disk=True))
    return b.key + ":" + str(len(b.cubin))


def test_concurrent_builders_compile_once(tmp_path):
    root, log = tmp_path / "cache", tmp_path / "compiles"
    ctx = multiprocessing.get_context("fork")
    n = 4
    barrier = ctx.Manager().Barrier(n)
    with ctx.Pool(n) as pool:
        results = pool.starmap(_builder, [(str(root), str(log), barrier)] * n)
    assert len(set(results)) == 1
    assert log.read_text().count("\n") == 1
    entries = [p for p in root.iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1
    assert get_or_build(_variant(), KernelCache(root, disk=True)).cached


def test_memory_only_mode_writes_nothing(tmp_path):
    store = KernelCache(tmp_path / "cache", disk=False)
    b = get_or_build(_variant(), store)
    assert b.path is None and not (tmp_path / "cache").exists()
    again = get_or_build(_variant(), store)  # the in-process layer
    assert again.cached and again.cubin is b.cubin


def test_clear_and_entries(tmp_path):
    store = KernelCache(tmp_path / "cache", disk=True)
    get_or_build(_variant(), store)
    (tmp_path / "cache" / "junk.deadbeef").mkdir()
    rows = store.entries()
    assert len(rows) == 2 and sum(1 for r in rows if r.get("corrupted")) == 1
    assert store.clear() == (2, [])
    assert store.entries() == []


def test_unwritable_cache_is_a_clear_error(tmp_path):
    from fusegemm.base.errors import CacheError
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CacheError, match="cannot write the kernel cache at .*FUSEGEMM_CACHE_DIR"):
        get_or_build(_variant(), KernelCache(blocker / "sub", disk=True))


def test_stale_leftovers_of_killed_writers_are_swept(tmp_path):
    """A worker killed mid-put leaves a .tmp-* folder; the next writer removes those older than
    an hour and leaves younger ones (a live writer's) alone."""
    import os
    import time as _time

    from fusegemm.runtime.cache import KernelCache
    old, young = tmp_path / ".tmp-old", tmp_path / ".tmp-young"
    for d in (old, young):
        d.mkdir()
        (d / "kernel.cubin").write_bytes(b"x")
    past = _time.time() - 7200
    os.utime(old, (past, past))
    cache = KernelCache(tmp_path, disk=True)
    cache._sweep_stale()
    assert not old.exists() and young.exists()
