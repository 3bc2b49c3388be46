"""The generated documentation (fusegemm/docsgen.py, `fusegemm docs`) and the docs' examples.

Op pages come from the spec and the registry (a changed spec changes its page); the CLI and
configuration pages from click and runtime/config.py; the getting-started page's CPU example
runs here (its GPU half in tests/gpu/test_docs_gpu.py). CI also builds the site with
``mkdocs build --strict`` (.ci/run)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from fusegemm import docsgen
from fusegemm.generator.spec import find_spec, list_specs, load_spec
from fusegemm.runtime.config import VARS

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S)


@pytest.mark.parametrize("path", list_specs(), ids=lambda p: p.stem)
def test_every_declared_axis_has_a_surface_row(path):
    s = load_spec(path)
    page = docsgen.op_page(s)
    for axis, values in s.choices:
        if axis != "arch":
            row = next(line for line in page.splitlines() if line.startswith(f"| `{axis}` |"))
            assert all(f"`{v}`" in row for v in values), row
    assert page.startswith(f"# {s.name}\n")


def test_an_arch_limit_shows_what_is_kept_and_why():
    page = docsgen.op_page("grouped_gemm_srelu")
    row = next(line for line in page.splitlines() if line.startswith("| `ab_dtype` |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # sm_100a builds every A/B format, and gathers FP8 rows only
    assert cells[2].startswith("`float8_e4m3fn`, `float8_e5m2` with a_gather=True (gathered A on sm_100a: FP8")
    assert cells[3].startswith("`float8_e4m3fn`, `float8_e5m2` (MXFP8 only")


def test_editing_a_spec_changes_its_page(tmp_path):
    src = Path(find_spec("grouped_gemm_swiglu").path).read_text()
    edited = src.replace("d_dtype: [float8_e4m3fn, float8_e5m2, bfloat16]", "d_dtype: [float8_e4m3fn, bfloat16]")
    # (and the 1x128 constraint's FP8 list, which may name only offered values)
    edited = edited.replace("then: {d_dtype: [float8_e4m3fn, float8_e5m2], tile_n",
                            "then: {d_dtype: [float8_e4m3fn], tile_n")
    edited = edited.replace("    - h = silu(gate) * up * prob", "    - h = silu(gate) * up * prob * 2")
    assert edited != src
    path = tmp_path / "grouped_gemm_swiglu.yaml"
    path.write_text(edited)
    before, after = docsgen.op_page("grouped_gemm_swiglu"), docsgen.op_page(load_spec(path))
    assert "`float8_e5m2`" in before and "`float8_e5m2`" not in after
    assert "h = silu(gate) * up * prob * 2" in after and "h = silu(gate) * up * prob * 2" not in before


def test_cli_and_configuration_pages_are_complete():
    from fusegemm.cli import main
    cli = docsgen.cli_page(main)
    for name, cmd in main.commands.items():
        assert f"## fusegemm {name}\n" in cli
        for sub in getattr(cmd, "commands", {}):
            assert f"## fusegemm {name} {sub}\n" in cli
    conf = docsgen.config_page()
    assert all(f"| `{name}` |" in conf for name in VARS)


def test_the_docs_command_writes_every_page(tmp_path):
    from fusegemm.cli import main
    res = CliRunner().invoke(main, ["docs", str(tmp_path / "gen")])
    assert res.exit_code == 0, res.output
    names = sorted(p.relative_to(tmp_path / "gen").as_posix() for p in (tmp_path / "gen").rglob("*.md"))
    assert names == sorted(["cli.md", "configuration.md", "porting.md"] + [f"ops/{p.stem}.md" for p in list_specs()]
                           + [f"guide/{g}" for g in docsgen.GUIDE])
    nav = (ROOT / "mkdocs.yml").read_text()
    assert all(f"generated/{n}" in nav for n in names), "mkdocs.yml's nav misses a generated page"


def cpu_blocks(page: str) -> list[str]:
    """The python blocks of the page's sections whose heading says "on any machine", in order."""
    text = (ROOT / "docs" / page).read_text()
    return [block for heading, body in re.findall(r"^## (.*?)\n(.*?)(?=^## |\Z)", text, re.S | re.M)
            if "any machine" in heading for block in re.findall(r"```python\n(.*?)```", body, re.S)]


@pytest.mark.parametrize("page", ["index.md", "examples.md", "run-a-spec.md"])
def test_cpu_examples_run(page):
    """Every python block under an "on any machine" heading runs here, in one namespace as a
    reader would run them (the GPU blocks run in tests/gpu/test_docs_gpu.py)."""
    blocks = cpu_blocks(page)
    assert blocks and blocks[0] == python_blocks(page)[0]
    scope: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/{page} (block {i})", "exec"), scope)


def test_guide_pages_are_the_readme_sections():
    readme = (ROOT / "README.md").read_text()
    sections = docsgen.readme_sections(readme)
    pages = docsgen.guide_pages(readme)
    for name, (title, wanted) in docsgen.GUIDE.items():
        assert pages[name].startswith(f"# {title}\n")
        for w in wanted:
            first = next(line for line in sections[w].splitlines() if line.strip())
            assert first in pages[name], (name, w)
    with pytest.raises(KeyError, match="README has no section 'Kernel cache'"):
        docsgen.guide_pages(readme.replace("## Kernel cache\n", "## Kernel caches\n"))


def test_porting_page_names_every_compat_spelling():
    from fusegemm import compat
    page = docsgen.porting_page()
    for name in compat.__all__:
        assert f"| `cudnn.{name}` | `fusegemm.{getattr(compat, name).__name__}` |" in page


def test_spec_op_without_a_gpu_names_the_arch_argument(monkeypatch):
    """EpilogueGemm(spec) on a machine without a driver (simulated): a fusegemm error saying to
    pass arch=, not the driver loader's exception; with arch= the reference runs."""
    import fusegemm
    import fusegemm.runtime.load as load
    from fusegemm.base.errors import UnsupportedError

    def no_driver(device):
        raise OSError('"cuda" is an NVIDIA driver library and can only be found via system search')
    monkeypatch.setattr(load, "ensure_context", no_driver)
    with pytest.raises(UnsupportedError, match=r"no CUDA device 0 to take the arch from \(OSError: .*pass arch='sm_90a'"):
        fusegemm.EpilogueGemm("grouped_gemm_swiglu", d_dtype="bfloat16")
    assert fusegemm.EpilogueGemm("grouped_gemm_swiglu", arch="sm_90a", d_dtype="bfloat16").arch == "sm_90a"


def test_docs_hook_turns_sphinx_roles_into_code():
    import importlib.util
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    html = ("As for :func:<code>~fusegemm.reference.grouped_gemm_srelu</code>; "
            ":class:<code>fusegemm.moe.ExpertMLP</code> and <code>:plain</code>")
    assert hooks.on_page_content(html) == ("As for <code>grouped_gemm_srelu</code>; "
                                           "<code>fusegemm.moe.ExpertMLP</code> and <code>:plain</code>")


def test_the_complete_spec_in_the_docs_validates_and_runs(tmp_path):
    """The README's (Epilogues page's) complete spec file, as a user would save it: it loads,
    its reference runs on the CPU, and a spec without tiles is refused with a spec error."""
    import numpy as np

    import fusegemm
    from fusegemm.base.errors import ArgumentError, SpecError
    text = next(b for b in re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
                if "name: my_gelu" in b)
    path = tmp_path / "my_gelu.yaml"
    path.write_text(text)
    assert load_spec(path).name == "my_gelu"
    op = fusegemm.EpilogueGemm(str(path), arch="sm_90a")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 64)).astype(np.float32)
    b = rng.standard_normal((1, 128, 64)).astype(np.float32) / 8
    import ml_dtypes
    out = op.reference(a.astype(ml_dtypes.bfloat16), np.array([256], np.int32), b.astype(ml_dtypes.bfloat16),
                       inputs={"alpha": np.ones(1, np.float32)})
    g = a.astype(ml_dtypes.bfloat16).astype(np.float64) @ b[0].astype(ml_dtypes.bfloat16).astype(np.float64).T
    want = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
    assert np.allclose(np.asarray(out["d"], np.float32), want, rtol=2e-2, atol=2e-2)
    # An input name the spec does not declare is refused, as the GPU call refuses it (issue 32, probe 9).
    with pytest.raises(ArgumentError, match=r"^inputs\['alhpa'\]: got given; allowed: the epilogue's inputs: alpha"):
        op.reference(a.astype(ml_dtypes.bfloat16), np.array([256], np.int32), b.astype(ml_dtypes.bfloat16),
                     inputs={"alhpa": np.ones(1, np.float32)})
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith(("tile_", "cluster_"))]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SpecError, match=r"choices: missing tile_m, tile_n, cluster_m, cluster_n"):
        load_spec(path)
