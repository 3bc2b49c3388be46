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
    rows = {(row["name"], row["arch"]): row for row in json.loads(r.output)}
    assert sorted({name for name, _ in rows}) == ["gemm_amax", "grouped_gemm", "grouped_gemm_dglu",
                                                  "grouped_gemm_dglu_mx", "grouped_gemm_dsrelu",
                                                  "grouped_gemm_dsrelu_mx", "grouped_gemm_dswiglu",
                                                  "grouped_gemm_dswiglu_bf16",
                                                  "grouped_gemm_glu", "grouped_gemm_glu_mx", "grouped_gemm_quant",
                                                  "grouped_gemm_srelu", "grouped_gemm_swiglu", "grouped_gemm_wgrad",
                                                  "grouped_gemm_wgrad_fp8"]
    # declared and implemented side by side: sm_90a implements tile M 64/128 without clusters
    # (1 tile of 3, 1 cluster of 9 of the declared grouped_gemm surface)...
    g90, g100 = rows[("grouped_gemm", "sm_90a")], rows[("grouped_gemm", "sm_100a")]
    # sm_100a implements all of it (N-major B and scattered outputs included) but gathered A in
    # clusters beyond a 2-CTA tile's pair (its gather4 loads fill each CTA's own stage), the
    # stream-K scheduler and the stored gathered A (the sm_90a kernel's)
    from fusegemm.generator.spec import find_spec
    from fusegemm.generator.variants import surface
    sm90_only = sum(c["scheduler"] == "streamk" or c["a_gather_store"]
                    or c["a_gather"] and c["cluster_n"] * c["cluster_m"] > (2 if c["tile_m"] == 256 else 1)
                    for c in surface(find_spec("grouped_gemm"), "sm_100a"))
    assert g90["declared"] == g100["declared"] == g100["implemented"] + sm90_only and sm90_only > 0
    assert g90["status"] == "implemented" and 0 < g90["implemented"] < g90["declared"]
    # ... and the sm_90a block-scaled kernels implement part of each fused op (MXFP8 and the
    # blockwise recipe, K-major, tile M 128, 1x1 clusters, gathered A with the blockwise recipe);
    # on sm_100a the fused ops implement their whole surface but the blockwise recipe (FP32 scales
    # per 128 K; its E8M0 scales run as MX, counted here as declared 128) and gathered A beyond FP8
    # K-major rows in 1-CTA tiles without clusters.
    for fused in ("grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu"):
        r90 = rows[(fused, "sm_90a")]
        assert r90["status"] == "implemented" and 0 < r90["implemented"] < r90["declared"]

    def sm100_gathers(c):
        return (c["ab_dtype"] in ("float8_e4m3fn", "float8_e5m2") and c["tile_m"] in (64, 128) and
                c["cluster_m"] == c["cluster_n"] == 1 and c["a_major"] == "k")

    for fused in ("grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu"):
        r100 = rows[(fused, "sm_100a")]
        sm90_only = sum(c["sf_vec_size"] == 128 or (c["a_gather"] and not sm100_gathers(c))
                        for c in surface(find_spec(fused), "sm_100a"))
        assert sm90_only > 0
        assert r100["status"] == "implemented" and r100["implemented"] == r100["declared"] - sm90_only > 0


def test_list_text_names_status():
    r = run("list")
    assert r.exit_code == 0
    assert any(line.split()[:4] == ["grouped_gemm_srelu", "grouped", "sm_90a", "implemented"]
               for line in r.output.splitlines())


def test_show_text_and_json():
    r = run("show", "grouped_gemm")
    assert r.exit_code == 0 and "g = alpha * acc" in r.output and "prebuild:" in r.output
    info = json.loads(run("show", "grouped_gemm_srelu", "--json").output)
    assert info["choices"]["sf_vec_size"] == [16, 32, 128]
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
    # declared by the spec, not implemented by the sm_90a kernel (registry limits)
    r = run("generate", "grouped_gemm", "--arch", "sm_90a", "--variant", "tile_m=256", "--variant",
            "cluster_m=2", "-o", str(tmp_path))
    assert r.exit_code == 1
    assert "Error: tile_m=256 is not implemented for grouped_gemm on sm_90a; implemented: 64, 128" in r.output


def test_variant_axis_must_reach_the_kernel(tmp_path):
    r = run("generate", "grouped_gemm_srelu", "--arch", "sm_100a", "--variant", "b_major=k",
            "-o", str(tmp_path))
    assert r.exit_code == 0, r.output                      # the sm_100a kernel: b_major reaches it
    # the sm_90a kernel implements K-major B only: the limit says so (not "does not reach")
    r = run("generate", "grouped_gemm_srelu", "--arch", "sm_90a", "--variant", "b_major=k",
            "-o", str(tmp_path))
    assert r.exit_code == 0, r.output
    r = run("generate", "grouped_gemm_srelu", "--arch", "sm_90a", "--variant", "b_major=n",
            "--variant", "weight_mode=discrete", "-o", str(tmp_path))
    assert r.exit_code == 1
    assert "b_major='n' is not implemented for grouped_gemm_srelu on sm_90a; implemented: k" in r.output
    # an axis the spec offers but no kernel reads is refused by name
    r = run("generate", "grouped_gemm", "--arch", "sm_90a", "--variant", "vector_f32=true", "-o", str(tmp_path))
    assert r.exit_code == 1 and "vector_f32" in r.output, r.output


def test_build_refuses_what_the_arch_does_not_implement(tmp_path):
    """NVFP4 A/B is declared by the spec and implemented on sm_100a; the sm_90a kernel is MXFP8
    only, and the build says so (the axis, what is implemented, why) before compiling anything."""
    nvfp4 = ("--variant", "ab_dtype=float4_e2m1fn_x2", "--variant", "sf_dtype=float8_e4m3fn",
             "--variant", "sf_vec_size=16")
    r = run("generate", "grouped_gemm_srelu", "--arch", "sm_100a", *nvfp4, "-o", str(tmp_path))
    assert r.exit_code == 0, r.output
    r = run("build", "grouped_gemm_srelu", "--arch", "sm_90a", *nvfp4)
    assert r.exit_code == 1
    assert ("Error: ab_dtype='float4_e2m1fn_x2' is not implemented for grouped_gemm_srelu on sm_90a; "
            "implemented: float8_e4m3fn, float8_e5m2 (MXFP8 only") in r.output


def test_variant_option_mistakes(tmp_path):
    r = run("build", "grouped_gemm", "--all", "--variant", "d_dtype=float32")
    assert r.exit_code == 1 and "--all and --variant: got both" in r.output
    r = run("build", "grouped_gemm", "--variant", "d_dtype=float32", "--variant", "d_dtype=float16")
    assert r.exit_code == 1 and "--variant d_dtype: given twice ('float32' and 'float16')" in r.output
    r = run("generate", "grouped_gemm", "--prebuild", "--variant", "d_dtype=float32", "-o", str(tmp_path))
    assert r.exit_code == 2 and "--prebuild and --variant: got both" in r.output


def test_bad_arch_is_usage_error_exit_2():
    r = run("build", "--arch", "sm_80")
    assert r.exit_code == 2 and "allowed: comma list of sm_100a, sm_90a" in r.output


def test_unknown_command_exit_2():
    assert run("frobnicate").exit_code == 2


def test_build_inspect_cache_roundtrip(cache_dir):
    r = run("build", "gemm_amax", "--arch", "sm_90a", "--variant", "tile_n=128", "-j", "1")
    assert r.exit_code == 0, r.output
    assert "1 built (0 cached), 0 failed" in r.output
    r2 = run("build", "gemm_amax", "--arch", "sm_90a", "--variant", "tile_n=128", "--json")
    data = json.loads(r2.output)
    assert data["failed"] == 0 and data["results"][0]["cached"] is True
    name = data["results"][0]["name"]
    r3 = run("inspect", name[:40], "--json", "--no-sass")
    assert r3.exit_code == 0, r3.output
    info = json.loads(r3.output)
    # the sm_90a block-scaled kernel: a producer warpgroup and two 64-row WGMMA consumer warpgroups
    assert info["kernels"][0]["local_bytes"] == 0 and info["kernels"][0]["contract"]["threads"] == 384
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
    import dataclasses

    from fusegemm import pipeline
    real = pipeline.render

    def broken(v):
        s = real(v)
        return dataclasses.replace(s, text=s.text + "\n#error deliberately broken\n")
    monkeypatch.setattr(pipeline, "render", broken)
    r = CliRunner().invoke(main, ["build", "gemm_amax", "--arch", "sm_100a", "-j", "1",
                                  "--variant", "c_dtype=float16"])
    assert r.exit_code == 1
    assert "0 built (0 cached), 1 failed" in r.output and "deliberately broken" in r.output


# What ptxas printed for a kernel whose WGMMAs it serialized (a rolled loop around the deferred D
# stores of the sm_90a grouped GEMM: 7-20% slower on the H200, and NVRTC succeeded).
C7518 = ("ptxas info    : (C7518) Potential Performance Loss: wgmma.mma_async instructions are "
         "serialized due to program dependence on compiler-inserted WG.DP in divergent path in the "
         "function 'fg_grouped_gemm_sm90a_6cb1fa4f741d'\n")


def test_ptxas_advisories_parsed():
    from fusegemm.runtime.compile import advisories
    assert advisories(C7518) == ("C7518: wgmma.mma_async instructions are serialized due to program "
                                 "dependence on compiler-inserted WG.DP in divergent path",)
    assert advisories("ptxas info    : Used 168 registers, used 1 barriers\n") == ()


def test_ptxas_advisory_reaches_build_cache_and_inspect(cache_dir, monkeypatch):
    """An advisory in the compile log is a warning of `fusegemm build`, stays with the cache
    entry (its meta.json: a later process's lookup and `fusegemm inspect` show it), and is in
    --json."""
    import dataclasses

    from fusegemm import pipeline
    real = pipeline.compile_source

    def noted(*a, **k):
        c = real(*a, **k)
        return dataclasses.replace(c, log=c.log + C7518)
    monkeypatch.setattr(pipeline, "compile_source", noted)
    args = ["build", "gemm_amax", "--arch", "sm_90a", "-j", "1", "--variant", "c_dtype=float32"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "warning: gemm_amax." in r.output and "ptxas C7518: wgmma.mma_async instructions are serialized" in r.output
    monkeypatch.setattr(pipeline, "compile_source", real)
    from fusegemm.runtime.cache import KernelCache
    (entry,) = [e for e in KernelCache(cache_dir, disk=True).entries() if "key" in e]
    assert entry["ptxas_advisories"][0].startswith("C7518: ")
    again = CliRunner().invoke(main, args + ["--json"])   # a cache hit keeps the advisory
    rows = json.loads(again.output)["results"]
    assert [row["cached"] for row in rows] == [True] and rows[0]["advisories"][0].startswith("C7518: ")
    r = run("inspect", "gemm_amax", "--no-sass")
    assert r.exit_code == 0 and "ptxas advisory C7518: wgmma.mma_async" in r.output


# ---- fusegemm validate / show of the schema 2 epilogue ------------------------------------------
USER_SPEC = """\
# A user's op, outside specs/: SwiGLU forward on the BF16 grouped GEMM, FP8 D row-quantized.
schema: 2
name: my_swiglu
kernel: grouped_gemm
problem: grouped
summary: D = prob * silu(G.gate) * G.up
epilogue:
  inputs:
    alpha: {per: expert}
    prob: {per: row, default: 1.0}
    norm_const: {per: scalar}
  pairing: {block: 32, roles: [gate, up], acc: true}
  compute:
    - gate = alpha * acc.gate
    - up = alpha * acc.up
    - h = silu(gate) * up * prob
  outputs:
    d: {dtype: d_dtype, value: h, quantize: {row: true, norm_const: norm_const}}
choices:
  ab_dtype: [bfloat16]
  d_dtype: [float8_e4m3fn, bfloat16]
  tile_m: [128]
  tile_n: [256]
  cluster_m: [1]
  cluster_n: [1]
defaults:
  d_dtype: float8_e4m3fn
"""


def _user_spec(tmp_path, text=USER_SPEC):
    path = tmp_path / "my_swiglu.yaml"
    path.write_text(text)
    return path


def test_validate_good_user_spec(tmp_path):
    path = _user_spec(tmp_path)
    r = run("validate", str(path))
    assert r.exit_code == 0, r.output
    out = r.output
    assert out.startswith(f"my_swiglu  (grouped_gemm, grouped)  {path}: valid\n")
    for line in ("    gate = alpha * acc.gate", "    h = silu(gate) * up * prob",
                 "    prob        row     float32  slot prob        default 1.0 (null pointer)",
                 "  pairing: 32-column blocks, roles gate/up, the accumulator is paired",
                 "    d: d_dtype <- h; quantized when FP8/FP4 (row, norm_const norm_const, convention quant)"):
        assert line in out.splitlines(), line
    for arch in ("sm_100a", "sm_90a"):      # the default variant's rule on every arch
        assert f"rule for {arch} (default variant my_swiglu." in out
    assert out.count("struct Rule {") == 2
    assert "static constexpr bool kPairedAcc = true;" in out and "static constexpr bool kQuantRowD = true;" in out
    assert "const float v_h = __fmul_rn(__fmul_rn(__fmul_rn(v_gate, fusegemm::epi::sigmoid(v_gate)), v_up), " \
           "ri.prob);" in out


def test_validate_broken_spec_exit_1(tmp_path):
    path = _user_spec(tmp_path, USER_SPEC.replace("- h = silu(gate) * up * prob", "- h = silu(gate) * upp * prob"))
    r = run("validate", str(path))
    assert r.exit_code == 1
    assert r.output == (f"Error: {path}:16: epilogue.compute[2]: unknown name 'upp' at column 18 of "
                        f"'h = silu(gate) * upp * prob'; allowed: acc, alpha, gate, norm_const, prob, up\n")
    assert "struct Rule" not in r.output
    r = run("validate", str(tmp_path / "missing.yaml"))
    assert r.exit_code == 1 and f"Error: {tmp_path / 'missing.yaml'}: cannot read spec" in r.output


def test_validate_json_keys(tmp_path):
    r = run("validate", str(_user_spec(tmp_path)), "--json")
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert list(info) == ["name", "path", "kernel", "problem", "valid", "epilogue", "rules"]
    assert info["valid"] is True and info["name"] == "my_swiglu"
    ep = info["epilogue"]
    assert list(ep) == ["inputs", "pairing", "constants", "compute", "outputs", "quantization", "reductions"]
    assert ep["inputs"]["prob"] == {"per": "row", "dtype": "float32", "slot": "prob", "default": 1.0,
                                    "paired": False, "optional": False}
    assert ep["pairing"] == {"block": 32, "roles": ["gate", "up"], "acc": True}
    assert ep["compute"] == ["gate = alpha * acc.gate", "up = alpha * acc.up", "h = silu(gate) * up * prob"]
    assert ep["outputs"]["d"]["value"] == "h" and ep["outputs"]["d"]["quantize"]["row"] is True
    assert ep["quantization"]["outputs"] == ["d"] and ep["reductions"] == []
    assert sorted(info["rules"]) == ["sm_100a", "sm_90a"]
    rule = info["rules"]["sm_100a"]
    assert list(rule) == ["variant", "choices", "traits", "cpp"]
    assert rule["choices"]["d_dtype"] == "float8_e4m3fn" and rule["traits"]["kPairedAcc"] == "true"
    assert rule["cpp"].count("struct Rule {") == 1


def test_validate_broken_spec_json_exit_1(tmp_path):
    path = _user_spec(tmp_path, USER_SPEC.replace("block: 32", "block: 16"))
    r = run("validate", str(path), "--json")
    assert r.exit_code == 1
    assert f"Error: {path}:12: epilogue.pairing.block: got 16; allowed: 32" in r.output


def test_show_prints_the_epilogue_statements():
    r = run("show", "grouped_gemm")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    for st in ("g = alpha * acc", "c = where(present(bias), g + prob * bias, g)",
               "d = where(present(bias), c, prob * g)"):
        assert f"    {st}" in lines, st
    assert "    bias   column  bias_dtype  slot bias   absent when bias_dtype is none" in lines
    assert "    c: c_dtype <- c  when generate_c" in lines
    info = json.loads(run("show", "grouped_gemm_dswiglu", "--json").output)
    ep = info["epilogue"]
    assert ep["compute"][0] == "r = alpha * alpha * acc"
    assert ep["inputs"]["c"]["paired"] is True and ep["inputs"]["c"]["slot"] == "c_in"
    assert ep["outputs"]["d"]["paired"] == {"gate": "dswiglu", "up": "ab"}
    assert [(x["name"], x["slot"]) for x in ep["reductions"]] == [("dprob", 0), ("amax", 0), ("amax", 1)]


# ---------------------------------------------------------------- hostile caches and files (issue 13)


def _one_entry(cache_dir):
    import fusegemm.runtime.cache as kc
    kc._default = None   # a fresh process-wide cache: earlier tests' kernels must not be memory hits
    r = run("build", "grouped_gemm", "--arch", "sm_100a", "--variant", "tile_m=128", "-j", "1")
    assert r.exit_code == 0, r.output
    (entry,) = [d for d in cache_dir.iterdir() if not d.name.startswith(".")]
    return entry


def test_truncated_cubin_is_reported_by_list_and_inspect(cache_dir):
    entry = _one_entry(cache_dir)
    data = (entry / "kernel.cubin").read_bytes()
    (entry / "kernel.cubin").write_bytes(data[:1000])
    r = run("cache", "list")
    assert "corrupted (cubin missing or not matching its size and sha256)" in r.output
    r = run("inspect", "grouped_gemm")
    assert r.exit_code == 1 and "is corrupted (its cubin does not match the size and sha256" in r.output
    import fusegemm.runtime.cache as kc
    kc._default = None   # the next build is a new process: it reads the disk, finds the entry corrupted
    assert run("build", "grouped_gemm", "--arch", "sm_100a", "--variant", "tile_m=128", "-j", "1").exit_code == 0
    # Rebuilt in place (not byte-compared: NVRTC's sm_100a output may differ by a byte between
    # two compiles of one source; the entry's own size and sha256 must match again).
    meta = json.loads((entry / "meta.json").read_text())
    rebuilt = (entry / "kernel.cubin").read_bytes()
    assert len(rebuilt) == meta["cubin_size"] == len(data)
    assert "corrupted" not in run("cache", "list").output


def test_inspect_names_what_is_wrong_with_a_path(cache_dir, tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    r = run("inspect", str(other))
    assert r.exit_code == 1 and "notes.txt: not a cubin (no ELF header)" in r.output
    r = run("inspect", "missing.cubin")
    assert r.exit_code == 1 and "missing.cubin: no such file" in r.output


def test_inspect_without_a_disassembler_prints_the_resources(cache_dir, monkeypatch):
    from fusegemm.base.errors import ToolchainError
    from fusegemm.runtime import disasm
    _one_entry(cache_dir)

    def missing(*a, **k):
        raise ToolchainError("nvdisasm not found: SASS inspection needs the optional disassembler")
    monkeypatch.setattr(disasm, "sass_histogram", missing)
    r = run("inspect", "grouped_gemm")
    assert r.exit_code == 0, r.output
    assert "registers=" in r.output and "SASS skipped: nvdisasm not found" in r.output


def test_cache_clear_reports_what_it_could_not_remove(cache_dir, monkeypatch):
    import os
    _one_entry(cache_dir)

    def refuse(src, dst):
        raise PermissionError(30, "Read-only file system")
    monkeypatch.setattr(os, "rename", refuse)
    r = run("cache", "clear", "--yes")
    assert r.exit_code == 1 and "removed 0 entries" in r.output
    assert "1 entries could not be removed (read-only cache?)" in r.output and "Read-only file system" in r.output


def test_generate_into_an_unwritable_place_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    r = run("generate", "grouped_gemm", "--arch", "sm_90a", "-o", str(blocker / "sub"))
    assert r.exit_code == 1 and f"-o {blocker / 'sub'}: cannot write there" in r.output


def test_a_tile_no_kernel_builds_is_refused_by_the_spec_before_nvrtc(tmp_path, monkeypatch):
    """tile_n 64 is outside the axis vocabulary (every kernel's accumulator is 128 or 256 columns
    wide), so a spec declaring it fails to load, at its line, and nothing compiles."""
    from pathlib import Path

    import fusegemm.runtime.compile as comp
    src = Path(__file__).resolve().parents[2] / "specs" / "grouped_gemm.yaml"
    spec = tmp_path / "grouped_gemm.yaml"
    text = src.read_text()
    spec.write_text(text.replace("tile_n: [128, 256]", "tile_n: [64, 128, 256]"))
    line = text[:text.index("tile_n: [128, 256]")].count("\n") + 1
    monkeypatch.setattr(comp, "compile_source", lambda *a, **k: (_ for _ in ()).throw(AssertionError("compiled")))
    for arch in ("sm_90a", "sm_100a"):
        r = run("build", str(spec), "--arch", arch, "-j", "1")
        assert r.exit_code == 1 and f"grouped_gemm.yaml:{line}: choices.tile_n: got 64; allowed: one of 128, 256" \
            in r.output, r.output


def test_records_beside_the_kernels_are_listed_and_kept_apart(cache_dir):
    """Tuning records and verification passes live in the cache root beside the kernel entries:
    `cache list` neither lists them nor calls them corrupted (it did, as 'meta.json unreadable'),
    `cache clear` keeps them (it deleted them as entries), `cache records` lists them and
    `cache clear --records` deletes them too."""
    from fusegemm import tuning_records
    tuning_records.forget()
    _one_entry(cache_dir)
    bucket = tuning_records.Bucket.of(experts=8, m_rows=4096, n=512, k=512)
    tuning_records.write(tuning_records.record_file("grouped_gemm", "sm_90a", "NVIDIA H200"), bucket.key,
                         {"tile": [64, 256], "dynamic": True, "ms": 0.25, "default_ms": 0.3, "date": "2026-12-01"})
    (cache_dir / "verified").mkdir()
    (cache_dir / "verified" / "grouped_gemm.sm_100a.json").write_text(json.dumps(
        {"family": "grouped_gemm", "arch": "sm_100a", "device": "NVIDIA B200", "fusegemm": "0.1", "cases": 6}))
    (cache_dir / "verified" / "gemm_amax.sm_100a.json").write_text("{broken")
    r = run("cache", "list")
    assert "corrupted" not in r.output and "tuned" not in r.output.split("\n")[2:-2]
    assert "1 entries in" in r.output and "(1 tuning records, 2 verification passes" in r.output
    r = run("cache", "records")
    assert r.exit_code == 0, r.output
    assert f"grouped_gemm  sm_90a  nvidia-h200  {bucket.key}  64x256:dynamic" in r.output
    assert "grouped_gemm  sm_100a  NVIDIA B200" in r.output and "unreadable" in r.output
    data = json.loads(run("cache", "records", "--json").output)
    assert [t["config"] for t in data["tuned"]] == ["64x256:dynamic"] and len(data["verified"]) == 2
    r = run("cache", "clear", "--yes")
    assert "removed 1 entries" in r.output
    assert (cache_dir / "tuned").is_dir() and (cache_dir / "verified").is_dir()
    r = run("cache", "clear", "--yes", "--records")
    assert "removed 3 entries and records" in r.output
    assert not (cache_dir / "tuned").exists() and not (cache_dir / "verified").exists()
    tuning_records.forget()


def test_show_says_what_an_arch_runs_a_value_as():
    """A value an arch's kernel runs as another (the registry's runs_as: vector_f32 on sm_90a)
    is printed beside that arch's limits, with its reason, and is in the JSON."""
    r = run("show", "grouped_gemm_srelu")
    assert r.exit_code == 0, r.output
    sm90 = r.output[r.output.index("  sm_90a: implemented"):r.output.index("prebuild:")]
    assert "    vector_f32=True runs as vector_f32=False (sm_90a has no packed FP32 instructions" in sm90
    sm100 = r.output[r.output.index("  sm_100a: implemented"):r.output.index("  sm_90a: implemented")]
    # sm_100a runs the recipe's E8M0 scales as MX ones (its MXFP8 kernel), at sf_dtype e8m0 only
    assert ("    sf_vec_size=128 runs as sf_vec_size=32 with sf_dtype=float8_e8m0fnu (power-of-two scales "
            "repeated over their 32-K MX blocks") in sm100
    assert "vector_f32=True runs as" not in sm100
    info = json.loads(run("show", "grouped_gemm_srelu", "--json").output)
    # the blockwise recipe's E8M0 scales run as its FP32 ones, at sf_vec_size 128 only
    assert ("    sf_dtype=float8_e8m0fnu runs as sf_dtype=float32 with sf_vec_size=128 (every E8M0 scale is a "
            "power of two") in sm90
    ras = info["implementations"]["sm_90a"]["runs_as"]
    assert ras == [{"axis": "vector_f32", "value": True, "runs_as": False, "because": ras[0]["because"], "when": {},
                    "condition": ""},
                   {"axis": "sf_dtype", "value": "float8_e8m0fnu", "runs_as": "float32", "because": ras[1]["because"],
                    "when": {"sf_vec_size": 128}, "condition": " with sf_vec_size=128"}]


def test_a_ctrl_c_inside_an_import_exits_130():
    """A Ctrl-C that lands while a lazily imported module builds a class reaches the CLI as
    Python 3.11's "RuntimeError: Error calling __set_name__" (from the KeyboardInterrupt): it
    exits 130 like any other interrupt (test_build_interrupt.py met it at random moments); other
    RuntimeErrors propagate."""
    import pytest

    from fusegemm import cli

    class Interrupting:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stop:
        with cli._interrupt_exits_130():
            type("Built", (), {"field": Interrupting()})
    assert stop.value.code == 130
    with pytest.raises(RuntimeError, match="other"):
        with cli._interrupt_exits_130():
            raise RuntimeError("other")
