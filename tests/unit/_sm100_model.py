"""The CUTLASS multicast protocol, written independently of the headers, for the sm_100a
static checks: the launch clusters every kernel exports its multicast table for, the C++ that
tabulates it from the kernel's own Frame, CUTLASS's formulas and a one-stage pipeline simulation.
Used by _sm100.py (the harness) and the two test files."""
from __future__ import annotations

# ---------------------------------------------------------------------------------------------
# Launch clusters whose multicast protocol every variant exports: (cluster_m, cluster_n, CTAs of
# the launch cluster). The last rows are what an older host (zeros) or an inconsistent shape
# produce: the kernel must fall back to pairs only.
# ---------------------------------------------------------------------------------------------
CLUSTERS = {
    1: [(1, 1, 1), (2, 1, 2), (1, 2, 2), (2, 2, 4), (4, 1, 4), (1, 4, 4), (4, 2, 8), (2, 4, 8),
        (4, 4, 16), (3, 1, 3), (0, 0, 1), (0, 0, 4), (2, 2, 8), (1, 2, 4)],
    2: [(2, 1, 2), (4, 1, 4), (2, 2, 4), (4, 2, 8), (2, 4, 8), (4, 4, 16), (0, 0, 2), (0, 0, 8),
        (1, 2, 2), (2, 2, 8)],
}
MC_FIELDS = ("mi", "ni", "base", "size", "a_mask", "b_mask", "commit", "pair", "empty", "ring", "issues")
MC_SLICES, MC_KBLOCKS = 4, 8
# issues (what the CTA loads when its operands are shared): bit i = A slice i, bit 4 + i = B
# slice i, bit 8 + kb = the SFA box of k-block kb, bit 16 + kb = the SFB box.


# What every CTA computes, tabulated at compile time from the kernel's own Frame (the same
# constexpr functions the kernel runs) for each launch cluster of CLUSTERS.
_MC_FN = """
namespace fusegemm_test {
template <int N> struct Ints { int v[N]; };
template <class F, int kRows, int kShapes>
constexpr Ints<kRows * 11> mc_table(const int (&shapes)[kShapes][3]) {
  Ints<kRows * 11> t{};
  int i = 0;
  for (int s = 0; s < kShapes; ++s) {
    for (int r = 0; r < shapes[s][2]; ++r) {
      const auto g = F::Geom::make(shapes[s][0], shapes[s][1], r, shapes[s][2]);
      const auto sa = F::share_a_of(g);
      const auto sb = F::share_b_of(g, true);
      int issues = 0;
      for (int j = 0; j < 4; ++j) issues |= (int(sa.issues_slice(j)) << j) | (int(sb.issues_slice(j)) << (4 + j));
      for (int kb = 0; kb < 8; ++kb) issues |= (int(sa.issues_whole(kb)) << (8 + kb)) | (int(sb.issues_whole(kb)) << (16 + kb));
      const int row[11] = {g.mi, g.ni, g.base, g.size(), int(g.a_mask()), int(g.b_mask()),
                           int(F::stage_commit_mask(g)), int(g.pair_mask()), int(F::empty_count(g)),
                           int(F::ring_empty_count(g)), issues};
      for (int k = 0; k < 11; ++k) t.v[i++] = row[k];
    }
  }
  return t;
}
}  // namespace fusegemm_test
"""


def mc_table_cpp(frame: str, cg: int, symbol: str) -> str:
    """C++ defining ``symbol``: the multicast table of ``frame`` (a KernelFrame type)."""
    shapes = CLUSTERS[cg]
    rows = sum(ncta for _, _, ncta in shapes)
    init = ", ".join(f"{{{cm}, {cn}, {n}}}" for cm, cn, n in shapes)
    return (f"constexpr int {symbol}_shapes[][3] = {{{init}}};\n"
            f'extern "C" __device__ __attribute__((used)) const fusegemm_test::Ints<{rows * len(MC_FIELDS)}> '
            f"{symbol} = fusegemm_test::mc_table<{frame}, {rows}>({symbol}_shapes);\n")


# ---------------------------------------------------------------------------------------------
# The multicast protocol, independently: CUTLASS's formulas, then a one-stage simulation.
# ---------------------------------------------------------------------------------------------
def cutlass_model(cg: int, cluster_m: int, cluster_n: int, ncta: int, r: int) -> dict[str, int]:
    """What CTA ``r`` must compute, from CUTLASS's definitions: the vmnk coordinates of
    tiled_divide(cluster, AtomThrID) (v = pair half, m = MMA unit, n), create_tma_multicast_mask
    <2> (A: every n) / <1> (B: every m), calculate_multicast_mask<kRowCol> (release: same unit
    row or same n), calculate_umma_peer_mask (the pair), PipelineTmaUmmaAsync's consumer count
    and our ring count (TMA + 4 epilogue warps per CTA, one MMA warp per unit)."""
    legal = cluster_m >= 1 and cluster_n >= 1 and cluster_m % cg == 0 and cluster_m * cluster_n == ncta <= 16
    cm, cn = (cluster_m, cluster_n) if legal else (cg, 1)
    size = cm * cn
    base = r - r % size
    x, y = (r - base) % cm, (r - base) // cm
    ctas = [(xx, yy) for yy in range(cn) for xx in range(cm)]

    def mask(pred) -> int:
        return sum(1 << (base + xx + cm * yy) for xx, yy in ctas if pred(xx, yy))

    return {"mi": x, "ni": y, "base": base, "size": size,
            "a_mask": mask(lambda xx, yy: xx % cg == x % cg and xx // cg == x // cg),
            "b_mask": mask(lambda xx, yy: xx % cg == x % cg and yy == y),
            "commit": mask(lambda xx, yy: xx // cg == x // cg or yy == y),
            "pair": mask(lambda xx, yy: xx // cg == x // cg and yy == y),
            "empty": cm // cg + cn - 1, "ring": size * 5 + size // cg}


def mc_rows(cg: int, table: tuple[int, ...]):
    n, i = len(MC_FIELDS), 0
    for cm, cn, ncta in CLUSTERS[cg]:
        rows = [dict(zip(MC_FIELDS, table[(i + r) * n:(i + r + 1) * n])) for r in range(ncta)]
        i += ncta
        yield (cm, cn, ncta), rows


def _simulate(cg: int, tag: str, rows: list[dict[str, int]]) -> list[str]:
    """One stage of the pipeline on the kernel's table (CTAs = ranks, MMA units = even ranks of a
    pair): every A/B slice and SF box reaches every CTA exactly once, from a member of its share
    group; every member loads part of every stage; each empty barrier receives exactly its count
    of releases; every CTA a producer writes into releases the stage to that producer; and no
    unit can release round r+1 of a stage before every unit released round r (its full barrier
    waits, through the producers that fill it, on every unit's release), so no empty barrier can
    count a release in the wrong phase."""
    out, n = [], len(rows)
    units = [r for r in range(n) if rows[r]["mi"] % cg == 0]
    unit_of = {r: r - rows[r]["mi"] % cg for r in range(n)}
    releasers = {x: {u for u in units if rows[u]["commit"] >> x & 1} for x in range(n)}
    for d in range(n):
        if len(releasers[d]) != rows[d]["empty"]:
            out.append(f"multicast: {tag} rank {d}: {len(releasers[d])} stage releases per phase, "
                       f"empty barrier counts {rows[d]['empty']}")
    for same_b in (True, False):
        for kb in range(MC_KBLOCKS):  # the stage of k-block kb
            writers = {d: {d} for d in range(n)}  # CTAs whose loads land in d's stage
            for op, key, first, sf_bit in (("A", "a_mask", 0, 8 + kb), ("B", "b_mask", 4, 16 + kb)):
                for d in range(n):
                    group = [x for x in range(n) if rows[d][key] >> x & 1]
                    if len(group) == 1:  # private: the CTA loads every slice itself
                        if (rows[d]["issues"] >> first) & 0xF != 0xF:
                            out.append(f"multicast: {tag} rank {d} does not load all of its private {op}")
                        continue
                    if op == "B" and not same_b:  # a block across experts: every CTA loads its own B
                        continue
                    for x in group:
                        if rows[x][key] != rows[d][key]:
                            out.append(f"multicast: {tag}: ranks {x} and {d} disagree on the {op} group")
                        if (rows[x]["issues"] >> first) & 0xF == 0:
                            out.append(f"multicast: {tag}: rank {x} loads no {op} slice (the stages of its "
                                       f"group would not wait for its empty barrier)")
                    for bit in [first + i for i in range(MC_SLICES)] + [sf_bit]:
                        src = [x for x in group if rows[x]["issues"] >> bit & 1]
                        if len(src) != 1:
                            out.append(f"multicast: {tag}: {op} bit {bit} reaches rank {d} from {src}")
                        writers[d] |= set(src)
            for d in range(n):
                for x in writers[d]:
                    if unit_of[d] not in releasers[x]:
                        out.append(f"multicast: {tag}: rank {x} writes into rank {d}, whose MMA unit (rank "
                                   f"{unit_of[d]}) never releases the stage to it")
            for u in units:
                feeders = {u} | set().union(*(writers[d] for d in range(u, u + cg)))
                waits = set().union(*(releasers[x] for x in feeders))
                peers = {v for v in units if rows[v]["base"] == rows[u]["base"]}  # its sub-cluster
                if waits != peers:
                    out.append(f"multicast: {tag} (B shared: {same_b}): unit {u} can release a stage a "
                               f"round ahead of units {sorted(peers - waits)}")
    return list(dict.fromkeys(out))


def mc_problems(cg: int, table: tuple[int, ...]) -> list[str]:
    """The kernel's multicast table against CUTLASS's formulas, then a simulated stage."""
    out = []
    want_len = sum(ncta for _, _, ncta in CLUSTERS[cg]) * len(MC_FIELDS)
    if len(table) != want_len:
        return [f"multicast: table of {len(table)} values, expected {want_len} (cta_group {cg})"]
    for (cm, cn, ncta), rows in mc_rows(cg, table):
        tag = f"cluster {cm}x{cn} ({ncta} CTAs)"
        for r, row in enumerate(rows):
            want = cutlass_model(cg, cm, cn, ncta, r)
            bad = {k: (row[k], v) for k, v in want.items() if row[k] != v}
            if bad:
                out.append(f"multicast: {tag} rank {r}: (got, expected) {bad}")
        if out:
            return out
        out += _simulate(cg, tag, rows)
    return out
