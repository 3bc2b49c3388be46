"""Cubin inspection without a GPU, cross-checked against cuobjdump, plus SASS histograms."""
from __future__ import annotations

import re
import subprocess

import pytest

from fusegemm.base.contract import FIELDS
from fusegemm.runtime import disasm
from fusegemm.runtime.compile import compile_source
from fusegemm.runtime.cubin_info import Cubin, CubinFormatError

# A contract export as long as the field list (values 1, 2, ...), and one of another length.
CONTRACT = (f'extern "C" __device__ __attribute__((used)) const int spill_contract[{len(FIELDS)}] = '
            f'{{{", ".join(str(i) for i in range(1, len(FIELDS) + 1))}}};')
SRC = CONTRACT + """
extern "C" __device__ __attribute__((used)) const int plain_contract[4] = {256, 4096, 2, 1};
extern "C" __global__ void __launch_bounds__(256, 1) spill(float* p, int i) {
  __shared__ float s[300];
  float loc[64];
  for (int j = 0; j < 64; j++) loc[j] = p[j * threadIdx.x];
  s[threadIdx.x] = loc[i & 63];
  __syncthreads();
  p[threadIdx.x] = s[(threadIdx.x + 1) % 256];
}
extern "C" __global__ void plain(float* p) { p[threadIdx.x] = 1.f; }
"""

needs_disasm = pytest.mark.skipif(not disasm.available(),
                                  reason="nvdisasm wheel not installed (pip install 'fusegemm[disasm]')")


@pytest.fixture(scope="module", params=["sm_90a", "sm_100a"])
def cubin(request):
    return compile_source(SRC, arch=request.param, kernel="spill").data


def test_resources(cubin):
    c = Cubin(cubin)
    assert sorted(c.kernels()) == ["plain", "spill"]
    r = c.resources("spill")
    assert r.local_bytes == 256          # the runtime-indexed local array lives in the stack frame
    assert r.max_threads == 256
    assert r.static_shared_bytes >= 1200
    assert c.resources("plain").local_bytes == 0
    # The contract is read field by field in the order of fusegemm/base/contract.py ...
    got = c.contract("spill").__dict__
    assert list(got) == [name for name, _ in FIELDS] and list(got.values()) == list(range(1, len(FIELDS) + 1))
    # ... and an export of another length (a cubin built against another field list) is refused.
    with pytest.raises(CubinFormatError, match=rf"symbol 'plain_contract' holds 16 bytes; expected {len(FIELDS)}"):
        c.contract("plain")


@needs_disasm
def test_resources_agree_with_cuobjdump(cubin, tmp_path):
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    out = subprocess.run([str(disasm.find_tool("cuobjdump")), "-res-usage", str(path)],
                         capture_output=True, text=True, check=True).stdout
    for kernel in ("spill", "plain"):
        m = re.search(rf"Function {kernel}:\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+)", out)
        r = Cubin(cubin).resources(kernel)
        assert (r.registers, r.local_bytes, r.static_shared_bytes) == tuple(map(int, m.groups()))


@needs_disasm
def test_sass_histogram(cubin):
    hist = disasm.sass_histogram(cubin)
    assert sum(hist.values()) > 10
    assert disasm.count_prefix(hist, "STL") > 0   # the spill kernel's runtime-indexed local array
    assert disasm.count_prefix(hist, "EXIT") >= 2
    assert list(hist.values()) == sorted(hist.values(), reverse=True)


def test_histogram_parser():
    text = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/              @!P0 UTCHMMA.2CTA gdesc[UR4], gdesc[UR6], tmem[UR8], tmem[UR10], idesc[UR12], UPT ;
        /*0020*/               @P1 UTCHMMA gdesc[UR4] ;
        /*0030*/                   EXIT ;
    """
    hist = disasm.histogram(text)
    assert hist == {"EXIT": 1, "LDC": 1, "UTCHMMA": 1, "UTCHMMA.2CTA": 1}
    assert disasm.count_prefix(hist, "UTCHMMA") == 2


def test_not_a_cubin():
    with pytest.raises(CubinFormatError, match="not a 64-bit ELF cubin"):
        Cubin(b"hello world" * 10)
    with pytest.raises(CubinFormatError, match="kernel 'nope' not in cubin"):
        Cubin(compile_source(SRC, arch="sm_90a", kernel="spill").data).resources("nope")


def test_missing_disassembler_message(monkeypatch):
    from fusegemm.base.errors import ToolchainError
    disasm.find_tool.cache_clear()
    monkeypatch.setattr(disasm, "_BIN_DIRS", ("nowhere",))
    try:
        with pytest.raises(ToolchainError, match=r"pip install 'fusegemm\[disasm\]'"):
            disasm.find_tool()
    finally:
        disasm.find_tool.cache_clear()
