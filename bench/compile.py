"""Cold compile and cached load of the seed specs' prebuild kernels; prints JSON.

For every kernel of the seed specs' prebuild list (both archs unless ``--archs``), one process,
one core, a fresh temporary cache:

* ``cold_s``  render + NVRTC + cache write (``fusegemm.pipeline.get_kernel`` on an empty cache);
* ``nvrtc_s``  NVRTC alone (the compile's own timer);
* ``cached_ms``  a later lookup: cache read + checksum (disk -> cubin bytes);
* ``load_ms``  ``cuModuleLoadData`` + function attributes of the cubin (only with a GPU, and
  only for kernels of the GPU's arch).

``--repeat N`` builds every kernel N times, in N rounds over the whole list, each round in a
fresh cache; ``cold_s`` is then a kernel's fastest round and ``cold_s_rounds`` lists them all.
The H200 machine's host CPU is shared: within one call its compile speed moved 3-4x between
phases of tens of seconds (2026-12-01), and the fastest of a few rounds is the machine's own
speed, not its neighbours'.

Goals (issue 11): cold compile <= 1.0 s per kernel on the H200 machine; cached lookup + load
<= 5 ms.

    python bench/compile.py [--archs sm_90a,sm_100a] [--repeat N] [--out bench/results/compile_<machine>.json]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import emit_json


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--archs", default="sm_90a,sm_100a")
    ap.add_argument("--specs", default=None, help="comma list (default: every seed spec)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of cold builds (cold_s: the fastest)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.repeat < 1:
        raise SystemExit(f"--repeat: got {args.repeat}; expected an integer >= 1")

    with tempfile.TemporaryDirectory(prefix="fusegemm-bench-compile-") as cache_dir:
        os.environ["FUSEGEMM_CACHE_DIR"] = cache_dir     # before fusegemm reads its config
        from fusegemm import build
        from fusegemm.pipeline import lookup, plan
        from fusegemm.runtime.cache import KernelCache
        from fusegemm.runtime.compile import nvrtc_version

        cache = KernelCache(Path(cache_dir))
        archs = tuple(args.archs.split(","))
        variants, _ = build.select(args.specs.split(",") if args.specs else None, archs)
        gpu_arch = _gpu_arch()
        # Rounds before the last build into caches of their own (removed after the round).
        colds: list[list[float]] = [[] for _ in variants]
        nvrtcs: list[list[float]] = [[] for _ in variants]
        for r in range(args.repeat - 1):
            with tempfile.TemporaryDirectory(prefix="fusegemm-bench-compile-round-") as round_dir:
                round_cache = KernelCache(Path(round_dir))
                for i, v in enumerate(variants):
                    _cold_build(v, round_cache, colds[i], nvrtcs[i])
            print(f"round {r + 1}/{args.repeat}: {sum(x[-1] for x in colds):.1f} s", file=sys.stderr)
        rows = []
        for i, v in enumerate(variants):
            built = _cold_build(v, cache, colds[i], nvrtcs[i])
            cold = min(colds[i])
            p = plan(v)
            reads = []
            for _ in range(5):
                t0 = time.perf_counter()
                hit = lookup(p, KernelCache(Path(cache_dir)))   # a fresh one: disk, not memory
                reads.append(time.perf_counter() - t0)
            if hit is None:
                raise SystemExit(f"{built.name}: not found in the cache after its build")
            row = {"kernel": built.name, "arch": v.arch, "cold_s": round(cold, 3),
                   "nvrtc_s": round(min(nvrtcs[i]), 3),
                   "cached_ms": round(statistics.median(reads) * 1e3, 2)}
            if args.repeat > 1:
                row["cold_s_rounds"] = [round(x, 3) for x in colds[i]]
            if gpu_arch == v.arch:
                row["load_ms"] = round(_load_ms(built) * 1e3, 2)
            rows.append(row)
            print(f"{built.name:90s} cold {cold:5.2f} s  cached {row['cached_ms']:5.2f} ms"
                  + (f"  load {row['load_ms']:5.2f} ms" if "load_ms" in row else ""), file=sys.stderr)

    def summary(key: str, arch: str | None = None) -> dict:
        vals = [r[key] for r in rows if key in r and (arch is None or r["arch"] == arch)]
        if not vals:
            return {}
        return {"median": round(statistics.median(vals), 3), "max": round(max(vals), 3),
                "sum": round(sum(vals), 2)}

    result = {
        "benchmark": "compile", "machine": platform.node(), "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(), "python": platform.python_version(),
        "nvrtc": ".".join(map(str, nvrtc_version())), "date": time.strftime("%Y-%m-%d"),
        "method": "one process, one core, a fresh cache; each prebuild kernel built once (cold), "
                  "then looked up 5 times from disk by a fresh cache object (median)"
                  + (f"; {args.repeat} rounds of cold builds, each in a fresh cache: cold_s and nvrtc_s "
                     "are a kernel's fastest" if args.repeat > 1 else ""),
        "repeat": args.repeat,
        "kernels": len(rows),
        "cold_s": {a: summary("cold_s", a) for a in archs},
        "cached_ms": summary("cached_ms"), "load_ms": summary("load_ms"),
        "goals": {"cold_s_per_kernel": 1.0, "cached_plus_load_ms": 5.0},
        "rows": rows,
    }
    emit_json(result, args.out)
    return 0


def _cold_build(v, cache, colds: list[float], nvrtcs: list[float]):
    """Build ``v`` into ``cache`` (empty for it); append the seconds it took (render + NVRTC +
    cache write) to ``colds`` and NVRTC's own to ``nvrtcs``. Returns the built kernel."""
    from fusegemm.pipeline import get_kernel   # imported by main() after it set the cache dir
    t0 = time.perf_counter()
    built = get_kernel(v, cache)
    colds.append(time.perf_counter() - t0)
    nvrtcs.append(built.compile_seconds)
    return built


def _gpu_arch() -> str | None:
    try:
        from fusegemm.ops.device import device_arch
        return device_arch(0)
    except Exception:   # no driver, no GPU: compile figures only
        return None


def _load_ms(built) -> float:
    """Seconds to load ``built`` into a fresh module (not the process's module cache)."""
    from fusegemm.runtime.load import _load, ensure_context
    ctx = ensure_context(0)
    t0 = time.perf_counter()
    _load(built.cubin, built.kernel_name, built.contract.smem_bytes, ctx, 0, built.contract.max_cluster_ctas)
    return time.perf_counter() - t0


if __name__ == "__main__":
    raise SystemExit(main())
