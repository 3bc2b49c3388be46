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
    src = render(v)
    fields = key_fields(src.text, v.arch)
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
    """The compiled kernel of ``v``: from the cache, or compiled once and stored."""
    p = plan(v)
    hit = lookup(p, cache)
    return hit if hit is not None else compile_planned(p, cache)


def _compile(p: Planned) -> Built:
    src, v = p.source, p.variant
    cubin = compile_source(src.text, arch=v.arch, kernel=src.symbol, name=f"{src.symbol}.cu",
                           spec_path=v.spec.path)
    return Built.from_cubin(name=src.name, kernel_name=src.symbol, arch=v.arch, key=p.key,
                            cubin=cubin.data, compile_seconds=cubin.seconds, cached=False)
