"""One test per cache-key input: changing it changes the key."""
from __future__ import annotations

import pytest

from fusegemm.runtime import cache as c
from fusegemm.runtime import compile as comp
from fusegemm.runtime import config

SRC = '#include "fusegemm/common.cuh"\nextern "C" __global__ void k() {}\n'


def key(src: str = SRC, arch: str = "sm_90a", **kw) -> str:
    return c.make_key(c.key_fields(src, arch, **kw))


def test_key_is_stable():
    assert key() == key()


def test_fields_are_labelled_in_order():
    labels = [label for label, _ in c.key_fields(SRC, "sm_90a")]
    assert labels == ["cache_schema", "package_version", "source", "headers", "nvrtc_version",
                      "options", "arch"]


def test_source_changes_key():
    assert key(SRC + "// x\n") != key()


def test_arch_changes_key():
    assert key(arch="sm_100a") != key()


def test_package_version_changes_key():
    assert key(version="9.9.9") != key()


def test_cache_schema_changes_key(monkeypatch):
    before = key()
    monkeypatch.setattr(c, "CACHE_SCHEMA", c.CACHE_SCHEMA + 1)
    assert key() != before


def test_nvrtc_version_changes_key(monkeypatch):
    before = key()
    monkeypatch.setattr(c, "nvrtc_version", lambda: (99, 1))
    assert key() != before


def test_options_change_key():
    before = key()
    with config.override(FUSEGEMM_NVRTC_EXTRA="-lineinfo"):
        assert key() != before


def test_header_content_changes_key(tmp_path, monkeypatch):
    from fusegemm.runtime import headers as h
    inc = tmp_path / "inc"
    (inc / "fusegemm").mkdir(parents=True)
    hdr = inc / "fusegemm" / "extra.cuh"
    hdr.write_text("#pragma once\nconstexpr int kX = 1;\n")
    real = comp.headers()
    fake = h.HeaderSet(real.cuda_major, inc, real.cutlass, real.cuda_runtime, real.cccl)
    monkeypatch.setattr(c, "headers", lambda: fake)
    src = '#include "fusegemm/extra.cuh"\n'
    before = key(src)
    hdr.write_text("#pragma once\nconstexpr int kX = 2;\n")
    assert key(src) != before


def test_nested_header_is_followed(tmp_path):
    from fusegemm.runtime.headers import reached_headers
    (tmp_path / "a.h").write_text('#include "b.h"\n')
    (tmp_path / "b.h").write_text('#include <c.h>\n')
    (tmp_path / "c.h").write_text("int c;\n")
    got = reached_headers('#include "a.h"\n', (tmp_path,))
    assert sorted(p.rsplit("/", 1)[1] for p in got) == ["a.h", "b.h", "c.h"]


def test_real_headers_are_reached():
    from fusegemm.runtime.headers import reached_headers
    got = reached_headers(SRC, comp.headers().dirs)
    assert any(p.endswith("fusegemm/types.cuh") for p in got)
    assert any(p.endswith("fusegemm/common.cuh") for p in got)
    assert any(p.endswith("cuda/std/cstdint") for p in got)   # a CCCL header: the search follows <...>
