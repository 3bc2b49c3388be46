"""Build many variants into the cache, in parallel processes, with progress.

Cache hits are resolved in this process (render + key + read: milliseconds), so a warm
``fusegemm build`` never starts a worker; only misses go to the process pool.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .generator.spec import find_spec, list_specs
from .generator.variants import Variant, make_variant, prebuild_variants, variants
from .generator.render import Source, render
from .runtime.cache import Built, KernelCache, default_cache, get_or_build, key_fields, make_key
from .runtime.errors import FusegemmError


@dataclass(frozen=True)
class BuildResult:
    """One row of the build table."""

    name: str
    spec: str
    arch: str
    ok: bool
    cached: bool
    seconds: float            # compile seconds (cold) or lookup seconds (cached)
    registers: int = 0
    smem_bytes: int = 0       # static + dynamic shared memory per CTA
    spill_bytes: int = 0      # local memory frame per thread
    threads: int = 0
    tmem_cols: int = 0        # sm_100a TMEM columns per CTA
    staging: bool = False
    error: str = ""
    variants: int = 1         # variants served by this kernel (e.g. every cluster shape)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def select(specs: Iterable[str] | None, archs: tuple[str, ...], *, all_variants: bool = False,
           choices: dict[str, Any] | None = None) -> list[Variant]:
    """Variants to build: each spec's prebuild list, its whole surface, or one chosen point."""
    names = list(specs) if specs else [p.stem for p in list_specs()]
    out: list[Variant] = []
    for name in names:
        spec = find_spec(name)
        if choices:
            for arch in archs:
                if arch in spec.choice_map["arch"]:
                    out.append(make_variant(spec, arch=arch, **choices))
        elif all_variants:
            out.extend(variants(spec, archs))
        else:
            out.extend(prebuild_variants(spec, archs))
    return out


def _result(v: Variant, b: Built, seconds: float) -> BuildResult:
    # b.name is the kernel's name (readable + source hash), shared by its variants
    return BuildResult(name=b.name, spec=v.spec.name, arch=v.arch, ok=True, cached=b.cached,
                       seconds=seconds, registers=b.resources.registers,
                       smem_bytes=b.resources.static_shared_bytes + b.launch.smem_bytes,
                       spill_bytes=b.resources.local_bytes, threads=b.launch.threads,
                       tmem_cols=b.launch.tmem_cols,
                       staging=b.staging)


def _build_one(v: Variant, cache: KernelCache | None = None) -> BuildResult:
    t0 = time.perf_counter()
    try:
        b = get_or_build(v, cache)
    except FusegemmError as exc:
        return BuildResult(name=v.readable, spec=v.spec.name, arch=v.arch, ok=False, cached=False,
                           seconds=time.perf_counter() - t0, error=str(exc))
    return _result(v, b, b.compile_seconds if not b.cached else time.perf_counter() - t0)


def _lookup(src: Source, cache: KernelCache) -> BuildResult | None:
    """The cached result of ``src``'s kernel, or None on a miss (key + read, no compile)."""
    t0 = time.perf_counter()
    v = src.variant
    hit = cache.get(src.name, make_key(key_fields(src.text, v.arch)))
    return None if hit is None else _result(v, hit, time.perf_counter() - t0)


def build(vs: list[Variant], *, jobs: int = 1, cache: KernelCache | None = None,
          on_done: Callable[[BuildResult], None] | None = None,
          on_plan: Callable[[int], None] | None = None) -> list[BuildResult]:
    """Build the kernels of ``vs``: one row per distinct kernel, in first-seen order.

    Variants that render the same source (they differ only in launch attributes such as the
    cluster shape) share one kernel and one row (``variants`` counts them). Failures are rows,
    not exceptions. Workers use the default cache, so a custom ``cache`` builds in-process.
    """
    kernels: dict[tuple[str, str], Source] = {}
    served: dict[tuple[str, str], int] = {}
    failed_early: list[BuildResult] = []
    for v in vs:
        try:
            src = render(v)
        except FusegemmError as exc:
            failed_early.append(BuildResult(name=v.readable, spec=v.spec.name, arch=v.arch,
                                            ok=False, cached=False, seconds=0.0, error=str(exc)))
            continue
        k = (src.digest, v.arch)
        kernels.setdefault(k, src)
        served[k] = served.get(k, 0) + 1
    order = list(kernels)
    sources = [kernels[k] for k in order]
    uniq = [s.variant for s in sources]
    if on_plan:
        on_plan(len(uniq) + len(failed_early))
    results: list[BuildResult | None] = [None] * len(uniq)

    def done(i: int, r: BuildResult) -> None:
        results[i] = dataclasses.replace(r, variants=served[order[i]])
        if on_done:
            on_done(results[i])

    for r in failed_early:
        if on_done:
            on_done(r)
    misses: list[int] = []
    for i, (v, src) in enumerate(zip(uniq, sources)):
        try:
            hit = _lookup(src, cache or default_cache())
        except FusegemmError as exc:
            done(i, BuildResult(name=v.readable, spec=v.spec.name, arch=v.arch, ok=False,
                                cached=False, seconds=0.0, error=str(exc)))
            continue
        if hit is not None:
            done(i, hit)
        else:
            misses.append(i)
    if jobs <= 1 or len(misses) <= 1 or cache is not None:
        for i in misses:
            done(i, _build_one(uniq[i], cache))
    elif misses:
        # forkserver: safe when the caller has threads (torch, CUDA); workers need no CUDA.
        ctx = multiprocessing.get_context("forkserver" if sys.platform.startswith("linux") else "spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, len(misses)), mp_context=ctx) as pool:
            futures = {pool.submit(_build_one, uniq[i]): i for i in misses}
            for fut in as_completed(futures):
                done(futures[fut], fut.result())
    return failed_early + [r for r in results if r is not None]
