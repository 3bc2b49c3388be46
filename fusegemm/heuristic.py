"""The launch configuration of the BF16 grouped GEMM on sm_100a, from a roofline model.

No Blackwell GPU is available to the project, so sm_100a configurations cannot be timed; this
module ranks them with a model instead, and ``fusegemm.grouped_gemm`` uses its choice on sm_100a
when ``fusegemm tune`` has recorded nothing for the call's bucket (on a B200, a tuning run
replaces the model with measurements). On sm_90a the measured default is kept: the H200 runs
found no configuration beating it beyond noise on the MoE shapes (README, "Tuning").

The model (B200: 148 SMs, dense BF16 2.25 PFLOP/s, HBM 8 TB/s, L2 about 20 TB/s):

* **Units.** A 2-CTA tile (``tile_m`` 256, ``cta_group::2``) occupies two SMs: 74 MMA units;
  1-CTA tiles: 148. A persistent CTA per SM.
* **Tiles and waves.** ``sum_e ceil(rows_e / tile_m) * ceil(N / tile_n)`` tiles (expert rows are
  multiples of 256, so every tile_m divides them); the last wave is partly idle:
  ``waves = ceil(tiles / units)``.
* **Time per tile** = max(MMA, operand traffic). MMA: ``2 * tile_m * tile_n * K`` FLOPs at the
  unit's peak (``tile_m`` 64 per CTA issues UMMA M = 64 at half rate). Operand traffic: each
  tile reads ``(tile_m + tile_n) * K * 2`` bytes through L2; TMA multicast in a cluster shares
  A across ``cluster_n`` CTAs and B across ``cluster_m / ctas_per_tile`` units, so the bytes a
  unit pulls are divided accordingly; a unit's L2 share is 20 TB/s / 148 per SM.
* **Total** = waves x time per tile, at least the HBM floor (A, B and D once at 8 TB/s), plus a
  fixed 4 us for launch and the pipeline's fill and drain.

Candidates are the sm_100a implementation's tiles (64/128/256 x 128/256) and clusters (1x1,
2x1, 2x2, 4x1; 2-CTA tiles need an even cluster M), static scheduling. Ties (within 2%) keep the
spec's default (256x256, cluster 2x1), which is also what large problems get.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Machine", "B200", "Config", "estimate_us", "choose", "table"]


@dataclass(frozen=True)
class Machine:
    """The numbers the model uses.

    Attributes
    ----------
    sms : int
        Streaming multiprocessors.
    bf16_tflops : float
        Dense BF16 peak (TFLOP/s).
    hbm_tbps : float
        HBM bandwidth (TB/s).
    l2_tbps : float
        L2 bandwidth (TB/s).
    fixed_us : float
        Launch, pipeline fill and drain per GEMM (us).
    """

    sms: int
    bf16_tflops: float
    hbm_tbps: float
    l2_tbps: float
    fixed_us: float


B200 = Machine(sms=148, bf16_tflops=2250.0, hbm_tbps=8.0, l2_tbps=20.0, fixed_us=4.0)


@dataclass(frozen=True)
class Config:
    """One sm_100a launch configuration.

    Attributes
    ----------
    tile : (int, int)
        The MMA tile (M, N); M 256 is a 2-CTA tile.
    cluster : (int, int)
        Thread-block cluster (M, N).
    """

    tile: tuple[int, int]
    cluster: tuple[int, int]

    @property
    def label(self) -> str:
        return f"{self.tile[0]}x{self.tile[1]}/c{self.cluster[0]}x{self.cluster[1]}"


DEFAULT = Config((256, 256), (2, 1))
CANDIDATES = tuple(Config((tm, tn), cl) for tm in (64, 128, 256) for tn in (128, 256)
                   for cl in ((1, 1), (2, 1), (2, 2), (4, 1)) if tm != 256 or cl[0] % 2 == 0)


def estimate_us(cfg: Config, rows: Sequence[int], n: int, k: int, machine: Machine = B200) -> float:
    """Modelled microseconds of one grouped GEMM (BF16 A/B, BF16 D) with ``cfg``.

    Parameters
    ----------
    cfg : Config
    rows : sequence of int
        Each expert's rows (multiples of 256; 0 for an empty expert).
    n : int
        N.
    k : int
        K.
    machine : Machine
        The GPU's numbers (default B200).
    """
    tm, tn = cfg.tile
    ctas = 2 if tm == 256 else 1
    units = machine.sms // ctas
    tiles = sum(math.ceil(r / tm) for r in rows) * math.ceil(n / tn)
    if tiles == 0:
        return machine.fixed_us
    waves = math.ceil(tiles / units)
    per_sm = machine.bf16_tflops * 1e12 / machine.sms
    rate = per_sm * ctas * (0.5 if tm // ctas == 64 else 1.0)
    mma_s = 2.0 * tm * tn * k / rate
    cm, cn = cfg.cluster
    share_a, share_b = cn, max(1, cm // ctas)          # TMA multicast within the cluster
    bytes_unit = (tm * k * 2) / share_a + (tn * k * 2) / share_b
    l2_s = bytes_unit / (machine.l2_tbps * 1e12 / machine.sms * ctas)
    total_s = waves * max(mma_s, l2_s)
    m = sum(rows)
    hbm_s = (m * k * 2 + len(rows) * n * k * 2 + m * n * 2) / (machine.hbm_tbps * 1e12)
    return max(total_s, hbm_s) * 1e6 + machine.fixed_us


def choose(rows: Sequence[int], n: int, k: int, machine: Machine = B200, tie: float = 0.02) -> Config:
    """The configuration the model ranks first; the default unless another is ``tie`` better.

    Parameters
    ----------
    rows : sequence of int
        Each expert's rows (multiples of 256).
    n : int
        N.
    k : int
        K.
    machine : Machine
        The GPU's numbers.
    tie : float
        A candidate must beat the default by more than this fraction to be chosen.
    """
    times = {c: estimate_us(c, rows, n, k, machine) for c in CANDIDATES}
    best = min(times, key=times.get)
    return best if times[DEFAULT] > times[best] * (1 + tie) else DEFAULT


def table(shapes: dict[str, tuple[Sequence[int], int, int]], machine: Machine = B200) -> list[dict]:
    """For each named shape: the chosen configuration, its modelled time and the default's.

    Parameters
    ----------
    shapes : dict
        name -> (rows per expert, N, K).
    machine : Machine
        The GPU's numbers.
    """
    out = []
    for name, (rows, n, k) in shapes.items():
        c = choose(rows, n, k, machine)
        out.append({"shape": name, "choice": c.label, "us": round(estimate_us(c, rows, n, k, machine), 1),
                    "default_us": round(estimate_us(DEFAULT, rows, n, k, machine), 1)})
    return out
