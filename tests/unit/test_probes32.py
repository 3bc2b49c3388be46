"""Issue 32: what a new user's probes of the CLI found (exit codes, messages, nothing done
behind the user's back). One test per finding, named by its number in the issue."""
from __future__ import annotations

import json

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
