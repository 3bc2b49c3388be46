"""NVRTC compile: error content, and every prebuild variant of every seed spec on both archs."""
from __future__ import annotations

import pytest

from fusegemm import build as b
from fusegemm import pipeline
from fusegemm.generator.render import Source, render
from fusegemm.generator.variants import make_variant
from fusegemm.runtime import cache as c
from fusegemm.runtime.compile import compile_source
from fusegemm.base.errors import CompileError, SpecError

BROKEN = """#include "fusegemm/common.cuh"
extern "C" __global__ void broken_kernel(float* p) {
  float x = undeclared_name * 2.0f;
  p[threadIdx.x] = x;
}
"""


def test_compile_error_carries_context():
    with pytest.raises(CompileError) as info:
        compile_source(BROKEN, arch="sm_90a", kernel="broken_kernel", name="broken.cu",
                       spec_path="specs/demo.yaml")
    e = info.value
    msg = str(e)
    assert msg.startswith("NVRTC failed to compile kernel broken_kernel for sm_90a (spec specs/demo.yaml)")
    assert 'broken.cu(3): error: identifier "undeclared_name" is undefined' in e.log
    assert "--- NVRTC log ---" in msg and "--- offending source ---" in msg
    assert ">    3 |   float x = undeclared_name * 2.0f;" in e.excerpt
    assert "       |   " + "^" * len("float x = undeclared_name * 2.0f;") in e.excerpt
    assert e.kernel == "broken_kernel" and e.arch == "sm_90a" and e.spec_path == "specs/demo.yaml"


def test_generated_kernel_error_names_spec_and_kernel(monkeypatch, tmp_path):
    v = make_variant("gemm_amax", arch="sm_100a")
    good = render(v)
    bad = Source(variant=v, impl=good.impl, name=good.name, symbol=good.symbol,
                 text=good.text + "\nint oops = ;\n", digest=good.digest)
    monkeypatch.setattr("fusegemm.pipeline.render", lambda _v: bad)
    with pytest.raises(CompileError) as info:
        pipeline.get_kernel(v, c.KernelCache(tmp_path, disk=True))
    msg = str(info.value)
    assert good.symbol in msg and v.spec.path in msg and "expected an expression" in msg


def test_unknown_spec_is_a_clear_error():
    with pytest.raises(SpecError, match=r"no spec named 'nope'; available: gemm_amax, grouped_gemm"):
        b.select(["nope"], ("sm_90a",))


def test_cluster_shapes_share_one_kernel(session_cache):
    """The cluster is a launch attribute: every legal cluster of a variant is one cubin."""
    from fusegemm.generator.variants import make_variant
    vs = [make_variant("grouped_gemm", arch="sm_100a", cluster_m=m, cluster_n=n)
          for m, n in ((2, 1), (2, 2), (4, 1), (4, 4))]
    results = b.build(vs, cache=session_cache)
    assert len(results) == 1 and results[0].variants == 4 and results[0].ok


@pytest.mark.parametrize("arch", ["sm_100a", "sm_90a"])
def test_every_prebuild_variant_compiles(arch, session_cache):
    """Every kernel `fusegemm build` makes by default compiles for both archs, spill-free."""
    vs, _ = b.select(None, (arch,))
    results = b.build(vs, cache=session_cache)
    failed = [f"{r.name}: {r.error[:2000]}" for r in results if not r.ok]
    assert failed == []
    assert sum(r.variants for r in results) == len(vs) >= 10   # every variant is served
    assert len({r.name for r in results}) == len(results)       # by exactly one kernel row
    for r in results:
        assert r.spill_bytes == 0, r.name
        assert r.threads > 0 and r.registers > 0, r.name
        # No ptxas performance advisory (C7518: WGMMAs serialized cost 7-20% on the H200).
        assert r.advisories == (), (r.name, r.advisories)
