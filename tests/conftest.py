"""Shared fixtures. GPU tests live in tests/gpu and skip cleanly without a GPU."""
from __future__ import annotations

import pytest

from fusegemm.runtime import config


@pytest.fixture
def cache_dir(tmp_path):
    """A private, empty kernel cache for one test."""
    root = tmp_path / "cache"
    with config.override(FUSEGEMM_CACHE_DIR=str(root), FUSEGEMM_DISABLE_DISK_CACHE="0"):
        yield root


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory):
    """One cache shared by the compile-heavy tests of a session (each kernel compiles once)."""
    from fusegemm.runtime.cache import KernelCache
    root = tmp_path_factory.mktemp("session-cache")
    return KernelCache(root, disk=True)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="Rewrite tests/unit/golden/* from the current renderer.")


@pytest.fixture
def update_golden(request) -> bool:
    return bool(request.config.getoption("--update-golden"))
