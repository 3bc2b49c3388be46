"""FUSEGEMM_WAIT_TIMEOUT: the diagnosis of a hung kernel. Kernels compiled while it is set stop a
barrier wait that has not completed after that many seconds, print which (block, thread, barrier,
parity) from the device and trap, so the launch fails instead of hanging its stream. The setting
reaches NVRTC as a define (and so the cache key); kernels compiled without it are unchanged."""
from __future__ import annotations

import pytest

from fusegemm import pipeline
from fusegemm.base.errors import ConfigError
from fusegemm.generator.variants import make_variant
from fusegemm.runtime import config, disasm
from fusegemm.runtime.cache import KernelCache
from fusegemm.runtime.cubin_info import Cubin


def test_the_setting_becomes_a_define_ahead_of_the_extra_options():
    with config.override(FUSEGEMM_WAIT_TIMEOUT="2.5", FUSEGEMM_NVRTC_EXTRA="-DX=1"):
        assert config.nvrtc_extra_options() == ("-DFUSEGEMM_WAIT_TIMEOUT_NS=2500000000ull", "-DX=1")
    with config.override(FUSEGEMM_WAIT_TIMEOUT="0"):
        assert config.nvrtc_extra_options() == ()
    for bad in ("-1", "soon", "inf"):
        with config.override(FUSEGEMM_WAIT_TIMEOUT=bad), pytest.raises(ConfigError, match="FUSEGEMM_WAIT_TIMEOUT"):
            config.nvrtc_extra_options()


def _sass(tmp_path, variant, wait: str):
    with config.override(FUSEGEMM_WAIT_TIMEOUT=wait):
        built = pipeline.get_kernel(variant, KernelCache(tmp_path / f"cache{wait}"))
    return built, disasm.sass(built.cubin)


@pytest.mark.parametrize("arch, axes", [
    ("sm_90a", dict(tile_m=128, tile_n=256, cluster_m=1, cluster_n=1, a_gather=True)),
    ("sm_100a", dict(tile_m=256, tile_n=256, cluster_m=2, cluster_n=1)),
])
def test_waits_poll_a_clock_and_trap_only_when_asked(tmp_path, arch, axes):
    variant = make_variant("grouped_gemm", arch=arch, **axes)
    plain, plain_sass = _sass(tmp_path, variant, "0")
    timed, timed_sass = _sass(tmp_path, variant, "5")
    assert plain.key != timed.key
    assert "GLOBALTIMER" not in plain_sass and "vprintf" not in plain_sass
    assert "GLOBALTIMER" in timed_sass and "vprintf" in timed_sass
    assert timed_sass.count("BPT.TRAP") > plain_sass.count("BPT.TRAP")
    # printf's argument buffer is the only local memory it adds.
    assert Cubin(plain.cubin).resources(plain.kernel_name).local_bytes == 0
    assert Cubin(timed.cubin).resources(timed.kernel_name).local_bytes <= 512
