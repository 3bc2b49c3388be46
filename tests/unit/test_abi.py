"""The flat parameter struct: one description, C++ rendering with layout asserts, host packing."""
from __future__ import annotations

import struct

import pytest

from fusegemm.generator.abi import Field, ParamStruct
from fusegemm.generator.params import GROUPED_PARAMS
from fusegemm.runtime.compile import compile_source
from fusegemm.base.errors import CompileError

DEMO = ParamStruct("Demo", (Field("tm", "tensormap"), Field("n", "i32"), Field("ptr", "cptr"),
                            Field("scale", "f32"), Field("ld", "i64")))


def test_offsets_and_size():
    assert DEMO.offsets() == {"tm": 0, "n": 128, "ptr": 136, "scale": 144, "ld": 152}
    assert DEMO.size == 256 and DEMO.align == 128


def test_pack_places_every_field():
    raw = bytes(range(128))
    buf = DEMO.pack({"tm": raw, "n": -3, "ptr": 0xDEADBEEF00, "scale": 0.5, "ld": 1 << 40})
    assert len(buf) == 256 and buf[:128] == raw
    assert struct.unpack_from("<i", buf, 128)[0] == -3
    assert struct.unpack_from("<Q", buf, 136)[0] == 0xDEADBEEF00
    assert struct.unpack_from("<f", buf, 144)[0] == 0.5
    assert struct.unpack_from("<q", buf, 152)[0] == 1 << 40


def test_pack_rejects_unknown_fields_and_bad_tensormaps():
    with pytest.raises(ValueError, match=r"Demo.pack: unknown fields \['nn'\]"):
        DEMO.pack({"nn": 1})
    with pytest.raises(ValueError, match="tensormap: got 127 bytes; allowed: exactly 128"):
        DEMO.pack({"tm": b"x" * 127})


def test_field_validation():
    with pytest.raises(ValueError, match="Field.name: got '1x'"):
        Field("1x", "i32")
    with pytest.raises(ValueError, match="Field.kind: got 'int'"):
        Field("x", "int")
    with pytest.raises(ValueError, match=r"duplicate names \['x'\]"):
        ParamStruct("P", (Field("x", "i32"), Field("x", "f32")))


PRELUDE = "struct alignas(128) CUtensorMap { unsigned long long opaque[16]; };\n" \
          "typedef int int32_t; typedef unsigned uint32_t; typedef long long int64_t; " \
          "typedef unsigned long long uint64_t;\n"


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_rendered_struct_compiles(arch):
    src = PRELUDE + GROUPED_PARAMS.cpp() + "\nextern \"C\" __global__ void k(const __grid_constant__ Params p) {}\n"
    compile_source(src, arch=arch, kernel="k")


def test_layout_mismatch_fails_at_compile_time():
    # C++ that disagrees with the description (an int where Python says int64) must not compile.
    wrong = GROUPED_PARAMS.cpp().replace("  int64_t ldc;", "  int32_t ldc;")
    src = PRELUDE + wrong + "\nextern \"C\" __global__ void k(const __grid_constant__ Params p) {}\n"
    at = GROUPED_PARAMS.offsets()["ldc"]
    with pytest.raises(CompileError, match=rf"ABI: Params.ldc \(int64_t\) at byte {at}"):
        compile_source(src, arch="sm_90a", kernel="k")
