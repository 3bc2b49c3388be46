"""The CLI: outputs and exit codes (click's CliRunner, a private cache per test)."""
from __future__ import annotations

import json

from click.testing import CliRunner

from fusegemm.cli import main


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_list_json():
    r = run("list", "--json")
    assert r.exit_code == 0
    names = [row["name"] for row in json.loads(r.output)]
    assert names == ["gemm_amax", "grouped_gemm", "grouped_gemm_dswiglu", "grouped_gemm_quant",
                     "grouped_gemm_srelu"]


def test_show_text_and_json():
    r = run("show", "grouped_gemm")
    assert r.exit_code == 0 and "g = alpha * acc" in r.output and "prebuild:" in r.output
    info = json.loads(run("show", "grouped_gemm_srelu", "--json").output)
    assert info["choices"]["sf_vec_size"] == [16, 32]
    assert info["epilogue"]["quantization"]["block"] == 32


def test_show_unknown_spec_exit_1():
    r = run("show", "nope")
    assert r.exit_code == 1 and "Error: no spec named 'nope'" in r.output


def test_generate_writes_sources(tmp_path):
    r = run("generate", "grouped_gemm", "--arch", "sm_90a", "--variant", "d_dtype=float32",
            "-o", str(tmp_path))
    assert r.exit_code == 0, r.output
    files = list(tmp_path.glob("*.cu"))
    assert len(files) == 1 and ".df32." in files[0].name
    assert "using ElementD = float;" in files[0].read_text()


def test_generate_bad_variant_exit_1(tmp_path):
    r = run("generate", "grouped_gemm", "--variant", "tile_m=96", "-o", str(tmp_path))
    assert r.exit_code == 1
    assert "tile_m: got 96; spec grouped_gemm allows: one of 64, 128, 256" in r.output
    r = run("generate", "grouped_gemm", "--arch", "sm_90a", "--variant", "tile_m=256", "-o", str(tmp_path))
    assert r.exit_code == 1 and "TILE_M 256 uses 2-CTA" in r.output


def test_bad_arch_is_usage_error_exit_2():
    r = run("build", "--arch", "sm_80")
    assert r.exit_code == 2 and "allowed: comma list of sm_100a, sm_90a" in r.output


def test_unknown_command_exit_2():
    assert run("frobnicate").exit_code == 2


def test_build_inspect_cache_roundtrip(cache_dir):
    r = run("build", "gemm_amax", "--arch", "sm_90a", "--variant", "c_dtype=bfloat16", "-j", "1")
    assert r.exit_code == 0, r.output
    assert "1 built (0 cached), 0 failed" in r.output
    r2 = run("build", "gemm_amax", "--arch", "sm_90a", "--variant", "c_dtype=bfloat16", "--json")
    data = json.loads(r2.output)
    assert data["failed"] == 0 and data["results"][0]["cached"] is True
    name = data["results"][0]["name"]
    r3 = run("inspect", name[:40], "--json", "--no-sass")
    assert r3.exit_code == 0, r3.output
    info = json.loads(r3.output)
    assert info["kernels"][0]["local_bytes"] == 0 and info["kernels"][0]["launch"]["threads"] == 128
    rows = json.loads(run("cache", "list", "--json").output)
    assert [row["name"] for row in rows] == [name]
    assert run("cache", "path").output.strip() == str(cache_dir)
    r4 = run("cache", "clear", "--yes")
    assert r4.exit_code == 0 and "removed 1 entries" in r4.output


def test_inspect_shows_sass(cache_dir):
    from fusegemm.runtime import disasm
    run("build", "gemm_amax", "--arch", "sm_100a", "-j", "1", "--variant", "c_dtype=float32")
    r = run("inspect", "gemm_amax.e4m3", "--top", "500")
    assert r.exit_code == 0, r.output
    assert "registers=" in r.output and "local(spills)=0 B" in r.output
    if disasm.available():
        assert "UTMALDG" in r.output and "SASS:" in r.output


def test_inspect_unknown_exit_1(cache_dir):
    r = run("inspect", "nothing-like-this")
    assert r.exit_code == 1 and "no cached kernel matches 'nothing-like-this'" in r.output


def test_build_failure_exit_1(cache_dir, monkeypatch):
    from fusegemm.generator import render as rmod
    real = rmod.render

    def broken(v):
        s = real(v)
        return rmod.Source(v, s.name, s.symbol, s.text + "\n#error deliberately broken\n", s.digest, s.template)
    monkeypatch.setattr(rmod, "render", broken)
    monkeypatch.setattr("fusegemm.build.render", broken)
    r = CliRunner().invoke(main, ["build", "gemm_amax", "--arch", "sm_90a", "-j", "1",
                                  "--variant", "c_dtype=float16"])
    assert r.exit_code == 1
    assert "0 built (0 cached), 1 failed" in r.output and "deliberately broken" in r.output
