"""Generated documentation pages: one per spec (its support surface from the spec and the
registry, its epilogue, constraints and defaults), the CLI reference (from click) and the
configuration reference (from runtime/config.py). ``fusegemm docs OUT`` writes them; the
mkdocs site (mkdocs.yml, docs/) includes them, so a changed spec, command or variable changes
its page with nothing written by hand.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .describe import code_list, constraint_text, declared_values

# The public spellings of each packaged spec's op (the spec-driven ones run through EpilogueGemm).
SEED_API = {
    "grouped_gemm": ("fusegemm.grouped_gemm", "fusegemm.GroupedGemm", "fusegemm.torch_library.grouped_gemm",
                     "fusegemm.reference.grouped_gemm"),
    "grouped_gemm_srelu": ("fusegemm.grouped_gemm_srelu", "fusegemm.GroupedGemmSrelu",
                           "fusegemm.torch_library.grouped_gemm_srelu", "fusegemm.reference.grouped_gemm_srelu"),
    "grouped_gemm_quant": ("fusegemm.grouped_gemm_quant", "fusegemm.GroupedGemmQuant",
                           "fusegemm.torch_library.grouped_gemm_quant", "fusegemm.reference.grouped_gemm_quant"),
    "grouped_gemm_dswiglu": ("fusegemm.grouped_gemm_dswiglu", "fusegemm.GroupedGemmDswiglu",
                             "fusegemm.torch_library.grouped_gemm_dswiglu",
                             "fusegemm.reference.grouped_gemm_dswiglu"),
    "gemm_amax": ("fusegemm.gemm_amax", "fusegemm.GemmAmax", "fusegemm.torch_library.gemm_amax",
                  "fusegemm.reference.gemm_amax"),
}


def surface_rows(info: dict[str, Any]) -> list[tuple[str, str, dict[str, str]]]:
    """(axis, declared values, {arch: implemented values and why}) for every declared axis."""
    rows = []
    for axis, declared in info["choices"].items():
        if axis == "arch":
            continue
        per_arch = {}
        for arch, impl in info["implementations"].items():
            if impl["status"] == "none" or "limits" not in impl:
                per_arch[arch] = "—"
                continue
            lims = [l for l in impl["limits"] if l["axis"] == axis]
            if not lims:
                per_arch[arch] = "all"
            else:   # a conditional limit names its condition (cluster_m: 1 with scheduler=dynamic)
                per_arch[arch] = "; ".join(
                    f"{code_list([v for v in declared if v in lim['values']]) or 'none'}{lim['condition']} "
                    f"({lim['because']})" for lim in lims)
            for u in impl.get("unexecuted", ()):   # a mode no GPU has run: first-run gated
                if u["axis"] == axis:
                    per_arch[arch] += f"; `{u['value']}` not yet run on a GPU, first-run gated ({u['because']})"
        rows.append((axis, declared_values(axis, declared), per_arch))
    return rows


# Shapes of an epilogue input by its ``per`` (M rows of A, N accumulator columns, L experts).
_INPUT_SHAPES = {"expert": "(L,)", "row": "(M,)", "scalar": "(1,) tensor or a Python number",
                 "column": "(N, L)", "element": "(M, N)"}


def _input_needs(spec: Any) -> dict[str, str]:
    """For each epilogue input: "required", or the axis values under which the resolved epilogue
    reads it (norm_const: only with an FP8 D), over the spec's epilogue-axis combinations."""
    import itertools

    from .generator.axes import NEUTRAL
    from .generator.epilogue import EPILOGUE_AXES
    from .generator.variants import check_choice
    offered = spec.choice_map
    axes = [a for a in EPILOGUE_AXES if a in offered and len(offered[a]) > 1]
    seen: dict[str, list[tuple[dict[str, Any], bool]]] = {i.name: [] for i in spec.epilogue.inputs}
    for values in itertools.product(*(offered[a] for a in axes)):
        combo = dict(zip(axes, values))
        choice = {**NEUTRAL, **dict(spec.defaults), **combo}
        if check_choice(choice, spec.constraints) is not None:
            continue
        read = {i.name for i in spec.epilogue.resolve(choice).inputs}
        for name in seen:
            seen[name].append((combo, name in read))
    out = {}
    for name, rows in seen.items():
        if all(r for _, r in rows):
            out[name] = "required"
            continue
        for a in axes:        # read exactly for some values of one axis, whatever the others are
            yes = {c[a] for c, r in rows if r}
            if yes and not any(c[a] in yes and not r for c, r in rows):
                out[name] = f"read, so required, when {_when({a: sorted(yes, key=str)})}"
                break
        else:
            out[name] = "required where the variant reads it" if any(r for _, r in rows) else "not read"
    return out


def _prebuild_lines(spec: Any) -> list[str]:
    """One line per prebuilt kernel: its name, and the variant's where they differ."""
    from .describe import prebuild_kernels
    lines = []
    for name, variant in prebuild_kernels(spec):
        line = f"- `{name}`" + (f" (variant `{variant}`)" if name != variant else "")
        if line not in lines:
            lines.append(line)
    return lines


def _when(cond: dict[str, Any]) -> str:
    """``{axis: [values]}`` as ``axis = v`` / ``axis ∈ {a, b}``."""
    return " and ".join(f"`{k} = {v[0]}`" if len(v) == 1 else f"`{k}` ∈ {{{', '.join(map(str, v))}}}"
                        for k, v in ((k, list(v) if isinstance(v, (list, tuple)) else [v]) for k, v in cond.items()))


def _output_value(o: dict[str, Any]) -> str:
    """An output's value: its expression, or a paired output's role -> expression per block."""
    if o.get("paired"):
        return "; ".join(f"{role} blocks ← `{expr}`" for role, expr in o["paired"].items())
    return f"`{o['value']}`"


def _python_defaults(name: str, defaults: dict[str, Any]) -> list[str]:
    """Wrapper defaults (the seed API's) that differ from the spec's defaults."""
    import importlib
    import inspect
    api = SEED_API.get(name)
    if not api:
        return []
    mod, _, fn = api[0].rpartition(".")
    try:
        sig = inspect.signature(getattr(importlib.import_module(mod), fn))
    except (ImportError, AttributeError, ValueError):   # pragma: no cover - the package's own names
        return []
    out = []
    for axis, value in defaults.items():
        p = sig.parameters.get(axis)
        if p is not None and p.default not in (None, inspect.Parameter.empty) and str(p.default) != str(value):
            out.append(f"`{axis}={p.default!r}`")
    return out


def op_page(spec: Any) -> str:
    """The markdown page of one spec (a Spec, a packaged name or a YAML path)."""
    from .describe import spec_info
    from .generator.spec import Spec, find_spec
    s = spec if isinstance(spec, Spec) else find_spec(str(spec))
    info = spec_info(s)
    archs = list(info["implementations"])
    out = [f"# {info['name']}", "", info["summary"] or "", "",
           f"Spec `{Path(info['path']).name}` · kernel family `{info['kernel']}` · problem `{info['problem']}`"
           + (f" · follows cuDNN frontend's API page {info['seed'].split('_')[0]} (see "
              "[Porting from cuDNN frontend](../porting.md))" if info.get("seed") else ""), ""]
    api = SEED_API.get(info["name"])
    out += ["## Calling it", ""]
    if api:
        wrapper, cls, custom, ref = api
        out += [f"- wrapper: `{wrapper}` · class API: `{cls}` · torch custom op: `{custom}`",
                f"- numpy reference (any machine): `{ref}`", "- parameters: see the [API reference](../../api.md)", ""]
    elif s.problem == "kgrouped":
        out += [f"- `fusegemm.KGroupedGemm({info['name']!r}, **choices)(dy, x, padded_offsets, inputs=...)`: "
                "dy (T, M) and x (T, N) token-major, the output (L, M, N)",
                "- its numpy reference: `KGroupedGemm(...).reference(...)`", ""]
    else:
        out += [f"- `fusegemm.EpilogueGemm({info['name']!r}, **choices)(a, padded_offsets, b, inputs=...)`, or "
                f"`fusegemm.torch_library.epilogue_gemm({info['name']!r}, ...)` inside torch.compile",
                "- its numpy reference: `EpilogueGemm(...).reference(...)`", ""]
    out += ["## Support surface", "",
            "Declared: what the spec allows. Per arch: what that arch's kernel builds (registry), and why "
            "it stops where it does.", "",
            "| axis | declared | " + " | ".join(archs) + " |", "|---|---|" + "---|" * len(archs)]
    for axis, declared, per_arch in surface_rows(info):
        out.append(f"| `{axis}` | {declared} | " + " | ".join(per_arch[a] for a in archs) + " |")
    out += ["", "| arch | status | kernel | defaults |", "|---|---|---|---|"]
    for arch, impl in info["implementations"].items():
        defaults = ", ".join(f"{k}={v}" for k, v in impl.get("defaults", {}).items()) or "—"
        out.append(f"| `{arch}` | {impl['status']} | `{impl.get('kernel', '—')}` | {defaults} |")
    ep = info["epilogue"]
    needs = _input_needs(s)
    out += ["", "## Epilogue", ""]
    if ep["inputs"]:
        out += ["| input | per | shape | dtype | default |", "|---|---|---|---|---|"]
        for name, i in ep["inputs"].items():
            shape = _INPUT_SHAPES.get(i["per"], "—")
            if i["per"] == "element" and i.get("paired"):
                shape = "(M, 2N): gate/up 32-column blocks for each of the accumulator's N columns"
            need = needs.get(name, "required")
            out.append(f"| `{name}` | {i['per']} | {shape} | `{i['dtype']}` | "
                       f"{i['default'] if i['default'] is not None else f'— ({need})'} |")
        out.append("")
    out += ["```", *ep["compute"], "```", "", "| output | dtype | value | quantized |", "|---|---|---|---|"]
    for name, o in ep["outputs"].items():
        when = f"; when {_when(o['when'])}" if o.get("when") else ""
        out.append(f"| `{name}` | `{o['dtype']}` | {_output_value(o)}{when} | {'yes' if o['quantize'] else 'no'} |")
    for r in ep["reductions"]:
        scope = "over the whole output" if r["scope"] == "global" else f"per {r['scope']}"
        start = ("an expert without rows gives -inf" if r["kind"] == "amax" and r["scope"] == "expert"
                 else "starts at 0; a new tensor per call" if r["kind"] == "sum" else "")
        out.append(f"\nReduction `{r['name']}[{r['slot']}]`: {r['kind']} of `{r['of']}` {scope}"
                   + (f" when {_when(r['when'])}" if r["when"] else "") + (f" ({start})" if start else ""))
    out += ["", "## Constraints", ""]
    out += [f"- {constraint_text(c)}" for c in info["constraints"]] or ["none"]
    differ = _python_defaults(info["name"], info["defaults"])
    out += ["", "## Defaults and prebuilt variants", "",
            "Defaults (the variant built when a choice is not given): "
            + (", ".join(f"`{k}={v}`" for k, v in info["defaults"].items()) or "none"), ""]
    if differ:
        out += [f"The Python wrapper keeps the seed API's own defaults where they differ: {', '.join(differ)}. "
                "A call that leaves them out gets those; where they conflict with the operands (FP8 A/B need "
                "`sf_vec_size=32`), pass the value: the error names it.", ""]
    out += [
            "`fusegemm build` prebuilds these kernels (the names `fusegemm inspect` takes; a kernel is named after "
            "the axes that reach its source, so variants that differ only elsewhere share it):", "",
            *_prebuild_lines(s), ""]
    return "\n".join(out)


def cli_page(main: Any) -> str:
    """Every command's ``--help``, from click.

    Parameters
    ----------
    main : click.Group
        The ``fusegemm`` command (fusegemm/cli.py's ``main``, which passes itself: the CLI sits
        above this module, so it hands its command tree in).
    """
    import click

    out = ["# Command line", "", "`fusegemm --help` and each command's `--help`, as the installed CLI prints them.", "",
           "Kernel names (`fusegemm build` prints them, `fusegemm inspect` and `fusegemm cache list` take them): the "
           "spec, the values of the axes that reach the kernel's source, the tile and the arch, then a hash of the "
           "source. Variants that differ only in other axes (the cluster shape, a launch attribute) share one "
           "kernel; the op pages list each prebuilt kernel's name. Every command exits non-zero on failure; usage "
           "errors exit 2; `selftest` and `tune` exit 3 where there is no GPU.", ""]
    def add(cmd: click.Command, path: str) -> None:
        out.extend([f"## {path}", "", "```text", cmd.get_help(click.Context(cmd, info_name=path)), "```", ""])
        if isinstance(cmd, click.Group):
            for sub in sorted(cmd.commands):
                add(cmd.commands[sub], f"{path} {sub}")

    out.extend(["## fusegemm", "", "```text", main.get_help(click.Context(main, info_name="fusegemm")), "```", "",
                "`fusegemm --version` prints the installed version.", ""])
    for name in sorted(main.commands):
        add(main.commands[name], f"fusegemm {name}")
    return "\n".join(out)


def config_page() -> str:
    """Every ``FUSEGEMM_*`` variable, from runtime/config.py."""
    from .runtime.config import VARS
    out = ["# Configuration", "", "Every variable fusegemm reads, as `runtime/config.py` declares it "
           "(a bad value raises ConfigError naming the variable).", "",
           "| variable | default | allowed | meaning |", "|---|---|---|---|"]
    for v in VARS.values():
        default = "(unset)" if v.default is None else "(empty)" if v.default == "" else f"`{v.default}`"
        out.append(f"| `{v.name}` | {default} | {v.allowed} | {v.doc} |")
    return "\n".join(out) + "\n"


def write_pages(out: Path, cli: Any) -> list[Path]:
    """Write the generated pages under ``out``: ``ops/NAME.md``, ``cli.md``, ``configuration.md``,
    ``porting.md`` and, from a source checkout, ``guide/*.md`` (README sections).

    Parameters
    ----------
    out : pathlib.Path
        The folder written.
    cli : click.Group
        The ``fusegemm`` command, whose help ``cli.md`` prints (see :func:`cli_page`).
    """
    from .generator.spec import list_specs, load_spec
    out = Path(out)
    (out / "ops").mkdir(parents=True, exist_ok=True)
    written = []
    for s in map(load_spec, list_specs()):
        p = out / "ops" / f"{s.name}.md"
        p.write_text(op_page(s))
        written.append(p)
    from .base.package import package_data_dir
    readme = Path(package_data_dir("templates")).parent / "README.md"
    pages = {"cli.md": cli_page(cli), "configuration.md": config_page(), "porting.md": porting_page()}
    if readme.is_file():    # a source checkout (the site is built from one); a wheel has no README file
        pages.update({f"guide/{k}": v for k, v in guide_pages(readme.read_text()).items()})
    for name, text in pages.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
        written.append(out / name)
    return written


# Site pages taken from README sections (the README stays the one place they are written).
GUIDE = {
    "status.md": ("What runs where", ["What runs where (read this)"]),
    "performance.md": ("Performance", ["Measured (H200, this repo's bench/ and tests/gpu)",
                                       "Tuning the launch configuration (`fusegemm tune`)",
                                       "Compile time and host overhead", "Block-scaled ops (seeds 000, 002, 003, 004)"]),
    "epilogues.md": ("Epilogues in YAML", ["Specs", "Epilogues in YAML (no C++)"]),
    "frameworks.md": ("PyTorch, JAX and training", ["In PyTorch: torch.compile and CUDA graphs",
                                                    "JAX, CuPy and other DLPack producers",
                                                    "MoE expert MLP (training, BF16, MXFP8 and blockwise FP8) and expert parallelism"]),
    "deployment.md": ("Caches, bundles and CUDA stacks", ["Kernel cache", "Kernel bundles: a cluster that never compiles",
                                                          "Install: CUDA 12.9 or CUDA 13 pip stacks", "Toolchain"]),
    "reliability.md": ("Reliability", ["Reliability: hostile input"]),
}


def readme_sections(readme: str) -> dict[str, str]:
    """``{title: body}`` of the README's ``## `` sections (code fences respected)."""
    out: dict[str, str] = {}
    title, body, fence = None, [], False
    for line in readme.splitlines():
        if line.startswith("```"):
            fence = not fence
        if not fence and line.startswith("## "):
            if title is not None:
                out[title] = "\n".join(body).strip() + "\n"
            title, body = line[3:].strip(), []
        elif title is not None:
            body.append(line)
    if title is not None:
        out[title] = "\n".join(body).strip() + "\n"
    return out


def guide_pages(readme: str) -> dict[str, str]:
    """The site's guide pages (GUIDE) from the README's text; KeyError names a missing section."""
    sections = readme_sections(readme)
    pages = {}
    for name, (title, wanted) in GUIDE.items():
        missing = [w for w in wanted if w not in sections]
        if missing:
            raise KeyError(f"README has no section {missing[0]!r} (docsgen.GUIDE names it)")
        parts = [f"# {title}", ""]
        for w in wanted:
            # a page of one section: its title is the page's (no second heading saying the same)
            parts += ([] if len(wanted) == 1 else [f"## {w}", ""]) + [
                sections[w].replace("\n### ", "\n#### ").replace("\n## ", "\n### "), ""]
        pages[name] = "\n".join(parts)
    return {name: _link_sections(text, name) for name, text in pages.items()}


def _slug(title: str) -> str:
    """The anchor mkdocs gives a heading (Python-Markdown's toc slugify)."""
    import re
    import unicodedata
    value = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", value).strip().lower())


def _link_sections(text: str, page: str) -> str:
    """``see "Title"`` (the README naming one of its sections) as a link to where the site put it."""
    import re
    where = {}
    for name, (title, wanted) in GUIDE.items():
        for w in wanted:
            where[w] = (name, "" if len(wanted) == 1 else "#" + _slug(w))

    def link(m: "re.Match[str]") -> str:
        said = m.group(1)
        hit = next(((w, loc) for w, loc in where.items() if w.startswith(said)), None)
        if hit is None:
            return m.group(0)
        target, anchor = hit[1]
        return f'see [{said}]({"" if target == page and anchor else target}{anchor})'
    text = re.sub(r'see "([^"]+)"', link, text)
    # The README names the site's hand-written pages by path; on the site they are links.
    return re.sub(r"`?docs/(index|concepts|examples|api)\.md`?", lambda m: f"[{m.group(1)}](../../{m.group(1)}.md)", text)


def porting_page() -> str:
    """cuDNN frontend's names and their fusegemm equivalents, from fusegemm.compat."""
    from . import compat
    out = ["# Porting from cuDNN frontend", "",
           "`fusegemm.compat` spells the seed APIs as cuDNN frontend does, so code written against the "
           "seed pages switches by changing one import: `from fusegemm import compat as cudnn`. The same "
           "call runs the sm_90a kernel on Hopper and the sm_100a kernel on Blackwell.", "",
           "| cuDNN frontend | fusegemm | seed op page |", "|---|---|---|"]
    for name in compat.__all__:
        obj = getattr(compat, name)
        public = f"fusegemm.{obj.__name__}"
        op = next((spec for spec, api in SEED_API.items() if public in api), None)
        out.append(f"| `cudnn.{name}` | `{public}` | " + (f"[{op}](ops/{op}.md)" if op else "—") + " |")
    return "\n".join(out) + "\n"
