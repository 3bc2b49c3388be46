"""Issue 32: what a new user's probes of the CLI found (exit codes, messages, nothing done
behind the user's back). One test per finding, named by its number in the issue."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fusegemm.runtime import config

from fusegemm.cli import main


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _fake_entry(cache_dir, name="grouped_gemm.t128x256.sm100a.0123456789ab"):
    """A kernel entry folder as `cache clear` sees one (clear removes folders, reads nothing)."""
    entry = cache_dir / f"{name}.0123456789abcdef"
    entry.mkdir(parents=True)
    (entry / "meta.json").write_text(json.dumps({"name": name}))
    return entry


# ---- 1, 2: cache clear --------------------------------------------------------------------------

def test_1_cache_clear_without_yes_refuses_when_it_cannot_ask(cache_dir):
    entry = _fake_entry(cache_dir)
    r = run("cache", "clear")            # CliRunner's stdin is not a terminal, as `< /dev/null`
    assert r.exit_code == 1
    assert r.output == (f"Error: cache clear: stdin is not a terminal, so it cannot ask before deleting "
                        f"every kernel entry under {cache_dir}; nothing removed. Pass --yes to delete them\n")
    assert entry.is_dir()
    r = run("cache", "clear", "--yes")
    assert r.exit_code == 0 and "removed 1 entries" in r.output and not entry.exists()


def test_2_cache_clear_refuses_a_read_only_cache(cache_dir):
    entry = _fake_entry(cache_dir)
    with config.override(FUSEGEMM_CACHE_READONLY="1"):
        r = run("cache", "clear", "--yes")
        assert r.exit_code == 1
        assert r.output == (f"Error: the kernel cache at {cache_dir} is read-only (FUSEGEMM_CACHE_READONLY=1); "
                            f"nothing removed. Unset FUSEGEMM_CACHE_READONLY to write it\n")
        assert run("cache", "clear", "--yes", "--records").exit_code == 1
    assert entry.is_dir()


# ---- 3: a build into a read-only cache says that it stored nothing ------------------------------

def _fresh_default_cache():
    import fusegemm.runtime.cache as kc
    kc._default = None   # a new process's cache: no memory hits from earlier tests, none left behind


def _compile_once(monkeypatch):
    """NVRTC runs once per source in this test (each case builds the same kernel anew)."""
    from fusegemm import pipeline
    real, done = pipeline.compile_source, {}

    def memo(text, **kw):
        key = (text, kw["arch"])
        if key not in done:
            done[key] = real(text, **kw)
        return done[key]
    monkeypatch.setattr(pipeline, "compile_source", memo)


def test_3_a_build_into_a_read_only_cache_says_nothing_was_stored(cache_dir, monkeypatch):
    _compile_once(monkeypatch)
    cache_dir.mkdir()
    _fresh_default_cache()
    args = ["build", "gemm_amax", "--arch", "sm_90a", "--variant", "tile_n=128", "-j", "1"]
    try:
        with config.override(FUSEGEMM_CACHE_READONLY="1"):
            r = run(*args)
            assert r.exit_code == 0, r.output
            summary = r.output.strip().splitlines()[-1]
            assert summary.startswith("1 built (0 cached), 0 failed, ")
            assert summary.endswith(f" s wall, cache {cache_dir} (read-only, FUSEGEMM_CACHE_READONLY=1: "
                                    "nothing stored)"), summary
            assert list(cache_dir.iterdir()) == []
            data = json.loads(run(*args, "--json").output)
            assert data["not_stored"] == "read-only, FUSEGEMM_CACHE_READONLY=1"
        with config.override(FUSEGEMM_DISABLE_DISK_CACHE="1"):
            _fresh_default_cache()   # the process-wide cache reads the setting when it is created
            summary = run(*args).output.strip().splitlines()[-1]
            assert summary.endswith(f"cache {cache_dir} (disk cache off, FUSEGEMM_DISABLE_DISK_CACHE=1: "
                                    "nothing stored)"), summary
        _fresh_default_cache()
        r = run(*args, "--json")
        assert json.loads(r.output)["not_stored"] is None and len(list(cache_dir.iterdir())) == 2  # entry, .locks
    finally:
        _fresh_default_cache()


# ---- 4, 10: a bad setting is one clear error, before any work -----------------------------------

def _no_compile(monkeypatch):
    from fusegemm import build, pipeline
    monkeypatch.setattr(build, "plan", lambda *a, **k: (_ for _ in ()).throw(AssertionError("planned")))
    monkeypatch.setattr(pipeline, "compile_source",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("compiled")))


def test_4_a_bad_setting_is_one_error_before_any_work(cache_dir, monkeypatch, tmp_path):
    _no_compile(monkeypatch)
    with config.override(FUSEGEMM_DISABLE_DISK_CACHE="2"):
        for args in (("cache", "list"), ("cache", "path"), ("cache", "clear", "--yes"), ("inspect", "grouped_gemm")):
            r = run(*args)   # no traceback: CliRunner would raise it (catch_exceptions=False)
            assert (r.exit_code, r.output) == (
                1, "Error: FUSEGEMM_DISABLE_DISK_CACHE='2' is invalid; allowed: 0/1, true/false\n"), args
    with config.override(FUSEGEMM_NVRTC_MAJOR="11"):
        r = run("build", "--arch", "sm_90a")       # 20-odd kernels: one error, not one FAILED block each
        assert (r.exit_code, r.output) == (1, "Error: FUSEGEMM_NVRTC_MAJOR='11' is invalid; allowed: auto, 12, 13\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for root, where in ((a_file, a_file), (a_file / "sub", a_file)):
        with config.override(FUSEGEMM_CACHE_DIR=str(root)):
            r = run("build", "grouped_gemm", "--arch", "sm_90a")
            assert (r.exit_code, r.output) == (
                1, f"Error: FUSEGEMM_CACHE_DIR='{root}' is invalid: {where} is a file; allowed: a directory path\n")
    with config.override(FUSEGEMM_CACHE_DIR=str(a_file), FUSEGEMM_DISABLE_DISK_CACHE="1"):
        assert config.check() is None             # no disk cache: its folder is not read


def test_4_config_check_names_every_declared_variable(monkeypatch):
    """check() parses each declared variable: a bad value of any of them is refused."""
    from fusegemm.base.errors import ConfigError
    bad = {"FUSEGEMM_DISABLE_DISK_CACHE": "2", "FUSEGEMM_JOBS": "0", "FUSEGEMM_ARCHS": "sm_80",
           "FUSEGEMM_VALIDATE_OFFSETS": "maybe", "FUSEGEMM_NVRTC_MAJOR": "11", "FUSEGEMM_CACHE_READONLY": "2",
           "FUSEGEMM_AUTOTUNE": "x", "FUSEGEMM_TRUST_UNVERIFIED": "x"}
    for name, value in bad.items():
        with config.override(**{name: value}), pytest.raises(ConfigError, match=f"^{name}='{value}' is invalid"):
            config.check()


def test_10_build_refuses_a_missing_or_garbage_bundle_as_the_api_does(cache_dir, monkeypatch, tmp_path):
    from fusegemm.runtime.bundle import default_bundles

    from fusegemm.base.errors import CacheError
    _no_compile(monkeypatch)
    garbage = tmp_path / "garbage.fgb"
    garbage.write_text("not a bundle")
    for path in (tmp_path / "missing.fgb", garbage):
        with config.override(FUSEGEMM_BUNDLE=str(path)):
            with pytest.raises(CacheError) as api:
                default_bundles().active()         # what a runtime does first
            r = run("build", "grouped_gemm", "--arch", "sm_90a")
            assert (r.exit_code, r.output) == (1, f"Error: {api.value}\n")
            assert str(path) in r.output


# ---- 6: what no kernel of an arch implements is named ---------------------------------------------

DYNAMIC_CLUSTERS = """\
schema: 2
name: dyn_clusters
kernel: grouped_gemm
summary: D = alpha * acc, dynamic scheduling with 2x1 clusters only
epilogue:
  inputs:
    alpha: {per: expert}
  compute:
    - d = alpha * acc
  outputs:
    d: {dtype: d_dtype}
choices:
  d_dtype: [bfloat16]
  scheduler: [dynamic]
  tile_m: [128]
  tile_n: [256]
  cluster_m: [2]
  cluster_n: [1]
defaults: {}
"""


def test_6_build_names_the_axis_value_an_arch_does_not_implement(tmp_path, monkeypatch):
    """Each declared value is implemented on sm_90a, but not together (clusters only with static
    scheduling there): the spec is valid and the build names the axis, value and what is
    implemented, instead of a bare "nothing to build". (A value no combination reaches is
    refused by the spec itself: tests/unit/test_spec_errors.py.)"""
    _no_compile(monkeypatch)
    path = tmp_path / "dyn_clusters.yaml"
    path.write_text(DYNAMIC_CLUSTERS)
    assert run("validate", str(path)).exit_code == 0
    r = run("build", str(path), "--arch", "sm_90a")
    assert r.exit_code == 1
    why = ("cluster_m=2 is not implemented for grouped_gemm on sm_90a with scheduler=dynamic; implemented: 1 "
           "(the dynamic scheduler claims tiles per CTA; clusters walk statically)")
    assert r.output.splitlines() == [f"not built: dyn_clusters on sm_90a (implemented): {why}",
                                     "Error: nothing to build: dyn_clusters on sm_90a (implemented)"]


# ---- 7: the names printed are the names inspect takes, and the cache folders carry them -----------

def test_7_show_prints_kernel_names_that_inspect_resolves(cache_dir, monkeypatch):
    _compile_once(monkeypatch)
    _fresh_default_cache()
    r = run("build", "grouped_gemm", "--arch", "sm_100a", "--variant", "d_dtype=bfloat16", "--json")
    assert r.exit_code == 0, r.output
    (built,) = json.loads(r.output)["results"]
    # the default variant's 2x1 cluster is a launch attribute on sm_100a: one kernel, no "mc" in its name
    variant = "grouped_gemm.cbf16.dbf16.nobias.dense.bk.static.noc.mc.t256x256.sm100a"
    kernel = "grouped_gemm.cbf16.dbf16.nobias.dense.bk.static.noc.t256x256.sm100a"
    assert built["name"].startswith(kernel + ".")
    lines = run("show", "grouped_gemm").output.splitlines()
    prebuild = lines[lines.index("prebuild:") + 1:]
    assert prebuild[0] == f"  {kernel}  (variant {variant})"
    assert "  grouped_gemm.cbf16.dbf16.nobias.dense.bk.static.noc.t128x256.sm90a" in prebuild
    info = json.loads(run("show", "grouped_gemm", "--json").output)
    assert info["prebuild"][0] == variant and info["prebuild_kernels"][0] == kernel
    for name in (prebuild[0].split()[0], built["name"]):
        r = run("inspect", name, "--no-sass", "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["name"] == built["name"]
    # the entry's folder is the printed name and the cache key's first 16 hex digits
    (entry,) = [d for d in cache_dir.iterdir() if not d.name.startswith(".")]
    meta = json.loads((entry / "meta.json").read_text())
    assert entry.name == f"{built['name']}.{meta['key'][:16]}"
    _fresh_default_cache()


# ---- 11: three messages that said the wrong thing ------------------------------------------------

def test_11_variant_arch_is_chosen_with_arch(tmp_path, monkeypatch):
    _no_compile(monkeypatch)
    for cmd in (("build", "grouped_gemm"), ("generate", "grouped_gemm", "-o", str(tmp_path))):
        r = run(*cmd, "--variant", "arch=sm_90a", "--arch", "sm_100a")
        assert (r.exit_code, r.output) == (1, ("Error: --variant arch=sm_90a: the arch is chosen with --arch, and "
                                              "--arch gives sm_100a, which disagrees; allowed: --arch sm_90a (and "
                                              "no arch in --variant)\n"))
    # agreeing with --arch, it says nothing new: allowed
    r = run("generate", "grouped_gemm", "--variant", "arch=sm_90a", "--arch", "sm_90a", "-o", str(tmp_path))
    assert r.exit_code == 0, r.output


def test_11_a_meta_tensor_is_reported_as_meta():
    torch = pytest.importorskip("torch")
    import fusegemm
    from fusegemm.base.errors import ArgumentError
    meta = {"device": "meta"}
    with pytest.raises(ArgumentError, match=r"^a_tensor.device: got meta; allowed: a CUDA device$"):
        fusegemm.grouped_gemm(torch.empty(256, 128, dtype=torch.bfloat16, **meta),
                              torch.tensor([256], dtype=torch.int32, **meta), torch.ones(1, **meta),
                              torch.empty(128, 128, 1, dtype=torch.bfloat16, **meta))


def test_11_inspect_says_an_entry_with_an_unreadable_meta_json_is_corrupted(cache_dir):
    entry = _fake_entry(cache_dir)
    (entry / "meta.json").write_text("{not json")
    assert "corrupted (meta.json unreadable)" in run("cache", "list").output
    r = run("inspect", "grouped_gemm.t128x256")
    assert (r.exit_code, r.output) == (
        1, (f"Error: cached kernel {entry.name} is corrupted (meta.json unreadable); `fusegemm build` rebuilds it, "
           "or `fusegemm cache clear --yes` removes it\n"))
