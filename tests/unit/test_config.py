"""FUSEGEMM_* variables: parsed in one place, loud on bad values, overridable in tests."""
from __future__ import annotations

from pathlib import Path

import pytest

from fusegemm.runtime import config
from fusegemm.base.errors import ConfigError


def test_defaults(monkeypatch):
    for name in config.VARS:
        monkeypatch.delenv(name, raising=False)
    assert config.default_archs() == ("sm_100a", "sm_90a")
    assert config.disk_cache_enabled() is True
    assert config.validate_offsets() is False
    assert config.jobs() >= 1
    assert config.cache_dir().name == "fusegemm"


def test_environment_is_read(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEGEMM_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("FUSEGEMM_JOBS", "3")
    monkeypatch.setenv("FUSEGEMM_ARCHS", "sm_90a")
    assert config.cache_dir() == Path(tmp_path / "c")
    assert config.jobs() == 3
    assert config.default_archs() == ("sm_90a",)


@pytest.mark.parametrize("name,value,allowed", [
    ("FUSEGEMM_JOBS", "zero", "a positive integer"),
    ("FUSEGEMM_JOBS", "0", "a positive integer"),
    ("FUSEGEMM_ARCHS", "sm_80", "comma list of sm_100a, sm_90a"),
    ("FUSEGEMM_DISABLE_DISK_CACHE", "maybe", "0/1, true/false"),
])
def test_bad_values_are_loud(monkeypatch, name, value, allowed):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"^{name}='{value}' is invalid; allowed: {allowed}$"):
        config.get(name)


def test_override_is_scoped(monkeypatch):
    monkeypatch.setenv("FUSEGEMM_JOBS", "5")
    with config.override(FUSEGEMM_JOBS="2"):
        assert config.jobs() == 2
        with config.override(FUSEGEMM_JOBS=None):
            assert config.jobs() >= 1
    assert config.jobs() == 5
    with pytest.raises(ConfigError, match="unknown configuration variable 'FUSEGEMM_NOPE'"):
        with config.override(FUSEGEMM_NOPE="1"):
            pass


def test_only_config_reads_the_environment():
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for folder in ("fusegemm", "generator", "runtime"):
        for p in (root / folder).rglob("*.py"):
            if p.name != "config.py" and ("os.environ" in p.read_text() or "os.getenv" in p.read_text()):
                offenders.append(str(p.relative_to(root)))
    assert offenders == []


def test_a_changed_value_is_seen_on_the_next_read(monkeypatch):
    """Values are parsed once per raw string (the ops read FUSEGEMM_VALIDATE_OFFSETS on every
    call), never once per process: a new value is seen on the next read, a bad one every time."""
    monkeypatch.setenv("FUSEGEMM_VALIDATE_OFFSETS", "1")
    assert config.validate_offsets() is True
    monkeypatch.setenv("FUSEGEMM_VALIDATE_OFFSETS", "0")
    assert config.validate_offsets() is False
    monkeypatch.setenv("FUSEGEMM_VALIDATE_OFFSETS", "maybe")
    for _ in range(2):
        with pytest.raises(ConfigError, match="FUSEGEMM_VALIDATE_OFFSETS='maybe'"):
            config.validate_offsets()
