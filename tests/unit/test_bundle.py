"""AOT kernel bundles (runtime/bundle.py) and read-only caches: a runtime that never compiles.

The bundle here holds the seed BF16 grouped GEMM's prebuild kernels for both archs; it is built
once per session (one core: ~6 s) into the session cache.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest

from fusegemm import build, pipeline
from fusegemm.base.errors import CacheError
from fusegemm.runtime import config
from fusegemm.runtime.bundle import Bundle, BundleSet, default_bundles

SPECS = ["grouped_gemm"]
ARCHS = ("sm_90a", "sm_100a")

# Runs in a fresh interpreter: NVRTC unimportable, compiling raises, an empty read-only cache;
# every kernel of the bundle must come from it. Prints one JSON line.
_LOADER = textwrap.dedent("""
    import json, sys
    import fusegemm.runtime.nvrtc as nv
    def no_nvrtc():
        raise SystemExit("NVRTC was loaded")
    nv.load = no_nvrtc
    import fusegemm.runtime.compile as comp
    compiles = []
    def refuse(*a, **k):
        compiles.append(a)
        raise SystemExit("a compile was attempted")
    comp.compile_source = refuse
    from fusegemm import build, pipeline
    vs, _ = build.select({specs!r}, {archs!r})
    got = [pipeline.get_kernel(v) for v in vs]
    nvrtc = [line.split()[-1] for line in open("/proc/self/maps") if "libnvrtc" in line]
    print(json.dumps({{"kernels": len(got), "from_bundle": sum(bool(b.meta.get("bundle")) for b in got),
                      "compiles": len(compiles), "nvrtc_modules": nvrtc,
                      "sha": sorted({{__import__("hashlib").sha256(b.cubin).hexdigest() for b in got}})}}))
""")


@pytest.fixture(scope="module")
def bundle_file(tmp_path_factory, session_cache):
    path = tmp_path_factory.mktemp("bundle") / "kernels.fgb"
    vs, _ = build.select(SPECS, ARCHS)
    n, size = build.write_bundle(vs, path, cache=session_cache)
    assert n == len({pipeline.bundle_key(pipeline.plan(v).source) for v in vs}) and size > 0
    return path


@pytest.fixture
def no_bundles():
    default_bundles().clear()
    yield
    default_bundles().clear()


def _load_in_processes(bundle: os.PathLike, tmp_path, n: int) -> list[dict]:
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    env = {**os.environ, "FUSEGEMM_BUNDLE": str(bundle), "FUSEGEMM_CACHE_DIR": str(empty),
           "FUSEGEMM_CACHE_READONLY": "1"}
    code = _LOADER.format(specs=SPECS, archs=ARCHS)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr[-2000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    assert not any(empty.iterdir()), "a read-only cache was written"
    return out


def test_sixteen_processes_load_every_kernel_from_one_bundle(bundle_file, tmp_path):
    """The cluster case: 16 ranks start at once, each loads every kernel from one bundle with
    NVRTC unimportable; zero compiles, zero NVRTC imports, nothing written, identical cubins."""
    results = _load_in_processes(bundle_file, tmp_path, 16)
    vs, _ = build.select(SPECS, ARCHS)
    for r in results:
        assert r["kernels"] == r["from_bundle"] == len(vs)
        assert r["compiles"] == 0 and r["nvrtc_modules"] == []
    assert len({tuple(r["sha"]) for r in results}) == 1


def test_a_bundle_hit_is_the_cubin_the_cache_holds(bundle_file, session_cache, no_bundles):
    pipeline.add_bundle(bundle_file)
    for v in build.select(SPECS, ARCHS)[0]:
        from_bundle = pipeline.get_kernel(v)
        built = pipeline.lookup(pipeline.plan(v), session_cache)
        assert from_bundle.meta["bundle"] == str(bundle_file)
        assert from_bundle.cubin == built.cubin and from_bundle.key == built.key
        assert from_bundle.contract == built.contract


def test_bundle_keys_ignore_the_toolchain_but_not_the_source(bundle_file, monkeypatch, tmp_path, no_bundles):
    """Decision (runtime/bundle.py): a bundle stays valid under another NVRTC or CUTLASS (the
    cubin is finished; loading compiles nothing), but not when fusegemm's own headers or the
    options that reach the compile change."""
    from fusegemm.runtime import headers as hdr
    pipeline.add_bundle(bundle_file)
    v = build.select(SPECS, ("sm_90a",))[0][0]
    src = pipeline.plan(v).source
    key = pipeline.bundle_key(src)
    import fusegemm.runtime.compile as comp
    monkeypatch.setattr(comp, "nvrtc_version", lambda: (99, 9))          # another NVRTC
    assert pipeline.bundle_key(src) == key and pipeline.from_bundles(src) is not None
    with config.override(FUSEGEMM_NVRTC_EXTRA="-DFUSEGEMM_SOMETHING=1"):    # other options
        assert pipeline.bundle_key(src) != key and pipeline.from_bundles(src) is None
    own = tmp_path / "include"                                              # an edited header
    import shutil
    shutil.copytree(hdr.own_include_dir(), own)
    with open(own / "fusegemm" / "common.cuh", "a") as fh:
        fh.write("\n// edited\n")
    monkeypatch.setattr(hdr, "own_include_dir", lambda: own)
    assert pipeline.bundle_key(src) != key and pipeline.from_bundles(src) is None


def test_a_modified_bundle_is_refused(bundle_file, tmp_path):
    with zipfile.ZipFile(bundle_file) as z:
        members = {name: z.read(name) for name in z.namelist()}
    manifest = json.loads(members["manifest.json"])
    key, entry = next(iter(manifest["entries"].items()))

    def write(path, files):
        with zipfile.ZipFile(path, "w") as z:
            for name, data in files.items():
                z.writestr(name, data)
        return path

    edited = dict(members, **{"manifest.json": members["manifest.json"].replace(b'"arch"', b'"arch" ', 1)})
    with pytest.raises(CacheError, match="manifest.json does not match manifest.sha256"):
        Bundle(write(tmp_path / "m.fgb", edited))
    cubin = bytearray(members[entry["cubin"]])
    cubin[len(cubin) // 2] ^= 0xFF
    planted = Bundle(write(tmp_path / "c.fgb", dict(members, **{entry["cubin"]: bytes(cubin)})))
    with pytest.raises(CacheError, match=f"the cubin of {entry['name']} does not match its sha256"):
        planted.cubin(key)
    with pytest.raises(CacheError, match="not a readable fusegemm bundle"):
        Bundle(write(tmp_path / "empty.fgb", {"x": b"1"}))
    (tmp_path / "junk.fgb").write_bytes(b"not a zip")
    with pytest.raises(CacheError, match="not a readable fusegemm bundle"):
        Bundle(tmp_path / "junk.fgb")
    other = dict(members)
    bad = dict(manifest, schema=99)
    other["manifest.json"] = json.dumps(bad).encode()
    other["manifest.sha256"] = hashlib.sha256(other["manifest.json"]).hexdigest().encode()
    with pytest.raises(CacheError, match="schema 99; this fusegemm reads schema 1"):
        Bundle(write(tmp_path / "s.fgb", other))


def test_fusegemm_bundle_variable_lists_paths_first_match_wins(bundle_file, tmp_path):
    missing = tmp_path / "nope.fgb"
    bs = BundleSet()
    with config.override(FUSEGEMM_BUNDLE=os.pathsep.join([str(bundle_file), str(bundle_file)])):
        assert [b.path for b in bs.active()] == [bundle_file, bundle_file]
        key = next(iter(bs.active()[0].entries))
        assert bs.find(key)[0] is bs.active()[0]
    with config.override(FUSEGEMM_BUNDLE=str(missing)):
        with pytest.raises(CacheError, match="nope.fgb: not a readable fusegemm bundle"):
            bs.active()
    with config.override(FUSEGEMM_BUNDLE=None):
        assert bs.active() == []


def test_readonly_cache_reads_and_never_writes(cache_dir, session_cache, monkeypatch):
    """A shared cache on a read-only mount: hits are served, no lock file or entry is written,
    a miss compiles in memory."""
    from fusegemm.runtime.cache import KernelCache
    v = build.select(SPECS, ("sm_100a",))[0][0]
    p = pipeline.plan(v)
    warm = KernelCache(cache_dir, disk=True)
    pipeline.compile_planned(p, warm)                      # the shared cache, written once
    before = sorted(str(x) for x in cache_dir.rglob("*"))
    with config.override(FUSEGEMM_CACHE_READONLY="1"):
        ro = KernelCache(cache_dir, disk=True)
        assert ro.readonly
        assert ro.get(p.name, p.key) is not None
        other = pipeline.plan(build.select(SPECS, ("sm_100a",), choices={"scheduler": "dynamic"})[0][0])
        built = pipeline.compile_planned(other, ro)        # a miss: compiled, kept in memory
        assert built.path is None and ro.get(other.name, other.key) is not None
    assert sorted(str(x) for x in cache_dir.rglob("*")) == before
    monkeypatch.setattr(os, "access", lambda path, mode: False)   # an unwritable folder
    assert KernelCache(cache_dir, disk=True).readonly


def test_cli_build_writes_a_bundle(tmp_path, cache_dir):
    from click.testing import CliRunner

    from fusegemm.cli import main
    out = tmp_path / "b.fgb"
    res = CliRunner().invoke(main, ["build", "grouped_gemm", "--arch", "sm_100a", "--variant", "tile_m=128",
                                    "-j", "1", "--bundle", str(out)])
    assert res.exit_code == 0, res.output
    assert f"bundle {out}: 1 kernels" in res.output and len(Bundle(out)) == 1
