"""The ``fusegemm`` command: thin click wrappers over library functions.

Every failure becomes a ClickException (message, non-zero exit); ``--json`` prints
machine-readable output on the reporting commands.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import click

from .base import interrupts
from .base.errors import FusegemmError
from .describe import epilogue_info, spec_info

NO_GPU_EXIT = 3   # `fusegemm selftest` with no GPU: nothing verified (neither a pass nor a failure)


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


def _archs(value: str | None) -> tuple[str, ...]:
    from .base.archs import ARCH_NAMES
    from .runtime import config
    if value is None:
        return config.default_archs()
    archs = tuple(a.strip() for a in value.split(",") if a.strip())
    bad = [a for a in archs if a not in ARCH_NAMES]
    if bad or not archs:
        raise click.BadParameter(f"got {value!r}; allowed: comma list of {', '.join(ARCH_NAMES)}",
                                 param_hint="--arch")
    return archs


def _settings_checked(command: Callable[..., Any]) -> Callable[..., Any]:
    """A command that reads FUSEGEMM_* settings checks them all first (runtime/config.py's
    check): a bad value is one error naming it, before any work, never a traceback from
    wherever it is first read."""
    @functools.wraps(command)
    def checked(*args: Any, **kwargs: Any) -> Any:
        from .runtime import config
        try:
            config.check()
        except FusegemmError as exc:
            raise _fail(exc) from None
        return command(*args, **kwargs)
    return checked


def _echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=1, sort_keys=False, default=str))


@contextlib.contextmanager
def _interrupt_exits_130() -> Iterator[None]:
    """A Ctrl-C inside the block exits with 130, the status of a program stopped by SIGINT."""
    try:
        yield
    except KeyboardInterrupt:
        click.echo("\nAborted!", err=True)
        sys.exit(130)
    except RuntimeError as exc:
        # A Ctrl-C while a lazily imported module builds a class: Python 3.11 re-raises it from
        # __set_name__ as "RuntimeError: Error calling __set_name__" (tests/unit/test_build_interrupt.py
        # caught it once in a few hundred interrupts).
        if not isinstance(exc.__cause__, KeyboardInterrupt):
            raise
        click.echo("\nAborted!", err=True)
        sys.exit(130)


class _Cli(click.Group):
    """The command group. A Ctrl-C while click parses the arguments or resolves the command
    exits with 130, as one inside the build does (click's standalone mode would report 1);
    everything else (usage errors, broken pipes, exit codes) stays click's standalone handling."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        # First thing of every command: a Ctrl-C that Python swallows later (an import's
        # cleanup callback, a finalizer) is still recorded, and the build stops at its next step.
        interrupts.install()
        with _interrupt_exits_130():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _interrupt_exits_130():
            return super().invoke(ctx)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fusegemm")
def main() -> None:
    """fusegemm: fused GEMM kernels for MoE training, generated from YAML specs."""


@main.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(as_json: bool) -> None:
    """List the specs: declared and implemented surface per arch, side by side.

    "declared" counts the variants the spec allows; "implemented" those the arch's kernel
    builds (generator/registry.py).
    """
    from .generator import registry
    from .generator.spec import list_specs, load_spec
    from .generator.variants import prebuild_variants, surface
    rows = []
    try:
        for p in list_specs():
            s = load_spec(p)
            for arch in s.choice_map["arch"]:
                row = registry.lookup(s.kernel, arch)
                declared = implemented = 0
                for choice in surface(s, arch):
                    declared += 1
                    implemented += (row is not None and row.problem(choice) is None)
                rows.append({"name": s.name, "kernel": s.kernel, "problem": s.problem, "seed": s.seed,
                             "arch": arch, "status": registry.status(s.kernel, arch),
                             "declared": declared, "implemented": implemented,
                             "prebuild": len(prebuild_variants(s, (arch,))), "path": str(p)})
    except FusegemmError as exc:
        raise _fail(exc) from None
    if as_json:
        return _echo_json(rows)
    _table(["spec", "problem", "arch", "status", "declared", "implemented", "prebuild"],
           [[r["name"], r["problem"], r["arch"], r["status"], r["declared"], r["implemented"],
             r["prebuild"]] for r in rows])


@main.command()
@click.argument("spec")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show(spec: str, as_json: bool) -> None:
    """Show a spec: epilogue, choices, constraints, defaults, prebuild variants, and per arch the
    kernel that implements it (status, limits, defaults, the axes that reach its source)."""
    from .generator import registry
    from .generator.spec import find_spec
    try:
        s = find_spec(spec)
        info = spec_info(s)
    except FusegemmError as exc:
        raise _fail(exc) from None
    impls = info["implementations"]
    if as_json:
        return _echo_json(info)
    click.echo(f"{s.name}  ({s.kernel}, {s.problem})  {s.path}")
    click.echo(f"  {s.summary}")
    _echo_epilogue(s)
    from .describe import constraint_text, declared_values
    plain = lambda text: text.replace("`", "")  # noqa: E731 - the op pages' wording, without markdown
    click.echo("choices (declared):")
    for a, vals in s.choices:
        click.echo(f"  {a}: {plain(declared_values(a, vals))}")
    click.echo("constraints:")
    for c in s.constraints:
        click.echo(f"  {plain(constraint_text({'if': dict(c.when), 'then': dict(c.then), 'because': c.because}))}")
    click.echo("implementations:")
    for arch, impl in impls.items():
        if impl["status"] == registry.NONE:
            click.echo(f"  {arch}: none")
            continue
        click.echo(f"  {arch}: {impl['status']} ({impl['kernel']}, {impl['template']})")
        for lim in impl["limits"]:
            if lim["axis"] in s.choice_map:      # a limit on an axis this spec does not offer says nothing here
                click.echo(f"    {lim['axis']}: {', '.join(map(str, lim['values']))} only{lim['condition']} "
                           f"({lim['because']})")
        for r in impl["runs_as"]:
            if r["axis"] in s.choice_map:
                click.echo(f"    {r['axis']}={r['value']} runs as {r['axis']}={r['runs_as']}{r['condition']} "
                           f"({r['because']})")
        for u in impl["unexecuted"]:
            if u["axis"] in s.choice_map:
                click.echo(f"    {u['axis']}={u['value']} not yet run on a GPU: first-run gated ({u['because']})")
        if impl["defaults"]:
            click.echo(f"    defaults: {', '.join(f'{k}={v}' for k, v in impl['defaults'].items())}")
    # Kernel names (what build prints and inspect takes), with the variant's where it differs.
    click.echo("prebuild:")
    for line in dict.fromkeys(f"  {k}" + (f"  (variant {v})" if v != k else "")
                              for k, v in zip(info["prebuild_kernels"], info["prebuild"])):
        click.echo(line)


@main.command()
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def validate(path: str, as_json: bool) -> None:
    """Parse and type-check the spec file PATH (any folder; or a packaged spec's name) and print
    its epilogue and, for the spec's default variant on each arch, the C++ epilogue rule a
    kernel would instantiate.

    Nothing is compiled. A mistake exits 1 with "file:line: key: message".
    """
    from .generator.emit import rule_model
    from .generator.render import _env
    from .generator.spec import find_spec
    from .generator.variants import make_variant
    try:
        s = find_spec(path)
        rules = {}
        for arch in s.choice_map["arch"]:
            v = make_variant(s, arch=arch)
            model = rule_model(s.epilogue.resolve(v.choices))
            rules[arch] = {"variant": v.readable,
                           "choices": {a: val for a, val in v.choices.items() if a in s.choice_map},
                           "traits": {name: value for name, value in model.traits},
                           "cpp": _env().get_template("rule.cu.j2").render(rule=model, spec=s)}
    except FusegemmError as exc:
        raise _fail(exc) from None
    if as_json:
        return _echo_json({"name": s.name, "path": s.path, "kernel": s.kernel, "problem": s.problem,
                           "valid": True, "epilogue": epilogue_info(s), "rules": rules})
    click.echo(f"{s.name}  ({s.kernel}, {s.problem})  {s.path}: valid")
    _echo_epilogue(s)
    for arch, r in rules.items():
        click.echo(f"rule for {arch} (default variant {r['variant']}):")
        for line in r["cpp"].rstrip("\n").splitlines():
            click.echo(f"  {line}" if line else "")


def _when_text(cond) -> str:
    if not cond.terms:
        return ""
    return "  when " + " and ".join(axis if vals == (True,) else f"{axis} in [{', '.join(map(str, vals))}]"
                                    for axis, vals in cond.terms)


def _echo_epilogue(s) -> None:
    ep = s.epilogue
    click.echo("epilogue:")
    if ep.inputs:
        click.echo("  inputs:")
        rows = []
        for i in ep.inputs:
            notes = []
            if i.default is not None:
                notes.append(f"default {i.default!r} (null pointer)")
            if i.dtype in s.choice_map and "none" in s.choice_map[i.dtype]:
                notes.append(f"absent when {i.dtype} is none")
            if i.paired:
                notes.append("paired")
            rows.append([i.name, i.per, i.dtype, f"slot {i.slot}", ", ".join(notes)])
        widths = [max(len(r[k]) for r in rows) for k in range(4)]
        for r in rows:
            click.echo(("    " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4]).rstrip())
    if ep.pairing is not None:
        p = ep.pairing
        click.echo(f"  pairing: {p.block}-column blocks, roles {p.roles[0]}/{p.roles[1]}"
                   f"{', the accumulator is paired' if p.acc else ''}")
    click.echo("  compute:")
    for st in ep.statements:
        click.echo(f"    {st.text}")
    click.echo("  outputs:")
    for o in ep.outputs:
        value = o.value if o.paired is None else ", ".join(
            f"{role}: {v}" for role, v in zip(ep.pairing.roles, o.paired))
        slot = "" if o.slot == o.name else f" (slot {o.slot})"
        line = f"    {o.name}{slot}: {o.dtype} <- {value}{_when_text(o.when)}"
        q = o.quantize
        if q is not None:
            parts = (["row"] if q.row else []) + ([f"col {q.col}"] if q.col else [])
            line += (f"; quantized when FP8/FP4 ({' + '.join(parts)}, norm_const {q.norm_const}, "
                     f"convention {q.convention})")
        click.echo(line)
    if ep.reductions:
        click.echo("  reductions:")
        for r in ep.reductions:
            scope = "over everything" if r.scope == "global" else f"per {r.scope}"
            click.echo(f"    {r.name}[{r.slot}]: {r.kind} of {r.of} {scope}{_when_text(r.when)}")


@main.command()
@click.argument("spec")
@click.option("--variant", "variant_opts", multiple=True, metavar="AXIS=VALUE",
              help="Override a default choice (repeatable), e.g. --variant d_dtype=float32.")
@click.option("--arch", default=None, help="Comma list of archs (default: FUSEGEMM_ARCHS).")
@click.option("--prebuild", is_flag=True, help="Every prebuild variant instead of the default one.")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for the generated .cu files.")
@_settings_checked
def generate(spec: str, variant_opts: tuple[str, ...], arch: str | None, prebuild: bool,
             out_dir: str) -> None:
    """Write the generated CUDA C++ of a spec's variants to a folder (no compile)."""
    from . import build as b
    from .generator.render import render
    from .generator.variants import parse_variant_options
    try:
        if prebuild and variant_opts:
            raise click.UsageError("--prebuild and --variant: got both; allowed: one of them")
        choices = None if prebuild else parse_variant_options(variant_opts)
        vs, skipped = b.select([spec], _archs(arch), choices=choices)
        _echo_skipped(skipped)
        if not vs:
            raise click.ClickException(f"nothing to generate for {spec}")
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for v in vs:
            src = render(v)
            path = out / f"{src.name}.cu"
            path.write_text(src.text)
            click.echo(str(path))
    except FusegemmError as exc:
        raise _fail(exc) from None
    except OSError as exc:   # -o: missing parent on a read-only mount, no permission, a file...
        raise click.ClickException(f"-o {out_dir}: cannot write there ({exc.strerror or exc})") from None


def _echo_skipped(skipped) -> None:
    """Each (spec, arch) that builds nothing, with its reason (on stderr: the tables stay clean)."""
    for sk in skipped:
        click.echo(f"not built: {sk.spec} on {sk.arch} ({sk.status}): {sk.reason}", err=True)


@main.command("build")
@click.argument("specs", nargs=-1)
@click.option("--arch", default=None, help="Comma list of archs (default: FUSEGEMM_ARCHS).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Parallel compile processes (default: FUSEGEMM_JOBS or CPU count).")
@click.option("--all", "all_variants", is_flag=True, help="The whole implemented surface (large).")
@click.option("--variant", "variant_opts", multiple=True, metavar="AXIS=VALUE",
              help="Build one chosen point per arch instead of the prebuild list.")
@click.option("--bundle", "bundle_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the built kernels into one bundle file (FUSEGEMM_BUNDLE loads it).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def build_cmd(specs: tuple[str, ...], arch: str | None, jobs: int | None, all_variants: bool,
              variant_opts: tuple[str, ...], bundle_path: str | None, as_json: bool) -> None:
    """Compile spec variants into the kernel cache and print what was built.

    Only kernels the registry implements are built. A spec or arch with nothing to build is
    listed as "not built" with the reason. With --bundle PATH the kernels are also written to
    one read-only bundle file that runtimes load with FUSEGEMM_BUNDLE=PATH, without NVRTC.
    """
    t_start = time.perf_counter()
    try:
        _build(specs, arch, jobs, all_variants, variant_opts, bundle_path, as_json)
    except KeyboardInterrupt:
        # Workers are stopped (build._stop); finished kernels stay in the cache.
        from .runtime import config
        click.echo(f"\ninterrupted after {time.perf_counter() - t_start:.1f} s; kernels finished so far are "
                   f"in the cache ({config.cache_dir()}) and the next build reuses them", err=True)
        # 130; rarely (1 in 40 interrupts while planning) CPython's exit path ends the process by
        # SIGINT instead, the other conventional status of a Ctrl-C'd program.
        sys.exit(130)


def _build(specs, arch, jobs, all_variants, variant_opts, bundle_path, as_json) -> None:
    from . import build as b
    from .generator.variants import parse_variant_options
    from .runtime import config
    try:
        b.preflight()
        vs, skipped = b.select(specs or None, _archs(arch), all_variants=all_variants,
                               choices=parse_variant_options(variant_opts) if variant_opts else None)
        jobs = jobs or config.jobs()
    except FusegemmError as exc:
        raise _fail(exc) from None
    if not as_json:
        _echo_skipped(skipped)
    if not vs:
        if as_json:
            _echo_json({"results": [], "skipped": [sk.__dict__ for sk in skipped], "failed": 0})
        raise click.ClickException("nothing to build: " + "; ".join(
            f"{sk.spec} on {sk.arch} ({sk.status})" for sk in skipped))
    t0 = time.perf_counter()
    results = _run_with_progress(vs, jobs, quiet=as_json)
    wall = time.perf_counter() - t0
    failed = [r for r in results if not r.ok]
    from .runtime.cache import default_cache
    not_stored = default_cache().not_stored()   # the workers' caches read the same settings
    if as_json:
        _echo_json({"results": [r.as_dict() for r in results], "skipped": [sk.__dict__ for sk in skipped],
                    "wall_seconds": round(wall, 2), "cache": str(config.cache_dir()), "failed": len(failed),
                    "not_stored": not_stored})
    else:
        _table(["kernel", "arch", "variants", "regs", "smem", "spills", "threads", "tmem", "seconds",
                "cached"],
               [[r.name, r.arch, r.variants, r.registers, r.smem_bytes,
                 r.spill_bytes, r.threads, r.tmem_cols or "-", f"{r.seconds:.2f}",
                 "yes" if r.cached else "no"]
                for r in results if r.ok])
        # A kernel ptxas says runs below its speed (e.g. serialized WGMMAs) built fine: say so.
        for r in results:
            for note in r.advisories:
                click.echo(f"warning: {r.name} ({r.arch}): ptxas {note}", err=True)
        n_cached = sum(r.cached for r in results if r.ok)
        n_variants = sum(r.variants for r in results if r.ok)
        extra = f" serving {n_variants} variants" if n_variants != len(results) - len(failed) else ""
        click.echo(f"{len(results) - len(failed)} built ({n_cached} cached){extra}, "
                   f"{len(failed)} failed, {wall:.1f} s wall, cache {config.cache_dir()}"
                   + (f" ({not_stored}: nothing stored)" if not_stored else ""))
        for r in failed:
            click.echo(f"\nFAILED {r.name} ({r.arch}):\n{r.error}", err=True)
    if failed:
        if bundle_path:
            click.echo(f"bundle {bundle_path} not written: {len(failed)} kernels failed", err=True)
        sys.exit(1)
    if bundle_path:
        try:
            n, size = b.write_bundle(vs, bundle_path)
        except FusegemmError as exc:
            raise _fail(exc) from None
        msg = f"bundle {bundle_path}: {n} kernels, {size / 1e6:.1f} MB (load with FUSEGEMM_BUNDLE={bundle_path})"
        click.echo(msg, err=as_json)


def _run_with_progress(vs, jobs: int, quiet: bool):
    from . import build as b
    if quiet or not sys.stderr.isatty():
        state = {"done": 0, "total": len(vs)}

        def plan(n: int) -> None:
            state["total"] = n

        def tick(r):
            state["done"] += 1
            if not quiet:
                what = "cached" if r.cached else ("ok" if r.ok else "FAILED")
                click.echo(f"[{state['done']}/{state['total']}] {r.name} {what} {r.seconds:.2f}s", err=True)
        return b.build(vs, jobs=jobs, on_done=tick, on_plan=plan)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("building"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), transient=True) as prog:
        task = prog.add_task("", total=len(vs))
        return b.build(vs, jobs=jobs, on_plan=lambda n: prog.update(task, total=n),
                       on_done=lambda r: prog.update(task, advance=1, description=r.name))


@main.command()
@click.argument("name")
@click.option("--sass/--no-sass", default=True, help="Include the SASS instruction histogram.")
@click.option("--top", default=25, show_default=True, help="Histogram rows to print.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_settings_checked
def inspect(name: str, sass: bool, top: int, as_json: bool) -> None:
    """Registers, shared memory, spills and SASS of a cached kernel (name prefix) or a .cubin."""
    from .runtime import disasm
    from .runtime.cache import default_cache
    from .runtime.cubin_info import Cubin
    from .base.errors import ToolchainError
    try:
        path = Path(name)
        if path.is_file():
            data, meta = path.read_bytes(), {}
            if data[:4] != b"\x7fELF":
                raise click.ClickException(f"{name}: not a cubin (no ELF header); allowed: a .cubin file "
                                           "or the name (prefix) of a cached kernel")
        elif path.suffix == ".cubin" or os.sep in name:
            raise click.ClickException(f"{name}: no such file")
        else:
            # Entries whose meta.json is unreadable (no key: named after their folder) match too,
            # so inspect says what `cache list` says of them rather than "no cached kernel".
            matches = [e for e in default_cache().entries()
                       if e["name"].startswith(name) or Path(e["path"]).name.startswith(name)]
            if not matches:
                raise click.ClickException(f"no cached kernel matches {name!r}; "
                                           f"see `fusegemm cache list` or build it first")
            if len({m.get("key", m["path"]) for m in matches}) > 1:
                raise click.ClickException(f"{name!r} matches {len(matches)} kernels: "
                                           + ", ".join(m["name"] for m in matches[:8]))
            meta = matches[0]
            if meta.get("corrupted"):   # entries() read meta.json and checked the cubin's size and sha256
                what = meta["corrupted"] if "key" not in meta else \
                    "its cubin does not match the size and sha256 in meta.json"
                raise click.ClickException(f"cached kernel {meta['name']} is corrupted ({what}); `fusegemm build` "
                                           "rebuilds it, or `fusegemm cache clear --yes` removes it")
            data = (Path(meta["path"]) / "kernel.cubin").read_bytes()
        cub = Cubin(data)
        info: dict[str, Any] = {"name": meta.get("name", str(path)), "arch": meta.get("arch"),
                                "kernels": []}
        if "ptxas_advisories" in meta:   # a cached kernel's compile (a bare .cubin has no log)
            info["ptxas_advisories"] = meta["ptxas_advisories"]
        for k in cub.kernels():
            res = cub.resources(k).__dict__
            try:
                res["contract"] = cub.contract(k).__dict__
            except FusegemmError:
                pass
            info["kernels"].append(res)
        if sass:
            try:
                info["sass"] = disasm.sass_histogram(data)
            except ToolchainError as exc:   # no disassembler: the resource figures still stand
                info["sass_skipped"] = str(exc)
    except FusegemmError as exc:
        raise _fail(exc) from None
    except OSError as exc:
        raise click.ClickException(f"{name}: {exc.strerror}") from None
    if as_json:
        return _echo_json(info)
    click.echo(f"{info['name']}  arch={info['arch']}")
    for k in info["kernels"]:
        launch = k.get("contract", {})
        click.echo(f"  kernel {k['kernel']}: registers={k['registers']} "
                   f"static_smem={k['static_shared_bytes']} B dynamic_smem={launch.get('smem_bytes', '?')} B "
                   f"local(spills)={k['local_bytes']} B threads={launch.get('threads', k['max_threads'])}")
    for note in info.get("ptxas_advisories", ()):
        click.echo(f"  ptxas advisory {note}")
    if "sass_skipped" in info:
        click.echo(f"  SASS skipped: {info['sass_skipped']}")
    elif sass:
        hist = info["sass"]
        click.echo(f"  SASS: {sum(hist.values())} instructions, {len(hist)} opcodes")
        _table(["opcode", "count"], [[op, n] for op, n in list(hist.items())[:top]])


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--all-configs", is_flag=True, help="Run the verification cases of every configuration class "
              "(tile, cluster, CTAs, scheduler, majors, recipe, weights) this GPU's kernels implement, each in a "
              "child process under the first-run watchdog, instead of each family's cases.")
@click.option("--family", "families", multiple=True, help="With --all-configs: only this kernel family "
              "(repeatable).")
@click.option("--jobs", type=int, default=1, show_default=True, help="With --all-configs: classes checked at once.")
@click.option("--timeout", type=float, default=None, help="With --all-configs: seconds each class's cases may "
              "run on the device (default FUSEGEMM_VERIFY_TIMEOUT).")
@_settings_checked
def selftest(as_json: bool, all_configs: bool, families: tuple[str, ...], jobs: int, timeout: float | None) -> None:
    """Run every op family on this GPU against the numpy references (pass/fail table).

    Exit status: 0 every case passed, 1 a case failed, 3 no GPU to run on (nothing was
    verified: a script can tell that apart from a pass).
    """
    from . import selftest as st
    from .generator import registry
    if not all_configs and (families or jobs != 1 or timeout is not None):
        raise click.UsageError("--family, --jobs and --timeout go with --all-configs")
    unknown = [f for f in families if f not in registry.families()]
    if unknown:
        raise click.BadParameter(f"got {unknown[0]!r}; allowed: {', '.join(registry.families())}",
                                 param_hint="--family")
    if jobs < 1 or (timeout is not None and not timeout > 0):
        raise click.BadParameter(f"got {jobs if jobs < 1 else timeout}; allowed: a positive number",
                                 param_hint="--jobs" if jobs < 1 else "--timeout")
    arch, device = st.detect_arch()
    if arch is None:
        if as_json:
            _echo_json({"device": None, "reason": device, "rows": []})
        else:
            click.echo(f"selftest: nothing to run, nothing verified: {device}")
        sys.exit(NO_GPU_EXIT)
    if all_configs:
        from . import verify
        rows = verify.run_all_configs(arch, 0, families=families or None, jobs=jobs, timeout=timeout,
                                      progress=lambda line: click.echo(line, err=True))
    else:
        rows = st.run(arch)
    failed = [r for r in rows if r.status == "FAIL"]
    if as_json:
        _echo_json({"device": device, "arch": arch, "rows": [r.__dict__ for r in rows]})
    else:
        click.echo(f"selftest on {device}")
        _table(["family", "case", "status", "max error", "seconds", "detail"],
               [[r.family, r.case, r.status, "-" if r.max_error is None else f"{r.max_error:.3g}",
                 f"{r.seconds:.2f}", r.detail] for r in rows])
        click.echo(f"{sum(r.status == 'pass' for r in rows)} passed, {len(failed)} failed, "
                   f"{sum(r.status == 'not available' for r in rows)} not available")
    if failed:
        sys.exit(1)


@main.command()
@click.argument("spec")
@click.option("--shape", required=True, help="experts=L,tokens=T,n=N,k=K (tokens: rows of all experts "
              "before the 256-row padding).")
@click.option("--dist", type=click.Choice(["balanced", "skewed"]), default="balanced", show_default=True,
              help="How the tokens spread over the experts in the measured problem.")
@click.option("--rounds", type=int, default=5, show_default=True, help="Interleaved timing rounds (median).")
@click.option("--margin", type=float, default=0.05, show_default=True,
              help="Record the fastest only when it beats the default by more than this fraction.")
@click.option("--iters", type=int, default=10, show_default=True, help="Calls per round.")
@click.option("--device", type=int, default=0, show_default=True, help="CUDA device ordinal.")
@click.option("--no-write", is_flag=True, help="Measure and print; record nothing in the cache.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_settings_checked
def tune(spec: str, shape: str, dist: str, rounds: int, margin: float, iters: int, device: int, no_write: bool,
         as_json: bool) -> None:
    """Time every tile and scheduler this GPU's kernel implements for a problem shape and record
    the fastest in the kernel cache; fusegemm.grouped_gemm then uses it for calls of that
    shape's bucket (experts, rows per expert to a power of two, N, K, output options).

    Needs a GPU and torch. Exit status 3 when there is no GPU (nothing measured).
    """
    from . import tune as tn
    try:
        dims = tn.parse_shape(shape)
        if spec not in tn.SPECS:
            raise FusegemmError(f"spec: got {spec!r}; tuning is implemented for {', '.join(tn.SPECS)}")
        from . import selftest as st
        arch, why = st.detect_arch()
        if arch is None:
            click.echo(f"tune: nothing measured: {why}", err=True)
            sys.exit(NO_GPU_EXIT)
        res = tn.tune(spec, **dims, dist=dist, rounds=rounds, iters=iters, margin=margin, device=device,
                      write=not no_write,
                      progress=None if as_json else (lambda line: click.echo(f"  {line}", err=True)))
    except FusegemmError as exc:
        raise _fail(exc) from None
    if as_json:
        return _echo_json({"spec": spec, "bucket": res.bucket.key, "best": res.best.label,
                           "fastest": res.fastest.label,
                           "default": res.default.label, "speedup_vs_default": res.speedup, "ms": res.ms,
                           "record": str(res.path) if res.path else None})
    _table(["config", "ms", "vs default"],
           [[label, f"{t:.4f}", f"{res.ms[res.default.label] / t:.3f}x"]
            for label, t in sorted(res.ms.items(), key=lambda kv: kv[1])])
    kept = "" if res.best == res.fastest else f" (fastest {res.fastest.label} is within the margin)"
    click.echo(f"recorded {res.best.label}{kept}, {res.speedup:.3f}x the default {res.default.label}, for bucket "
               f"{res.bucket.key}; " + (f"in {res.path}" if res.path else "in this process only"))


@main.group()
def cache() -> None:
    """Inspect or clear the kernel cache."""


@cache.command("path")
@_settings_checked
def cache_path() -> None:
    """Print the cache folder."""
    from .runtime import config
    click.echo(str(config.cache_dir()))


@cache.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_settings_checked
def cache_list(as_json: bool) -> None:
    """List cached kernels."""
    from .runtime.cache import default_cache
    rows = default_cache().entries()
    if as_json:
        return _echo_json(rows)
    _table(["name", "arch", "regs", "seconds", "state"],
           [[e.get("name"), e.get("arch", "?"), e.get("resources", {}).get("registers", "?"),
             e.get("compile_seconds", "?"), f"corrupted ({e['corrupted']})" if e.get("corrupted") else "ok"]
            for e in rows])
    from . import tuning_records, verify
    click.echo(f"{len(rows)} entries in {default_cache().root} ({len(tuning_records.records())} tuning records, "
               f"{len(verify.passes())} verification passes: fusegemm cache records)")


@cache.command("records")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_settings_checked
def cache_records(as_json: bool) -> None:
    """List the records kept beside the kernels: tuning winners (`fusegemm tune`,
    FUSEGEMM_AUTOTUNE) and first-run verification passes."""
    from . import tuning_records, verify
    tuned, passed = tuning_records.records(), verify.passes()
    if as_json:
        return _echo_json({"tuned": tuned, "verified": passed})
    _table(["spec", "arch", "device", "bucket", "config", "ms", "default ms", "date"],
           [[r["spec"], r["arch"], r["device"], r["bucket"], r["config"] or "malformed", r["ms"] or "-",
             r["default_ms"] or "-", r["date"] or "-"] for r in tuned])
    click.echo(f"{len(tuned)} tuning records")
    if passed:
        click.echo("")
        _table(["family", "arch", "device", "fusegemm", "cases"],
               [[r.get("family") or "unreadable", r.get("arch") or "-", r.get("device") or "-",
                 r.get("fusegemm") or "-", r.get("cases") or "-"] for r in passed])
    click.echo(f"{len(passed)} verification passes")


@cache.command("clear")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (required when stdin is not a terminal).")
@click.option("--records", is_flag=True,
              help="Also delete the tuning records and verification passes (`fusegemm cache records`).")
@_settings_checked
def cache_clear(yes: bool, records: bool) -> None:
    """Delete every cached kernel (kept: the records of `fusegemm cache records`, unless
    --records)."""
    from .runtime.cache import default_cache
    c = default_cache()
    what = "every kernel entry and record" if records else "every kernel entry"
    try:
        c.require_writable("nothing removed")   # refused before asking: no prompt for nothing
        if not yes:
            # Without a terminal there is no one to ask (`< /dev/null`, a pipe, CI): deleting
            # anyway would take silence for a yes.
            if not sys.stdin.isatty():
                raise click.ClickException(f"cache clear: stdin is not a terminal, so it cannot ask before "
                                           f"deleting {what} under {c.root}; nothing removed. Pass --yes to "
                                           "delete them")
            click.confirm(f"Delete {what} under {c.root}?", abort=True)
        removed, failed = c.clear(records=records)
    except FusegemmError as exc:
        raise _fail(exc) from None
    click.echo(f"removed {removed} {'entries and records' if records else 'entries'} from {c.root}")
    if failed:
        raise click.ClickException(f"{len(failed)} entries could not be removed (read-only cache?): "
                                   + "; ".join(failed[:3]))


@main.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
def docs(out: Path) -> None:
    """Write the generated documentation pages into OUT: one page per packaged spec (its support
    surface from the spec and the registry), the CLI and the configuration references. The mkdocs
    site (mkdocs.yml) reads them from docs/generated."""
    from .docsgen import write_pages
    try:
        written = write_pages(out, main)
    except OSError as exc:
        raise click.ClickException(f"cannot write {out}: {exc.strerror or exc}") from None
    for p in written:
        click.echo(str(p))


def _table(headers: list[str], rows: list[list[Any]]) -> None:
    """Plain aligned table (stable for logs and tests; rich only draws the progress bar).
    Numeric columns align right, text columns left."""
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def numeric(i: int) -> bool:
        def num(v: str) -> bool:
            try:
                float(v)
            except ValueError:
                return v == "-"
            return True
        return len(cells) > 1 and all(num(r[i]) for r in cells[1:])
    right = [numeric(i) for i in range(len(headers))]
    for j, r in enumerate(cells):
        click.echo("  ".join(c.rjust(w) if right[i] else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip())
        if j == 0:
            click.echo("  ".join("-" * w for w in widths))


if __name__ == "__main__":  # pragma: no cover
    main()
