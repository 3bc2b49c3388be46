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
