"""Forward + backward step of the whole MoE layer (``fusegemm.moe.MoEBlock``: routing, gather,
expert MLP, combine) against the same layer in plain torch, in the same run; prints JSON.

The torch layer is what a framework runs without fusegemm: softmax top-k, the token copies
sorted by expert (``argsort``, ``index_select``), ``torch._grouped_mm`` for fc1 and fc2 with
SwiGLU between them, and ``index_add_`` back into token order. Both read the same weights and
routing logits. One step: ``y = layer(x, logits)``, ``y.backward(dy)`` (gradients of x, the
logits and both weights). Times are CUDA-event medians over interleaved rounds; ``speedup`` is
torch_ms / fusegemm_ms, ``speedup_vs_torch_rounds`` each round's own ratio (median, min, max: the
spread a clock-capped board puts between rounds; each ``--also`` variant's against the block likewise,
``V_vs_fusegemm_rounds``, above 1 when the variant is faster); peak memory is
``torch.cuda.max_memory_allocated`` over one step of each, every method's gradients cleared first.
Issue 33's target: >= 1.5x on these layers (``MoEBlock`` on sm_90a reads the token rows through
the routing's index inside its GEMMs, ``loads="gathered"``, ``fusegemm.moe.RoutedMLPFunction``, and
combines with a one-pass kernel; ``loads="permuted"`` gathers the rows first with the permutation
kernel, fusegemm/permute.py).

    python bench/moe_layer.py [--layers dsv3-8,dsv3-32,mixtral,qwen3] [--graph] [--out FILE]

``--graph`` captures each step in a CUDA graph first (both layers) and times the replays: the
GPU time without the host's launch gaps, what a framework that captures its step runs.
``--profile`` adds, per layer and method, the kernels' time per eager step (per replay with
``--graph``), the GEMM kernels' share of it and the top kernels (torch.profiler), and the time
no device operation covers (``idle_ms_per_step``) with the transitions it falls between
(``top_gaps``: previous -> next operation).
``--calls`` adds each method's kernels of one eager step in launch order (``<method>_calls``: ms and
name, the median of three steps), where ``--profile``'s totals by name merge a kernel's calls.
``--power SECONDS`` runs each method alone for that long after the rounds (graphed with ``--graph``) while
nvidia-smi samples the SM clock, the board's power and the clock-event reasons (``<method>_sustained``:
``_common.sustained``, bench/ceiling.py's windows: ms per step, the clock and power past the window's first
0.8 s, the energy of a step at that power, the share of samples the power cap held, the reasons seen). The
rounds share one clock state between the methods; on a power-capped board each method's own load sets a clock
of its own.
``--host`` adds each method's host time to issue one eager step (the GPU kept busy ahead of it)
and cProfile's top functions by own time.
``--also block-no-ends,routed,routed-no-ends,routed-gathered,routed-gathered-swapped`` times, in the
same rounds, the block without the routing's row ends and the same layer through
``fusegemm.moe.RoutedMLPFunction`` (with the row ends, without them, with gathered loads as well,
and with fc1's weight gradient swapped, ``moe.SWAPPED_WGRAD``: X gathered as A, D stored M-major;
``routed-stored``: fc1 and the dSwiGLU GEMM gather their rows and store them for the weight gradients,
``moe.STORED_GATHERS``; ``routed-stored-forward``: fc1 only):
``<variant>_ms``, its speedup over torch and its largest difference from the block's output.
``--also token-order`` times the block with its gathers in token order (``routing.TOKEN_ORDER``),
``--also unzeroed-padding`` with its GEMMs' unwritten padding rows left unzeroed
(``moe.UNZEROED_PADDING``: four tail-zeroing launches less), ``--also token-order-unzeroed``
with both.
``--also block-again`` times the block itself a second time: a null control, whose ratio to the block
in the same rounds (``block-again_vs_fusegemm_rounds``) is what the method's noise and a variant's place
in the round alone give.
``--also block-permuted`` / ``block-gathered`` time ``MoEBlock(loads="permuted")`` / ``loads="gathered"``
on the block's parameters (the block itself: ``loads="auto"``, the default).
``--capture-reverse`` (with ``--graph``) captures the methods' graphs in reverse order.
``--also fp8-block`` times the block with its expert MLP on the blockwise FP8 recipe
(``recipe="fp8_block"``, the same weights; its difference is the recipe's rounding).
"""
from __future__ import annotations

import argparse
import contextlib
import copy

from _common import add_power_argument, interleaved_ms, kernel_calls, kernel_table, power_rows, round_ratios, run_layers

# name: (experts, tokens, hidden, intermediate, top_k)
LAYERS = {
    "dsv3-8": (8, 4096, 7168, 2048, 8),
    "dsv3-32": (32, 4096, 7168, 2048, 8),
    "mixtral": (8, 4096, 4096, 14336, 2),
    "qwen3": (128, 4096, 2048, 768, 8),
}


class TokenOrder:
    """``block`` on its permuted path (``loads="permuted"``) with its gathers (x forward, dy
    backward) in token order (``fusegemm.routing.TOKEN_ORDER``, set around the step by :func:`_loads`)."""

    token_order = True

    def __init__(self, block):
        self.block = with_loads(block, "permuted")

    def __call__(self, x, logits):
        return self.block(x, logits)


class UnzeroedPadding(TokenOrder):
    """``block`` on its permuted path with ``fusegemm.moe.UNZEROED_PADDING`` set around the step."""

    token_order = False
    unzeroed = True


class TokenOrderUnzeroed(TokenOrder):
    """Both: token-order gathers and unzeroed padding."""

    unzeroed = True


class BlockNoEnds:
    """``block``'s own layer (permuted rows) without the routing's row ends: every GEMM runs the
    padding's tiles."""

    gathered = False

    def __init__(self, block):
        self.block = block

    def __call__(self, x, logits):
        from fusegemm.routing import combine, gather, route, row_probs
        b = self.block
        r = route(logits, b.top_k, normalize=b.normalize)
        return combine(b.mlp(gather(x, r), r.padded_offsets, row_probs(r)), r)


class RoutedLayer:
    """``block``'s layer through ``RoutedMLPFunction`` (the permutation and padding inside the
    GEMMs); ``ends``: pass the routing's row ends; ``gathered``: ``moe.GATHERED_LOADS`` for the call
    (set around forward and backward by :func:`bench_layer`'s step); ``swapped``:
    ``moe.SWAPPED_WGRAD`` likewise, ``stored``: ``moe.STORED_GATHERS``."""

    def __init__(self, block, ends: bool, gathered: bool, swapped: bool = False, stored: bool | str = False):
        self.block, self.ends, self.gathered, self.swapped, self.stored = block, ends, gathered, swapped, stored

    def __call__(self, x, logits):
        from fusegemm.moe import RoutedMLPFunction
        from fusegemm.routing import route, row_probs
        b = self.block
        r = route(logits, b.top_k, normalize=b.normalize)
        return RoutedMLPFunction.apply(x, r.token_of_row, r.row_of, r.padded_offsets,
                                       r.row_ends if self.ends else None, row_probs(r), b.mlp.w1, b.mlp.w2)


def fp8_block_layer(block):
    """``block``'s layer with its expert MLP on the blockwise FP8 recipe (``recipe="fp8_block"``:
    DeepSeek-V3's scaling, sm_90a kernels, the weights quantized every step): a ``MoEBlock`` of the
    same shape and routing holding ``block``'s own parameters, so the same routing, row ends and
    permutations with the expert GEMMs on FP8 operands. Its output differs from the block's by the
    recipe's rounding (about 6%: issue 31's MoE layer recipe)."""
    from fusegemm.moe import MoEBlock
    experts, inter2, hidden = block.mlp.w1.shape
    layer = MoEBlock(hidden, inter2 // 2, experts, block.top_k, normalize=block.normalize, dtype=block.mlp.w1.dtype,
                     backend=block.mlp.backend, recipe="fp8_block", device=block.mlp.w1.device)
    layer.mlp.w1, layer.mlp.w2 = block.mlp.w1, block.mlp.w2   # the block's own parameters
    return layer


# --also: each variant's layer on the block
def with_loads(block, loads: str):
    """The block with ``loads`` (its own parameters): "gathered", RoutedMLPFunction's gathered
    kernels; "permuted", the gather kernel and the GEMMs on permuted rows ("auto", the default,
    picks one by the intermediate size)."""
    layer = copy.copy(block)   # (shares the submodules, so the parameters and their gradients)
    layer.loads = loads
    return layer


VARIANTS = {"block-again": lambda b: b, "block-gathered": lambda b: with_loads(b, "gathered"),
            "block-permuted": lambda b: with_loads(b, "permuted"), "block-no-ends": BlockNoEnds,
            "fp8-block": fp8_block_layer, "token-order": TokenOrder,
            "unzeroed-padding": UnzeroedPadding, "token-order-unzeroed": TokenOrderUnzeroed,
            "routed": lambda b: RoutedLayer(b, ends=True, gathered=False),
            "routed-no-ends": lambda b: RoutedLayer(b, ends=False, gathered=False),
            "routed-gathered": lambda b: RoutedLayer(b, ends=True, gathered=True),
            "routed-gathered-swapped": lambda b: RoutedLayer(b, ends=True, gathered=True, swapped=True),
            "routed-stored": lambda b: RoutedLayer(b, ends=True, gathered=False, stored=True),
            "routed-stored-forward": lambda b: RoutedLayer(b, ends=True, gathered=False, stored="forward")}


@contextlib.contextmanager
def _loads(layer):
    """``moe.GATHERED_LOADS``, ``moe.SWAPPED_WGRAD``, ``moe.STORED_GATHERS``, ``moe.UNZEROED_PADDING`` and
    ``routing.TOKEN_ORDER`` as ``layer`` asks (a RoutedLayer's ``gathered`` and ``swapped``, a
    TokenOrder's ``token_order``, an UnzeroedPadding's ``unzeroed``; what a layer does not name
    keeps the module's value), restored after."""
    import fusegemm.moe as moe
    import fusegemm.routing as routing
    switches = {(moe, "GATHERED_LOADS"): "gathered", (moe, "SWAPPED_WGRAD"): "swapped",
                (moe, "STORED_GATHERS"): "stored",
                (routing, "TOKEN_ORDER"): "token_order", (moe, "UNZEROED_PADDING"): "unzeroed"}
    before = {key: getattr(*key) for key in switches}
    for (mod, name), attr in switches.items():   # (a layer that names none: the modules' defaults)
        setattr(mod, name, getattr(layer, attr, before[(mod, name)]))
    try:
        yield
    finally:
        for (mod, name), value in before.items():
            setattr(mod, name, value)


class TorchLayer:
    """The plain torch MoE layer on ``w1`` (E, 2F, H; fusegemm's gate/up interleave) and ``w2``."""

    def __init__(self, w1, w2, top_k):
        self.w1, self.w2, self.top_k = w1, w2, top_k

    def __call__(self, x, logits):
        import torch

        from fusegemm.moe import split_gate_up
        probs, experts = torch.softmax(logits.float(), -1).topk(self.top_k, -1)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tokens = order // self.top_k
        counts = torch.zeros(self.w1.shape[0], dtype=torch.int64, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat))
        offs = counts.cumsum(0).to(torch.int32)
        g = torch._grouped_mm(x.index_select(0, tokens), self.w1.transpose(1, 2), offs=offs)
        gate, up = split_gate_up(g.float())
        h = (torch.nn.functional.silu(gate) * up * probs.reshape(-1)[order][:, None]).to(x.dtype)
        y = torch._grouped_mm(h, self.w2.transpose(1, 2), offs=offs)
        return torch.zeros_like(x).index_add_(0, tokens, y)


def step_peaks(methods: dict, tensors, memory) -> dict[str, float]:
    """Each method's peak allocated memory (GiB) over one step, taken with ``memory``'s counters
    (``torch.cuda``), with the gradients of every tensor in ``tensors`` cleared first, not only
    the method's own: a step's peak would otherwise count the gradients an earlier method left
    (both layers' weights' at dsv3 with 32 experts, 2.6 GiB, charged to torch and to every variant
    before 2026-12-06)."""
    peaks = {}
    for key, run in methods.items():
        for t in tensors:
            t.grad = None
        memory.synchronize()
        memory.reset_peak_memory_stats()
        run()
        memory.synchronize()
        peaks[key] = memory.max_memory_allocated() / 2 ** 30
    return peaks


def bench_layer(name: str, args) -> dict:
    import torch

    from fusegemm.moe import MoEBlock
    experts, tokens, hidden, inter, top_k = LAYERS[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(tokens, hidden, generator=g, device="cuda") * 0.5).bfloat16().requires_grad_()
    logits = torch.randn(tokens, experts, generator=g, device="cuda").requires_grad_()
    dy = torch.randn(tokens, hidden, generator=g, device="cuda").bfloat16()
    ours = MoEBlock(hidden, inter, experts, top_k, device="cuda", generator=torch.Generator().manual_seed(1))
    w1 = ours.mlp.w1.detach().clone().requires_grad_()
    w2 = ours.mlp.w2.detach().clone().requires_grad_()
    peer = TorchLayer(w1, w2, top_k)
    row = {"layer": name, "experts": experts, "tokens": tokens, "hidden": hidden, "intermediate": inter,
           "top_k": top_k}

    def step(layer, params):
        def run():
            for p in (x, logits, *params):
                p.grad = None
            with _loads(layer):
                layer(x, logits).backward(dy)
        return run

    methods = {"fusegemm": step(ours, (ours.mlp.w1, ours.mlp.w2)), "torch": step(peer, (w1, w2))}
    with torch.no_grad():
        yo, yt = ours(x, logits).float(), peer(x, logits).float()
    row["rel_diff_y_vs_torch"] = float((yo - yt).norm() / yt.norm())
    for v in args.also:
        layer = VARIANTS[v](ours)
        methods[v] = step(layer, (ours.mlp.w1, ours.mlp.w2))
        with torch.no_grad(), _loads(layer):
            row[f"{v}_max_abs_diff_vs_fusegemm"] = float((layer(x, logits).float() - yo).abs().max())
    for key, gib in step_peaks(methods, (x, logits, ours.mlp.w1, ours.mlp.w2, w1, w2), torch.cuda).items():
        row[f"{key}_peak_gib"] = gib
    eager = methods
    if args.graph:      # after the eager peaks: a graph's pool is allocated once, at capture
        # (--capture-reverse: the last method's graph captured first, the timing order unchanged)
        order = list(methods)[::-1] if args.capture_reverse else list(methods)
        graphs = {key: _graphed(methods[key]) for key in order}
        methods = {key: graphs[key] for key in methods}
    rounds: dict[str, list[float]] = {}
    for key, ms in interleaved_ms(methods, args, rounds_out=rounds).items():
        row[f"{key}_ms"] = ms
    if args.host:
        for key, run in eager.items():
            row[f"{key}_host"] = _host_table(run)
    if args.profile:    # after the timing: the profiler's hooks outlive it and slow the host
        # With --graph the replays are profiled (the GPU idle inside the graph itself, and the
        # kernels' times under the timing's sustained load).
        for key, run in (methods if args.graph else eager).items():
            row[f"{key}_kernels"] = kernel_table(run)
    if args.calls:      # eager steps, with --graph too (how the results under bench/results were taken)
        for key, run in eager.items():
            row[f"{key}_calls"] = kernel_calls(run, min_ms=0.01)
    if args.power:      # each method alone (replays with --graph), after the rounds and the tables
        power = power_rows(methods, args.power, "fusegemm")
        for key, window in power["sustained"].items():
            row[f"{key}_sustained"] = window
        # At the power cap a step's time is its energy over the cap, so the speed-up follows this ratio.
        row["torch_joules_over_fusegemm"] = power["joules_vs_fusegemm"].get("torch")
    row["speedup_vs_torch"] = row["torch_ms"] / row["fusegemm_ms"]
    # Each round's own ratio (both timed under that round's clocks): the median and the range.
    row["speedup_vs_torch_rounds"] = round_ratios(rounds, "torch", "fusegemm")
    for v in args.also:
        row[f"{v}_vs_torch"] = row["torch_ms"] / row[f"{v}_ms"]
        row[f"{v}_vs_fusegemm_rounds"] = round_ratios(rounds, "fusegemm", v)
    torch.cuda.empty_cache()
    return row


def _host_table(run, steps: int = 3, top: int = 25) -> dict:
    """The host's time to issue one eager step while the GPU is kept busy (a sleep kernel ahead
    of it, so no call waits on the GPU unless it synchronises), and cProfile's top functions by
    own time over ``steps`` steps (ms per step, calls per step, function)."""
    import cProfile
    import pstats
    import time

    import torch
    run()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(3e9))   # cycles: about 1.5 s at the H200's clocks
    start = time.perf_counter()
    for _ in range(steps):
        run()
    issue = (time.perf_counter() - start) * 1e3 / steps
    torch.cuda.synchronize()
    torch.cuda._sleep(int(3e9))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        run()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats
    rows = sorted(((tt, nc, f"{fn[2]} {fn[0].rsplit('/', 2)[-1]}:{fn[1]}", ct)
                   for fn, (_, nc, tt, ct, _) in stats.items()), reverse=True)[:top]
    return {"issue_ms_per_step": issue,
            "top_own": [(tt * 1e3 / steps, nc // steps, name, ct * 1e3 / steps) for tt, nc, name, ct in rows]}


def _graphed(run):
    """``run`` (one step) captured in a CUDA graph after two warm-up steps on a side stream; the
    replay, which is what a framework that captures its training step launches."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--graph", action="store_true", help="time both steps as CUDA-graph replays (no host gaps)")
    ap.add_argument("--capture-reverse", action="store_true",
                    help="with --graph, capture the methods' graphs in reverse order (the null control's "
                         "offset against capture order: bench/results/moe_layer_h100_capture_order_*.json)")
    ap.add_argument("--profile", action="store_true",
                    help="add each layer's kernel-time table (torch.profiler; eager steps, or the replays "
                         "with --graph) to the JSON")
    ap.add_argument("--calls", action="store_true",
                    help="add each method's kernels of one eager step in launch order (ms, name; 10 us and "
                         "up), so that each GEMM can be set beside the peer's of the same role")
    add_power_argument(ap)
    ap.add_argument("--host", action="store_true",
                    help="add each method's host time to issue an eager step and its cProfile top functions")
    ap.add_argument("--also", default="", help="variants timed beside the block in the same rounds: "
                    + ", ".join(VARIANTS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    args.also = [v for v in args.also.split(",") if v]
    for v in args.also:
        if v not in VARIANTS:
            ap.error(f"--also: got {v!r}; allowed: {', '.join(VARIANTS)}")

    def summary(r: dict) -> str:
        split = ""
        if args.profile:
            ours, peer = r["fusegemm_kernels"], r["torch_kernels"]
            split = (f"  GEMMs {ours['gemm_ms_per_step']:.2f} / {peer['gemm_ms_per_step']:.2f} ms of kernels "
                     f"{ours['kernel_ms_per_step']:.2f} / {peer['kernel_ms_per_step']:.2f} ms, GPU idle "
                     f"{ours['idle_ms_per_step']:.2f} / {peer['idle_ms_per_step']:.2f} ms")
        also = "".join(f"  {v} {r[v + '_ms']:.2f} ms x{r[v + '_vs_torch']:.2f}" for v in args.also)
        if args.power:
            ours, peer = r["fusegemm_sustained"], r["torch_sustained"]
            split += (f"  alone {ours['ms']:.2f} / {peer['ms']:.2f} ms at {ours['sm_mhz'] or 0:.0f} / "
                      f"{peer['sm_mhz'] or 0:.0f} MHz, {ours['watts'] or 0:.0f} / {peer['watts'] or 0:.0f} W, "
                      f"{ours['joules'] or 0:.2f} / {peer['joules'] or 0:.2f} J a step, power-capped "
                      f"{ours['power_capped'] or 0:.0%} / {peer['power_capped'] or 0:.0%} of the samples")
        rr = r["speedup_vs_torch_rounds"]
        return (f"fusegemm {r['fusegemm_ms']:.2f} ms  torch {r['torch_ms']:.2f} ms  x{r['speedup_vs_torch']:.2f} "
                f"(rounds x{rr['min']:.2f}-{rr['max']:.2f})  "
                f"peak {r['fusegemm_peak_gib']:.1f} / {r['torch_peak_gib']:.1f} GiB" + also + split)
    return run_layers(args, LAYERS, bench_layer, summary,
                      "MoE layer forward + backward step (routing, gather, expert MLP, combine) vs torch",
                      note="; each step a CUDA-graph replay" if args.graph else "; eager steps", graph=args.graph)


if __name__ == "__main__":
    raise SystemExit(main())
