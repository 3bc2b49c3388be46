"""bench/_common.py's runners write the --out JSON after every finished row (marked ``partial``
until the last), so a benchmark stopped by a time limit (the device tool's) keeps what it measured;
an unknown layer name is refused before any row runs."""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


def _common():
    spec = importlib.util.spec_from_file_location("bench_common", ROOT / "bench" / "_common.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_common"] = mod
    spec.loader.exec_module(mod)
    return mod


def _args(out, layers):
    return argparse.Namespace(layers=layers, rounds=1, iters=1, warmup=0, out=str(out))


def test_rows_reach_the_file_as_each_finishes(tmp_path, monkeypatch):
    common = _common()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "a GPU")
    out = tmp_path / "r.json"
    seen = []

    def bench_layer(name, args):
        if seen:   # every finished row was written before the next one ran
            written = json.loads(out.read_text())
            assert [r["layer"] for r in written["rows"]] == seen
            assert written["partial"].startswith(f"{len(seen)} of 3 rows")
        if name == "c":
            raise KeyboardInterrupt   # a run stopped by its time limit
        seen.append(name)
        return {"layer": name}

    with pytest.raises(KeyboardInterrupt):
        common.run_layers(_args(out, "a,b,c"), {"a": 0, "b": 0, "c": 0}, bench_layer, lambda r: "", "t")
    written = json.loads(out.read_text())
    assert [r["layer"] for r in written["rows"]] == ["a", "b"] and written["partial"].startswith("2 of 3 rows")
    assert common.run_layers(_args(out, "a,b"), {"a": 0, "b": 0}, lambda n, a: {"layer": n}, lambda r: "", "t") == 0
    final = json.loads(out.read_text())
    assert [r["layer"] for r in final["rows"]] == ["a", "b"] and "partial" not in final


def test_an_unknown_layer_is_refused_before_any_row(tmp_path, monkeypatch):
    common = _common()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "a GPU")
    ran = []
    with pytest.raises(SystemExit, match="--layers: unknown 'zz'"):
        common.run_layers(_args(tmp_path / "r.json", "a,zz"), {"a": 0}, lambda n, a: ran.append(n), lambda r: "", "t")
    assert ran == []
