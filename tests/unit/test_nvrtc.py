"""Which NVRTC fusegemm compiles with (runtime/nvrtc.py): both CUDA wheel layouts found on
sys.path, the choice between majors, FUSEGEMM_NVRTC_MAJOR, and the errors."""
from __future__ import annotations

import sys

import pytest

from fusegemm.base.errors import ConfigError, ToolchainError
from fusegemm.runtime import compile as comp
from fusegemm.runtime import config, nvrtc


def test_the_loaded_nvrtc_compiles_and_reports_its_version():
    nv = nvrtc.load()
    assert nv.version[0] in (12, 13) and comp.nvrtc_version() == nv.version
    ok, log, cubin = nv.compile('extern "C" __global__ void k(int* p) { *p = 1; }', "k.cu", ["-arch=sm_90a"])
    assert ok and cubin[:4] == b"\x7fELF"
    ok, log, cubin = nv.compile("this is not C++", "bad.cu", ["-arch=sm_90a"])
    assert not ok and "bad.cu" in log and cubin == b""


def test_both_wheel_layouts_are_found(tmp_path, monkeypatch):
    for rel in ("a/nvidia/cu13/lib/libnvrtc.so.13", "b/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"):
        (tmp_path / rel).parent.mkdir(parents=True)
        (tmp_path / rel).write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "a"), str(tmp_path / "b")])
    found = nvrtc.installed()
    assert found[13].endswith("a/nvidia/cu13/lib/libnvrtc.so.13")
    assert found[12].endswith("b/nvidia/cuda_nvrtc/lib/libnvrtc.so.12")


@pytest.mark.parametrize("found,want,driver,pick", [
    ({12: "x", 13: "y"}, None, None, 13),     # a CPU build machine: the newest
    ({12: "x", 13: "y"}, None, 12, 12),       # a CUDA 12 driver cannot load NVRTC 13 cubins
    ({12: "x", 13: "y"}, None, 13, 13),
    ({13: "y"}, None, 12, 13),                # nothing older installed: the oldest there is
    ({12: "x", 13: "y"}, 12, 13, 12),         # FUSEGEMM_NVRTC_MAJOR wins
])
def test_the_choice_between_majors(found, want, driver, pick):
    assert nvrtc.choose(found, want, driver) == pick


def test_choice_errors_name_the_fix():
    with pytest.raises(ToolchainError, match=r"no NVRTC library found: install nvidia-cuda-nvrtc-cu12"):
        nvrtc.choose({}, None, None)
    with pytest.raises(ToolchainError, match=r"FUSEGEMM_NVRTC_MAJOR=13: no NVRTC 13 is installed \(found 12\); "
                                             r"install 'fusegemm\[cu13\]'"):
        nvrtc.choose({12: "x"}, 13, None)


def test_the_config_variable():
    with config.override(FUSEGEMM_NVRTC_MAJOR="13"):
        assert config.nvrtc_major() == 13
    with config.override(FUSEGEMM_NVRTC_MAJOR="auto"):
        assert config.nvrtc_major() is None
    with config.override(FUSEGEMM_NVRTC_MAJOR="11"):
        with pytest.raises(ConfigError, match=r"FUSEGEMM_NVRTC_MAJOR='11' is invalid; allowed: auto, 12, 13"):
            config.nvrtc_major()
