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
from _bench import bench_module  # noqa: E402  (tests/unit/_bench.py)

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


def test_a_method_that_does_not_return_stops_the_run_naming_it(capsys):
    """A hung kernel blocks the next synchronize for good: the watchdog names the method on stderr
    and stops the process (exit 124) instead of leaving the run to an outside time limit."""
    import threading
    import time
    common = _common()
    stopped = threading.Event()
    codes = []

    def stop(code):
        codes.append(code)
        stopped.set()

    with common.watchdog("method 'gathered' (round 1)", 0.05, stop=stop):
        assert stopped.wait(5.0)
    assert codes == [124]
    assert "method 'gathered' (round 1) did not finish within 0.05 s" in capsys.readouterr().err
    # A block that finishes in time, or a watchdog turned off, stops nothing.
    with common.watchdog("quick", 5.0, stop=stop):
        pass
    with common.watchdog("off", 0, stop=stop):
        time.sleep(0.05)
    time.sleep(0.1)
    assert codes == [124]


def test_every_runner_offers_the_hang_limit():
    common = _common()
    for add in (lambda ap: common.add_run_arguments(ap, "dsv3-fc1"),
                lambda ap: common.add_layer_arguments(ap, ["a"], warmup=1, iters=1, rounds=1)):
        ap = argparse.ArgumentParser()
        add(ap)
        assert ap.parse_args([]).hang_s == common.HANG_S
        assert ap.parse_args(["--hang-s", "0"]).hang_s == 0


class _TorchKernels:
    """Stands in for permute.py's SmallKernels on the CPU: its builds' results are torch's
    permutations (``wrong``: a gather that drops the last row)."""
    header = "fusegemm/permute.cuh"

    def __init__(self, wrong=False):
        self.wrong = wrong

    def variant(self, defines):
        return _TorchKernels(wrong="WRONG" in defines)

    def function(self, device, name):
        return name


def test_the_permute_bench_checks_every_build_before_timing(monkeypatch):
    """bench/permute.py on a small CPU layer: each --also build's gather must be torch's bit for
    bit and its sum the default build's; a wrong build stops the row naming it."""
    from fusegemm import permute, routing
    bench = bench_module("permute")
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "LAYERS", {"small": (8, 64, 256, 2)})
    monkeypatch.setattr(bench, "_BUILDS", {})
    monkeypatch.setattr(bench, "interleaved_ms", lambda methods, args: {m: 1.0 for m in methods})
    monkeypatch.setattr(permute, "_KERNELS", _TorchKernels())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def gather(x, index, row_of=None):
        out = routing._rows_of_tokens_torch(x, index)
        if permute._KERNELS.wrong:
            out[-1] += 1
        return out
    monkeypatch.setattr(permute, "gather_rows", gather)
    monkeypatch.setattr(permute, "sum_rows", routing._sum_rows_torch)
    args = argparse.Namespace(also=["pipe=-DFUSEGEMM_PERMUTE_GATHER_PIPELINE=1"], rounds=1, iters=1, warmup=0)
    row = bench.bench_layer("small", args)
    assert row["bit_exact"] and row["gather_pipe_vs_fusegemm"] == 1.0 and row["sum_vs_torch_of_bound"] == 0.0
    assert set(row["gather_ms"]) == {"fusegemm", "row_order", "torch", "pipe"}
    assert row["gather_token_order_vs_row_order"] == 1.0
    monkeypatch.setattr(bench, "_BUILDS", {})
    args.also = ["bad=-DWRONG=1"]
    with pytest.raises(SystemExit, match="small: bad's gather is not torch's bit for bit"):
        bench.bench_layer("small", args)


def test_device_gaps_locate_the_idle_time_between_operations():
    """kernel_table's idle time: only time no device operation covers counts (overlapping or
    nested operations of two streams leave none), each gap is named by the operation that last reached
    furthest and the next one, and everything is per step."""
    common = _common()
    spans = [(0.0, 100.0, "gemm_a"), (50.0, 120.0, "side"),      # overlap: no gap
             (60.0, 80.0, "nested"),                              # inside both: no gap after it
             (130.0, 200.0, "gather"),                            # 10 us after "side" ends
             (260.0, 300.0, "gemm_b"),                            # 60 us after "gather"
             (300.0, 310.0, "fill"), (330.0, 400.0, "gather"),    # 20 us after "fill"
             (460.0, 500.0, "gemm_b")]                            # 60 us after "gather" again
    got = common.device_gaps(spans, steps=2, top=2)
    assert got["idle_ms_per_step"] == pytest.approx((10 + 60 + 20 + 60) / 2 / 1e3)
    assert got["top_gaps"] == [(pytest.approx(0.06), 1.0, "gather -> gemm_b"),
                               (pytest.approx(0.01), 0.5, "fill -> gather")]
    assert common.device_gaps([], steps=1) == {"idle_ms_per_step": 0.0, "top_gaps": []}


class _FakeEvent:
    """torch.cuda.Event on the CPU: record() stamps a counter of the calls made so far."""
    made: list = []

    def __init__(self, enable_timing=False):
        _FakeEvent.made.append(self)
        self.at = None

    def record(self):
        self.at = _FakeEvent.calls

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return float(end.at - self.at)   # "ms": the calls issued between the two records


def test_launch_order_gives_one_steps_calls_with_their_median_times():
    """kernel_calls: operation i of a step is the i-th start of every step; its time is the
    median over the steps, short ones are left out, and steps that differ are refused."""
    common = _common()
    # Two operations a step, three steps (microseconds): "a" 100/300/200 us, "b" 5 us each.
    spans = [(0, 100, "a"), (150, 155, "b"), (1000, 1300, "a"), (1400, 1405, "b"), (2000, 2200, "a"),
             (2300, 2305, "b")]
    assert common.launch_order(spans[::-1], steps=3) == [(0.2, "a"), (0.005, "b")]
    assert common.launch_order(spans, steps=3, min_ms=0.01) == [(0.2, "a")]
    with pytest.raises(RuntimeError, match="steps differ"):
        common.launch_order(spans[:-1], steps=3)
    swapped = spans[:4] + [(2000, 2005, "b"), (2300, 2500, "a")]
    with pytest.raises(RuntimeError, match="operation 0"):
        common.launch_order(swapped, steps=3)


def test_parse_smi_reads_the_samples_sustained_windows_take():
    """sustained()'s nvidia-smi lines (bench/ceiling.py and moe_layer.py --power): the time stamp
    with its fraction, clock, power and reasons; lines of another shape or with a field that is
    not a number ("[N/A]") are skipped."""
    common = _common()
    text = ("2026/12/06 21:00:00.250, 1515, 690.12, 0x0000000000000004\n"
            "2026/12/06 21:00:00.300, [N/A], 690.0, 0x0\n"
            "garbage\n"
            "2026/12/06 21:00:01.050, 1980, 150.5, 0x0000000000000000\n")
    got = common.parse_smi(text)
    assert [(c, w, r) for _, c, w, r in got] == [(1515.0, 690.12, "0x0000000000000004"),
                                                (1980.0, 150.5, "0x0000000000000000")]
    assert got[1][0] - got[0][0] == pytest.approx(0.8)


def test_window_stats_gives_energy_and_the_power_cap_share():
    """window_stats (sustained()'s figures per method): mean and median clock, mean power, the
    energy of one launch at that power, the share of samples whose reasons hold the power cap
    bit (0x4) and a slowdown bit (thermal or hardware); unreadable reasons count as none; no
    samples give None, not zero."""
    common = _common()
    samples = [(0.0, 1500.0, 700.0, "0x0000000000000004"), (0.1, 1600.0, 690.0, "0x0000000000000044"),
               (0.2, 1980.0, 400.0, "0x0000000000000000"), (0.3, 1700.0, 610.0, "[N/A]")]
    got = common.window_stats(samples, ms=15.0)
    assert got["samples"] == 4 and got["ms"] == 15.0
    assert got["sm_mhz"] == pytest.approx(1695.0) and got["sm_mhz_median"] == pytest.approx(1650.0)
    assert got["watts"] == pytest.approx(600.0)
    assert got["joules"] == pytest.approx(9.0)          # 600 W for 15 ms
    assert got["power_capped"] == pytest.approx(0.5)    # 0x4 and 0x44
    assert got["slowdown"] == pytest.approx(0.25)       # 0x40: hardware thermal
    assert got["clock_event_reasons"] == sorted({s[3] for s in samples})
    none = common.window_stats([], ms=15.0)
    assert none["ms"] == 15.0 and none["samples"] == 0
    assert all(none[k] is None for k in ("sm_mhz", "sm_mhz_median", "watts", "joules", "power_capped", "slowdown"))


def test_power_option_and_rows(monkeypatch, capsys):
    """--power (moe_layer, pingpong, blockscaled): seconds >= 0, 0 by default, a negative value
    or a non-number refused naming the option; power_rows gives each method's joules over the
    base's, leaving out a method without samples."""
    common = _common()
    ap = argparse.ArgumentParser(prog="b")
    common.add_power_argument(ap)
    assert ap.parse_args([]).power == 0.0 and ap.parse_args(["--power", "2.5"]).power == 2.5
    for bad in ("-1", "x"):
        with pytest.raises(SystemExit):
            ap.parse_args(["--power", bad])
        err = capsys.readouterr().err
        assert "--power" in err and ("seconds >= 0" in err or "seconds value" in err), err
    monkeypatch.setattr(common, "sustained", lambda methods, seconds: {
        "a": {"joules": 2.0}, "b": {"joules": 3.0}, "c": {"joules": None}})
    got = common.power_rows({"a": None, "b": None, "c": None}, 1.0, "a", "ours")
    assert got["joules_vs_ours"] == {"b": pytest.approx(1.5)} and set(got["sustained"]) == {"a", "b", "c"}


def test_ceiling_seconds_refuses_a_negative_window(capsys):
    """bench/ceiling.py's --seconds takes the same type as --power: a negative window is refused
    naming the option before any work (it used to skip the sampling silently)."""
    ceiling = bench_module("ceiling")
    with pytest.raises(SystemExit):
        ceiling.main(["--seconds", "-1"])
    err = capsys.readouterr().err
    assert "--seconds" in err and "seconds >= 0" in err, err


def test_blockscaled_summary_with_power_rows():
    """bench/blockscaled.py's line per row with --blockwise-only and --power: the speed-ups over
    BF16 torch, then each method's joules over BF16 torch's (the power rows' dict, whose key also
    ends in a method suffix, is not read as a speed-up)."""
    bench = bench_module("blockscaled")
    key = "joules_vs_" + bench.POWER_LABEL
    row = {"gemm_bw_vs_bf16_grouped_mm": 1.25, "quant_bw_vs_bf16_grouped_mm": 1.5,
           "sustained": {"gemm_bw": {"joules": 1.0}}, key: {"gemm_bw": 0.8, "quant_bw": 0.9}}
    line = bench._summary(row)
    assert "x1.25" in line and "x1.50" in line
    assert line.endswith("joules / BF16 torch's: gemm_bw 0.80 quant_bw 0.90")
    # (a dict under a key that ends like a speed-up's, as the first form of the label did: skipped)
    assert bench._summary({**row, "joules_vs_bf16_grouped_mm": {"gemm_bw": 0.8}}) == line
    del row[key]
    assert "joules" not in bench._summary(row)


def test_queued_ms_times_the_calls_back_to_back(monkeypatch):
    """queued_ms: one pair of events around the timed calls (not one per call, as time_ms), no
    wait between them, and the time per call."""
    common = _common()
    _FakeEvent.made, _FakeEvent.calls = [], 0
    syncs = []
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: syncs.append(_FakeEvent.calls))

    def fn():
        _FakeEvent.calls += 1

    assert common.queued_ms(fn, warmup=3, iters=8) == 1.0
    assert _FakeEvent.calls == 11 and len(_FakeEvent.made) == 2 and syncs == [3]
    _FakeEvent.made = []
    common.time_ms(fn, warmup=0, iters=4)
    assert len(_FakeEvent.made) == 8   # the latency timer: a pair per call


def test_grouped_gemm_summary_names_every_measure():
    """bench/grouped_gemm.py's line: the waited-for ratios, and the queued and kernel-time ones
    when the run measured them."""
    gg = bench_module("grouped_gemm")
    row = {"fusegemm_tflops": 700.0, "torch_grouped_mm_tflops": 650.0, "cublas_dense_tflops": 720.0,
           "ratio_vs_torch_grouped_mm": 1.077, "ratio_vs_cublas_dense": 0.972, "fusegemm_best_config": "128x256:static",
           "fusegemm_best_tflops": 700.0}
    assert "queued" not in gg._summary(row) and "x0.972 dense" in gg._summary(row)
    row["queued"] = {"per_method": {}, "ratio_vs_torch_grouped_mm": 1.1, "ratio_vs_cublas_dense": 1.01}
    row["kernel_us"] = {"per_method": {}, "ratio_vs_torch_grouped_mm": 1.12, "ratio_vs_cublas_dense": 1.02}
    line = gg._summary(row)
    assert "queued x1.100 / x1.010 dense" in line and "kernel_us x1.120 / x1.020 dense" in line


def test_the_quantize_bench_sizes_the_weights_by_experts(monkeypatch):
    """bench/quantize.py --experts N: the weight rows quantize N experts' w1 (N, 2F, H) and w2
    (N, H, F) (dsv3-32's step quantizes 4x dsv3-8's bytes), the activations' rows stay; 0 is
    refused before any work."""
    bench = bench_module("quantize")
    seen = {}
    monkeypatch.setattr(bench, "run_layers", lambda args, cases, *a, **k: seen.update(
        {name: cases[name][1] for name in args.layers.split(",")}) or 0)
    assert bench.main(["--experts", "32", "--cases", "w1_128x128_t,w2_128x128_t,x_both"]) == 0
    assert seen == {"w1_128x128_t": (32, 2 * bench.INTER, bench.HIDDEN),
                    "w2_128x128_t": (32, bench.HIDDEN, bench.INTER), "x_both": (bench.TOKENS, bench.HIDDEN)}
    with pytest.raises(SystemExit):
        bench.main(["--experts", "0"])


def test_ncu_regions_splits_the_samples_at_the_hgmmas_and_the_rule(tmp_path):
    """bench/ncu_regions.py: samples from 60 SASS lines before the first HGMMA to 40 after the
    last count as the mainloop, those within 400 lines of the rule's MUFU.EX2 as the epilogue,
    the rest as other; the k-step's full-barrier wait is its try-wait plus the branch after it,
    as a share of the mainloop's samples; BAR.SYNC samples are the named-barrier waits. A dump
    without a SASS table is refused by name."""
    bench = bench_module("ncu_regions")
    hdr = ["Address", "Source", "Warp Stall Sampling (All Samples)", "stall_long_sb", "stall_wait",
           "stall_long_sb (Not Issued)"]
    # lines 0..599: BAR.SYNC (5 samples) and NOPs (1, a wait each); 600 try-wait, 601 its branch,
    # 602 the HGMMA; 603..702 FMULs (1, a wait each); 703 the MUFU.EX2 (40, waits).
    sass = [("BAR.SYNC R1, 0x100", 5, 0, 0)] + [("NOP", 1, 0, 1)] * 599
    sass += [("SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [R1], R4", 10, 10, 0), ("@!P2 BRA 0x10", 30, 30, 0),
             ("HGMMA.64x256x16.F32.BF16 R24", 20, 0, 20)]
    sass += [("FMUL R1, R2, R3", 1, 0, 1)] * 100 + [("MUFU.EX2 R1, R1", 40, 0, 40)]
    lines = ["==PROF== Connected", '"Kernel Name","fg_grouped_gemm"', ",".join(f'"{h}"' for h in hdr)]
    lines += [",".join(f'"{v}"' for v in (hex(16 * i), s, n, lsb, w, 0)) for i, (s, n, lsb, w) in enumerate(sass)]
    path = tmp_path / "src.csv"
    path.write_text("\n".join(lines) + "\n")
    out = bench.summary(str(path))
    regions = out["regions"]
    mainloop = 58 + 10 + 30 + 20 + 40        # NOPs 542..599, try-wait, branch, HGMMA, FMULs 603..642
    epilogue = 239 + 60 + 40                 # NOPs 303..541, FMULs 643..702, the MUFU
    other = 5 + 302                          # BAR.SYNC, NOPs 1..302
    assert out["samples"] == mainloop + epilogue + other
    for name, n in (("mainloop", mainloop), ("epilogue", epilogue), ("other", other)):
        assert regions[name]["share_of_samples_pct"] == round(100 * n / out["samples"], 1), name
    assert out["k_step_full_wait_pct_of_mainloop"] == round(100 * 40 / mainloop, 1)
    assert out["named_barrier_wait_samples"] == 5
    assert regions["epilogue"]["stall_share_pct"] == {"wait": 100.0, "long_sb": 0.0}
    assert regions["mainloop"]["stall_share_pct"]["long_sb"] == round(100 * 40 / mainloop, 1)
    (tmp_path / "bad.csv").write_text("nothing\n")
    with pytest.raises(SystemExit, match="no SASS table"):
        bench.summary(str(tmp_path / "bad.csv"))


def test_round_ratios_pair_the_methods_round_by_round():
    """interleaved_ms hands back each method's per-round times when asked, and round_ratios pairs
    two methods within each round: a clock that drifts between rounds moves both, not their ratio."""
    common = bench_module("_common")
    clocks = {"a": iter([10.0, 20.0, 12.0]), "b": iter([5.0, 10.0, 4.0])}   # rounds (a, b): (10, 5), (20, 10), (12, 4)
    rounds: dict = {}
    args = argparse.Namespace(rounds=3, warmup=0, iters=1, hang_s=0)
    med = common.interleaved_ms({"a": "a", "b": "b"}, args, timer=lambda fn, w, i: next(clocks[fn]),
                                rounds_out=rounds)
    assert rounds == {"a": [10.0, 20.0, 12.0], "b": [5.0, 10.0, 4.0]}
    assert med == {"a": 12.0, "b": 5.0}
    assert common.round_ratios(rounds, "a", "b") == {"median": 2.0, "min": 2.0, "max": 3.0}
    with pytest.raises(ValueError, match="no rounds"):
        common.round_ratios({"a": [], "b": []}, "a", "b")


def test_interleaved_rounds_balance_places_and_predecessors():
    """Round r runs row r of a Williams design: over its rows each method takes each place equally often
    and follows each other method equally often (a method's place in a fixed order moved its time by 4%
    on the H100, and so did the method before it under a rotation, which keeps every predecessor)."""
    from collections import Counter
    from itertools import permutations
    common = bench_module("_common")
    calls = []
    args = argparse.Namespace(rounds=7, warmup=0, iters=1, hang_s=0)
    common.interleaved_ms({"a": "a", "b": "b", "c": "c"}, args, timer=lambda fn, w, i: calls.append(fn) or 1.0)
    assert "".join(calls) == "abc" "bca" "cab" "cba" "acb" "bac" "abc"   # odd: the rows and their mirrors
    for n in range(1, 9):
        keys = [chr(ord("a") + i) for i in range(n)]
        rows = [common.round_order(keys, r) for r in range(2 * n if n % 2 else n)]
        assert all(sorted(row) == keys for row in rows)
        places = Counter((i, k) for row in rows for i, k in enumerate(row))
        after = Counter(pair for row in rows for pair in zip(row, row[1:]))
        assert len(set(places.values())) == 1 and len(places) == n * n, (n, places)
        assert set(after) == set(permutations(keys, 2)) and len(set(after.values())) <= 1, (n, after)


def test_pingpong_reports_each_rounds_ratio_to_the_default(monkeypatch):
    """bench/pingpong.py's row: the ratio of medians and, per configuration, the per-round ratio
    against the default (the same round's default time over the configuration's)."""
    torch = pytest.importorskip("torch")
    bench = bench_module("pingpong")
    out = torch.zeros(4)
    methods = {bench.DEFAULT: lambda: out, "pp64x256": lambda: out}
    monkeypatch.setattr(bench, "_gemm", lambda torch, shape, dist, args: (dict(methods), {}, 1e9, {}))
    per_round = {bench.DEFAULT: [2.0, 4.0, 3.0], "pp64x256": [1.0, 4.0, 2.0]}

    def fake_interleaved(ms, args, rounds_out=None):
        rounds_out.update({k: list(per_round[k]) for k in ms})
        return {k: sorted(v)[1] for k, v in per_round.items()}
    monkeypatch.setattr(bench, "interleaved_ms", fake_interleaved)
    row = bench.bench_shape("gemm:dsv3-fc1", "balanced", argparse.Namespace(power=0))
    assert row["speedup_vs_default"] == {"pp64x256": 1.5}
    assert row["speedup_vs_default_rounds"] == {"pp64x256": {"median": 1.5, "min": 1.0, "max": 2.0}}
    assert "sustained" not in row

    # --power: each configuration alone after the rounds; energy per call against the default's
    seen = []

    def fake_sustained(ms, seconds):
        seen.append((sorted(ms), seconds))
        return {bench.DEFAULT: {"ms": 2.0, "watts": 600.0, "joules": 1.2},
                "pp64x256": {"ms": 1.0, "watts": 900.0, "joules": 0.9}}
    monkeypatch.setitem(bench.power_rows.__globals__, "sustained", fake_sustained)   # (power_rows' sampler)
    row = bench.bench_shape("gemm:dsv3-fc1", "balanced", argparse.Namespace(power=2.5))
    assert seen == [(sorted(methods), 2.5)]
    assert row["joules_vs_default"] == {"pp64x256": pytest.approx(0.75)}
    assert "alone: " in bench._summary(row)


def test_pingpong_row_ends_zero_the_padding_as_the_layer_does():
    """--row-ends: each expert's row end is where its routed tokens end inside its 256-row padded
    range, and the padding rows of every operand passed are zeroed (the ops' contract); the other
    dists and the flag off leave the operands alone."""
    torch = pytest.importorskip("torch")
    bench = bench_module("pingpong")
    common = bench_module("_common")
    experts, tokens = 4, 1000
    counts = common.expert_tokens(experts, tokens, "routed")
    sizes = common.expert_sizes(experts, tokens, "routed")
    assert sum(counts) == tokens and all(s % 256 == 0 and s >= c for s, c in zip(sizes, counts))
    a, prob = torch.ones(sum(sizes), 3), torch.ones(sum(sizes))
    args = argparse.Namespace(row_ends=True)
    ends = bench._row_ends(torch, args, experts, tokens, "routed", sizes, a, prob)
    starts = [sum(sizes[:i]) for i in range(experts)]
    assert ends.dtype == torch.int32 and ends.tolist() == [s + c for s, c in zip(starts, counts)]
    keep = torch.zeros(sum(sizes), dtype=torch.bool)
    for s, c in zip(starts, counts):
        keep[s: s + c] = True
    assert bool((a[keep] == 1).all()) and bool((a[~keep] == 0).all()) and bool((prob[~keep] == 0).all())
    assert int((~keep).sum()) == sum(sizes) - tokens
    assert bench._row_ends(torch, argparse.Namespace(row_ends=False), experts, tokens, "routed", sizes, a) is None
    with pytest.raises(SystemExit, match="--row-ends"):
        bench._row_ends(torch, args, experts, tokens, "balanced", sizes, a)


def test_prebuild_compiles_the_ops_kernels_in_parallel_and_reports_failures(monkeypatch, capsys):
    """bench/_common.prebuild hands every op's kernel variant to fusegemm.build at once, with
    FUSEGEMM_JOBS workers (a fresh GPU machine compiled a benchmark's kernels one call at a time),
    names a kernel that failed (its first call raises the error itself) and sums up on stderr."""
    from fusegemm import build
    from fusegemm.generator.variants import make_variant
    from fusegemm.runtime import config
    common = bench_module("_common")
    v1 = make_variant("grouped_gemm", arch="sm_90a", tile_m=128, tile_n=256)
    v2 = make_variant("grouped_gemm_wgrad", arch="sm_90a")
    seen = {}

    def fake_build(vs, *, jobs=1, **kw):
        seen["names"], seen["jobs"] = [v.readable for v in vs], jobs
        ok = build.BuildResult(name="k1", spec="grouped_gemm", arch="sm_90a", ok=True, cached=False, seconds=1.0)
        hit = build.BuildResult(name="k2", spec="grouped_gemm", arch="sm_90a", ok=True, cached=True, seconds=0.0)
        bad = build.BuildResult(name="k3", spec="grouped_gemm_wgrad", arch="sm_90a", ok=False, cached=False,
                                seconds=0.5, error="NVRTC: error: something\nmore")
        return [ok, hit, bad]

    monkeypatch.setattr(build, "build", fake_build)
    ops = [type("FakeOp", (), {"kernel_variant": v})() for v in (v1, v2)]
    with config.override(FUSEGEMM_JOBS="3"):
        common.prebuild(ops, "dsv3 kernels")
    assert seen == {"names": [v1.readable, v2.readable], "jobs": 3}
    err = capsys.readouterr().err
    assert "prebuild of k3 failed: NVRTC: error: something\n" in err
    assert "bench: dsv3 kernels: 1 compiled, 1 cached," in err
    # a pool that breaks leaves the kernels to their first calls, with a line on stderr, no exception
    monkeypatch.setattr(build, "build", lambda vs, **kw: (_ for _ in ()).throw(RuntimeError("pool broke")))
    common.prebuild(ops, "qwen3 kernels")
    assert "bench: qwen3 kernels: prebuild failed (RuntimeError: pool broke)" in capsys.readouterr().err
