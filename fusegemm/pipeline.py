"""Variant -> compiled kernel: render once, key once, cache hit or compile under the key's lock, put.

The one module above generator/ (specs, registry, rendering: pure Python) and runtime/ (NVRTC,
the cubin cache: knows nothing of specs). ``fusegemm build``, the ops and selftest all come
through here, so a kernel is rendered and keyed once per request, whoever asks.
"""
from __future__ import annotations

from dataclasses import dataclass

from .generator.render import Source, render
from .generator.variants import Variant
from .runtime.cache import Built, KernelCache, default_cache, key_fields, make_key
from .runtime.compile import compile_source


@dataclass(frozen=True)
class Planned:
    """A rendered, keyed kernel: everything a lookup or a compile needs (picklable for workers)."""

    source: Source
    key: str
    key_fields: tuple[tuple[str, str], ...]

    @property
    def variant(self) -> Variant:
        return self.source.variant

    @property
    def name(self) -> str:
        return self.source.name


def plan(v: Variant) -> Planned:
    """Render ``v`` (the registry's kernel for it) and compute its cache key."""
    return _keyed(render(v))


def _keyed(src: Source) -> Planned:
    fields = key_fields(src.text, src.variant.arch)
    return Planned(src, make_key(fields), tuple(fields))


def lookup(p: Planned, cache: KernelCache | None = None) -> Built | None:
    """The cached kernel of ``p``, or None (no compile)."""
    return (cache or default_cache()).get(p.name, p.key)


def compile_planned(p: Planned, cache: KernelCache | None = None) -> Built:
    """Compile ``p`` once: under the key's file lock, re-checking the cache after acquiring it,
    so concurrent builders (threads or processes) compile a kernel once."""
    cache = cache or default_cache()
    if not cache.disk:
        return cache.put(_compile(p), p.source.text, {})
    with cache.lock(p.key):
        hit = cache.get(p.name, p.key)
        if hit is not None:
            return hit
        v = p.variant
        return cache.put(_compile(p), p.source.text, {
            "spec": v.spec.name, "spec_path": v.spec.path, "template": p.source.template,
            "variant": dict(v.choices),
            "key_fields": {label: (value if label != "source" else p.source.digest)
                           for label, value in p.key_fields},
        })


def get_kernel(v: Variant, cache: KernelCache | None = None) -> Built:
    """The compiled kernel of ``v``: from a kernel bundle (FUSEGEMM_BUNDLE / ``add_bundle``,
    no NVRTC involved), else from the cache, else compiled once and stored."""
    src = render(v)
    hit = from_bundles(src)
    if hit is not None:
        return hit
    p = _keyed(src)
    hit = lookup(p, cache)
    return hit if hit is not None else compile_planned(p, cache)


def add_bundle(path) -> int:
    """Load kernels from the bundle at ``path`` (``fusegemm build --bundle``) in this process,
    read-only and without NVRTC, after those of FUSEGEMM_BUNDLE. Returns its kernel count;
    CacheError when the file is not a valid bundle.

    Parameters
    ----------
    path : str or path
        A bundle file written by ``fusegemm build --bundle PATH``.
    """
    from .runtime.bundle import default_bundles
    return len(default_bundles().add(path))


def bundle_key(src: Source) -> str:
    """The key of a rendered kernel in a bundle: what determines the cubin *given a compiler*
    (source, fusegemm's own headers, options, arch, package version) and nothing that needs
    one (no NVRTC version, no third-party header content; see runtime/bundle.py)."""
    from .base.package import __version__
    from .runtime.cache import CACHE_SCHEMA
    from .runtime.compile import compile_options
    from .runtime.headers import headers_digest, own_include_dir
    v = src.variant
    return make_key([
        ("bundle_of_cache_schema", str(CACHE_SCHEMA)),
        ("package_version", __version__),
        ("source", src.text),
        ("own_headers", headers_digest(src.text, (own_include_dir(),))),
        ("options", "\0".join(compile_options(v.arch))),
        ("arch", v.arch),
    ])


def from_bundles(src: Source) -> Built | None:
    """The kernel of ``src`` from the process's bundles, or None (no bundle, or not in one)."""
    from .runtime.bundle import default_bundles
    bundles = default_bundles()
    if not bundles.active():
        return None
    key = bundle_key(src)
    found = bundles.find(key)
    if found is None:
        return None
    bundle, cubin = found
    e = bundle.entries[key]
    return Built.from_cubin(name=e.name, kernel_name=e.kernel, arch=e.arch, key=e.meta.get("cache_key", key),
                            cubin=cubin, compile_seconds=e.compile_seconds, cached=True,
                            meta={**e.meta, "bundle": str(bundle.path)})


def _compile(p: Planned) -> Built:
    src, v = p.source, p.variant
    cubin = compile_source(src.text, arch=v.arch, kernel=src.symbol, name=f"{src.symbol}.cu",
                           spec_path=v.spec.path)
    return Built.from_cubin(name=src.name, kernel_name=src.symbol, arch=v.arch, key=p.key,
                            cubin=cubin.data, compile_seconds=cubin.seconds, cached=False,
                            meta={"ptxas_advisories": list(cubin.advisories)})
