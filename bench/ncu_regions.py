"""Where an sm_90a grouped kernel's warps spend their samples, from an Nsight Compute source dump:

    ncu --clock-control none -k regex:fg_grouped --launch-skip 2 --launch-count 1 \\
        --section SourceCounters --page source --print-source sass --csv \\
        python bench/ncu_one_op.py dswiglu_layer mixtral-l [TILE_M] [CLUSTER_M] > src.csv
    python bench/ncu_regions.py src.csv

prints JSON: the warp-stall samples and their reasons in three regions of the SASS, the
consumers' mainloop (the instructions around the HGMMAs), the epilogue (around the rule's
MUFU.EX2: a rule with a sigmoid or an exponential, as dSwiGLU's) and the rest (mostly the
producer's barrier waits); the share of the mainloop's samples spent waiting on a stage's full
barrier (its try-wait and the branch after it: operand starvation, or a warpgroup's turn), and
the samples at named-barrier waits (ping-pong's order barrier: a warpgroup waiting for its turn).
"""
from __future__ import annotations

import collections
import csv
import json
import re
import sys


def summary(path: str) -> dict:
    lines = open(path, errors="replace").read().splitlines()
    start = [i for i, line in enumerate(lines) if line.startswith('"Address"')]
    if not start:
        raise SystemExit(f"{path}: no SASS table (run ncu with --page source --print-source sass --csv)")
    rows = list(csv.reader(lines[start[0]:]))
    hdr = rows[0]
    idx = {h: j for j, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]

    def num(x: str) -> float:
        return float(x.replace(",", "")) if x.strip() else 0.0

    data = [r for r in rows[1:] if len(r) >= len(hdr)]
    src = [r[idx["Source"]] for r in data]
    smp = [num(r[idx["Warp Stall Sampling (All Samples)"]]) for r in data]
    total = sum(smp) or 1.0
    hg = [k for k, s in enumerate(src) if "HGMMA" in s]
    mu = [k for k, s in enumerate(src) if "MUFU.EX2" in s]

    def region(k: int) -> str:
        if hg and hg[0] - 60 <= k <= hg[-1] + 40:
            return "mainloop"
        if mu and mu[0] - 400 <= k <= mu[-1] + 400:
            return "epilogue"
        return "other"

    agg: dict = collections.defaultdict(collections.Counter)
    for k, r in enumerate(data):
        g = agg[region(k)]
        g["samples"] += smp[k]
        for s in stalls:
            g[s] += num(r[idx[s]])
    out = {"instructions": len(data), "samples": total, "regions": {}}
    for name, c in agg.items():
        t = c["samples"] or 1.0
        out["regions"][name] = {"share_of_samples_pct": round(100 * c["samples"] / total, 1),
                                "stall_share_pct": {s[6:]: round(100 * c[s] / t, 1)
                                                    for s in sorted(stalls, key=lambda s: -c[s])[:7]}}
    waits = [k for k, s in enumerate(src) if "TRYWAIT" in s and region(k) == "mainloop"]
    waited = sum(smp[k] + (smp[k + 1] if k + 1 < len(smp) else 0.0) for k in waits)
    out["k_step_full_wait_pct_of_mainloop"] = round(100 * waited / max(agg["mainloop"]["samples"], 1.0), 1)
    out["named_barrier_wait_samples"] = sum(smp[k] for k, s in enumerate(src) if re.search(r"\bBAR\.SYNC", s))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(json.dumps(summary(sys.argv[1]), indent=1))
