"""Static SASS figures of kernel builds, by default and with NVRTC defines (the headers' A/B
switches); no GPU needed; prints JSON.

For each kernel (a spec, an arch and its axes, below) and each build (``default`` and every
``--also NAME=DEFINES``), from the cubin NVRTC builds here:

* ``instructions``  SASS instructions (static: each appears once however often it runs);
* ``branch_regions``  BSSY, the compiler's divergent regions;
* ``reductions`` / ``shuffles`` / ``nan_max``  REDUX or CREDUX, SHFL and FMNMX.NAN instructions;
* ``shared``  shared-memory loads and stores by width (LDS, LDS.128, STS, STS.64, ...);
* ``registers``, ``local_bytes`` (spills and local arrays), ``smem_bytes`` (the host contract's
  dynamic shared memory).

These say where a switch moves instructions and whether it costs registers, spills or a
pipeline stage; they are not speed. The H200 times the same switches through
``bench/blockscaled.py --also``.

    python bench/sass.py --also bl=-DFUSEGEMM_ENGINE_BRANCHLESS=1 --also col=-DFUSEGEMM_ENGINE_COL_SMEM=1
    python bench/sass.py --kernels dswiglu_bw,quant_bw --also ... --out bench/results/sass_cpu_<name>.json
"""
from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
from pathlib import Path

from _common import add_also_argument, also_builds, emit_json, nvrtc_defines

BW = {"sf_vec_size": 128, "sf_dtype": "float32"}
KERNELS = {   # name: (spec, arch, axes)
    "dswiglu_bw": ("grouped_gemm_dswiglu", "sm_90a", BW),
    "dswiglu_bw_n128": ("grouped_gemm_dswiglu", "sm_90a", {**BW, "tile_n": 128}),
    "quant_bw": ("grouped_gemm_quant", "sm_90a", {**BW, "d_dtype": "float8_e4m3fn"}),
    "srelu_bw_fp8": ("grouped_gemm_srelu", "sm_90a", {**BW, "d_dtype": "float8_e4m3fn"}),
    "dswiglu_mx": ("grouped_gemm_dswiglu", "sm_90a", {}),
    "quant_mx": ("grouped_gemm_quant", "sm_90a", {"d_dtype": "float8_e4m3fn"}),
    "dswiglu_sm100": ("grouped_gemm_dswiglu", "sm_100a", {}),
    "quant_sm100": ("grouped_gemm_quant", "sm_100a", {"d_dtype": "float8_e4m3fn"}),
}


def figures(spec: str, arch: str, axes: dict, cache) -> dict:
    from fusegemm import pipeline
    from fusegemm.generator.spec import find_spec
    from fusegemm.generator.variants import make_variant
    from fusegemm.runtime import disasm
    from fusegemm.runtime.cubin_info import Cubin
    built = pipeline.get_kernel(make_variant(find_spec(spec), arch=arch, **axes), cache)
    hist = disasm.histogram(disasm.sass(built.cubin))
    cubin = Cubin(built.cubin)
    res = cubin.resources(built.kernel_name)
    shared = {op: n for op, n in sorted(hist.items()) if op.split(".")[0] in ("LDS", "STS")}
    return {"instructions": sum(hist.values()), "branch_regions": hist.get("BSSY", 0),
            "reductions": hist.get("REDUX.MAX", 0) + hist.get("CREDUX.MAX", 0),
            "shuffles": sum(n for op, n in hist.items() if op.startswith("SHFL")),
            "nan_max": hist.get("FMNMX.NAN", 0), "shared": shared, "registers": res.registers,
            "local_bytes": res.local_bytes, "smem_bytes": cubin.contract(built.kernel_name).smem_bytes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", default=",".join(KERNELS), help=f"comma-separated, of: {', '.join(KERNELS)}")
    ap.add_argument("--out", help="also write the JSON here")
    add_also_argument(ap)
    args = ap.parse_args()
    names = [k for k in args.kernels.split(",") if k]
    unknown = [k for k in names if k not in KERNELS]
    if unknown:
        raise SystemExit(f"--kernels: got {', '.join(unknown)}; allowed: {', '.join(KERNELS)}")
    from fusegemm.runtime.cache import KernelCache
    builds = [("default", "")] + also_builds(args)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = KernelCache(Path(tmp))
        for name in names:
            spec, arch, axes = KERNELS[name]
            row = {"kernel": name, "spec": spec, "arch": arch, "axes": axes}
            for build, defines in builds:
                print(f"{name}: {build}", file=sys.stderr, flush=True)
                if defines:
                    with nvrtc_defines(defines):
                        row[build] = figures(spec, arch, axes, cache)
                else:
                    row[build] = figures(spec, arch, axes, cache)
            base = row["default"]["instructions"]
            for build, _ in builds[1:]:
                row[f"{build}_instructions_vs_default"] = row[build]["instructions"] / base
            rows.append(row)
    emit_json({"benchmark": "sass", "date": datetime.date.today().isoformat(), "python": platform.python_version(),
               "builds": dict(builds), "method": "static SASS of each build (nvdisasm), NVRTC on this machine",
               "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
