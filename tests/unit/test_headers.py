"""Header discovery over sys.path for the CUDA 12 and CUDA 13 wheel layouts."""
from __future__ import annotations

import sys

import pytest

from fusegemm.runtime import headers as h
from fusegemm.base.errors import ToolchainError


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")


@pytest.fixture
def fake_site(tmp_path, monkeypatch):
    h.header_set.cache_clear()
    real_cutlass = h._search(("cutlass_library/source/include",), "cute/tensor.hpp")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "a"), str(tmp_path / "b")])
    _touch(tmp_path / "a/cutlass_library/source/include/cute/tensor.hpp")
    yield tmp_path
    h.header_set.cache_clear()
    assert real_cutlass is not None


def test_cuda13_layout_spread_over_two_site_dirs(fake_site):
    # runtime headers in one site-packages, CCCL in another (a --target install): both found,
    # and both cccl/ and its parent are on the include path.
    _touch(fake_site / "a/nvidia/cu13/include/cuda_fp16.h")
    _touch(fake_site / "b/nvidia/cu13/include/cccl/cuda/std/type_traits")
    hs = h.header_set(13)
    dirs = [str(d) for d in hs.dirs]
    assert str(fake_site / "a/nvidia/cu13/include") in dirs
    assert str(fake_site / "b/nvidia/cu13/include") in dirs
    assert str(fake_site / "b/nvidia/cu13/include/cccl") in dirs


def test_cuda12_layout(fake_site):
    _touch(fake_site / "b/nvidia/cuda_runtime/include/cuda_fp16.h")
    _touch(fake_site / "a/nvidia/cuda_cccl/include/cuda/std/type_traits")
    hs = h.header_set(12)
    assert hs.cuda_runtime == (fake_site / "b/nvidia/cuda_runtime/include").resolve()
    assert hs.cccl == (fake_site / "a/nvidia/cuda_cccl/include").resolve()
    assert hs.cccl_parent is None


def test_missing_wheels_name_the_fix(fake_site, monkeypatch):
    monkeypatch.setattr(h, "_TOOLKIT_INCLUDES", ())
    with pytest.raises(ToolchainError, match=r"for CUDA 13 not found on sys.path; install "
                                             r"nvidia-cuda-runtime and nvidia-cuda-cccl"):
        h.header_set(13)
    with pytest.raises(ToolchainError, match="nvidia-cuda-runtime-cu12 and nvidia-cuda-cccl-cu12"):
        h.header_set(12)
