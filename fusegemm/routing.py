"""MoE routing on the device, with no host synchronisation: top-k over the router's logits, then
the permutation of each token's k copies into expert-sorted rows padded per expert to multiples
of 256 (``padded_offsets``, the layout every grouped family and :class:`fusegemm.moe.ExpertMLP`
read), and back.

    r = route(logits, top_k=2)                       # logits (T, E)
    x_rows = gather(x, r)                            # (r.rows, H): row i holds token r.token_of_row[i]
    y_rows = mlp(x_rows, r.padded_offsets, row_probs(r))
    y = combine(y_rows, r)                           # (T, H): the sum over each token's k rows

Every shape depends on (tokens, experts, top_k) only, never on the data: the rows are the bound
``R = round_up(T * k + 255 * E, 256)`` (each expert pads fewer than 256 rows), rows past
``padded_offsets[-1]`` and an expert's padding rows read token -1 (zeros). So no step reads a
value back to the host: the functions run inside CUDA graphs and on meta tensors (tested), and
autograd differentiates each (the probabilities through ``row_probs``, x through ``gather``, the
rows through ``combine``).

Within an expert, rows follow token order (a stable sort), so a routing is deterministic, and
``combine`` sums each token's k rows in choice order (no atomics). On CUDA tensors the routing's
rows (after the top-k), ``gather`` and ``combine`` run one kernel each (fusegemm/permute.py; torch
custom ops under torch.compile), elsewhere torch's operations, with the same values.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .arguments import M_ALIGNED
from .base.errors import ArgumentError
from . import permute

__all__ = ["Routing", "route", "top_k", "gather", "row_probs", "combine", "padded_rows", "check_choice", "check_logits",
           "token_rows"]


@dataclass(frozen=True)
class Routing:
    """Where each token's k copies go.

    Attributes
    ----------
    probs : (T, k) float32
        The routing weight of each choice (softmax over the experts, the top k; renormalized over
        them with ``normalize``); differentiable with respect to the logits.
    experts : (T, k) int64
        The chosen experts, in descending probability.
    padded_offsets : (E,) int32
        Each expert's end row: nondecreasing multiples of 256.
    row_of : (T, k) int64
        The row of each (token, choice).
    token_of_row : (R,) int64
        The token each row reads, -1 for padding rows.
    row_ends : (E,) int32
        Where each expert's rows end before its padding (its first padding row): the grouped
        ops' ``row_ends``, with which the sm_90a kernels skip padding tiles.
    """

    probs: Tensor
    experts: Tensor
    padded_offsets: Tensor
    row_of: Tensor
    token_of_row: Tensor
    row_ends: Tensor

    @property
    def rows(self) -> int:
        """R, the row count of the grouped problem (a multiple of 256)."""
        return self.token_of_row.shape[0]


def padded_rows(tokens: int, experts: int, top_k: int) -> int:
    """R: the rows a routing of ``tokens`` over ``experts`` with ``top_k`` occupies at most."""
    return -(-(tokens * top_k + (M_ALIGNED - 1) * experts) // M_ALIGNED) * M_ALIGNED


def top_k(logits: Tensor, k: int, *, normalize: bool = False) -> tuple[Tensor, Tensor]:
    """(probs (T, k) float32, experts (T, k) int64): the top ``k`` of the softmax of ``logits``
    (T, E) over the experts, in descending probability; differentiable in the logits.

    Parameters
    ----------
    logits : (T, E) float tensor
        The router's logits (any float dtype; the softmax runs in float32).
    k : int
        Experts per token, 1 <= k <= E.
    normalize : bool
        Renormalize each token's k probabilities to sum to 1 (Mixtral, Qwen3); default the
        softmax's values (DeepSeek-V2's).
    """
    if not isinstance(logits, Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ArgumentError("logits", got, "a (tokens, experts) float tensor")
    e = logits.shape[1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= e:
        raise ArgumentError("top_k", repr(k), f"an int from 1 to {e} (the experts)")
    if not isinstance(normalize, bool):
        raise ArgumentError("normalize", repr(normalize), "True or False")
    probs, experts = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1)
    if normalize:
        probs = probs / probs.sum(-1, keepdim=True)
    return probs, experts


_top_k = top_k     # route's parameter of that name (the seeds' spelling) hides the function there


def check_choice(top_k: object, experts: object, normalize: object) -> None:
    """Refuse, naming the argument, a ``top_k`` that is not an int from 1 to ``experts`` or a
    ``normalize`` that is not a bool (an MoE layer's constructor, before it builds anything).

    Parameters
    ----------
    top_k : int
        Experts per token.
    experts : int
        The experts.
    normalize : bool
        Whether routing weights are renormalized.
    """
    if isinstance(experts, bool) or not isinstance(experts, int) or experts < 1:
        raise ArgumentError("experts", repr(experts), "an int of at least 1")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
        raise ArgumentError("top_k", repr(top_k), f"an int from 1 to experts ({experts!r})")
    if not isinstance(normalize, bool):
        raise ArgumentError("normalize", repr(normalize), "True or False")


def check_logits(logits: object, tokens: int | tuple, experts: int) -> None:
    """Refuse router ``logits`` that are not a (tokens, experts) tensor, naming ``logits.shape``
    (an MoE layer's forward, before it routes).

    Parameters
    ----------
    logits : tensor
        The router's logits.
    tokens : int or tuple of int
        T, the layer's tokens, or the tokens' leading shape (x's shape without its last dimension).
    experts : int
        E, the experts routed over.
    """
    lead = tuple(tokens) if isinstance(tokens, tuple) else (tokens,)
    want = (*lead, experts)
    if not isinstance(logits, Tensor) or tuple(logits.shape) != want:
        got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ArgumentError("logits.shape", got,
                            f"{want}: one row per token (x's leading shape), one column per expert")


def token_rows(x: object, logits: object, hidden: int, experts: int) -> tuple[Tensor, Tensor, tuple]:
    """``x`` (..., H) and its router ``logits`` (..., E) as token rows (T, H) and (T, E), and the
    tokens' leading shape, to give the layer's output x's shape back (``y.reshape(*lead, H)``).
    Refuses, naming the argument, an x whose last dimension is not ``hidden`` and logits whose
    shape is not x's leading shape and ``experts`` (an MoE layer's forward, before it routes).

    Parameters
    ----------
    x : (..., H) tensor
        The tokens: (T, H), or e.g. (batch, sequence, H).
    logits : (..., E) tensor
        The router's logits, one row per token.
    hidden, experts : int
        H and E.
    """
    if not isinstance(x, Tensor) or x.dim() == 0 or x.shape[-1] != hidden:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ArgumentError("x.shape", got,
                            f"(..., {hidden}): the tokens (any leading dimensions), then the hidden size")
    lead = tuple(x.shape[:-1])
    check_logits(logits, lead, experts)
    return x.reshape(-1, hidden), logits.reshape(-1, experts), lead


def route(logits: Tensor, top_k: int, *, normalize: bool = False) -> Routing:
    """Top-``top_k`` routing of ``logits`` (T, E) into expert-sorted rows padded per expert.

    Parameters
    ----------
    logits : (T, E) float tensor
        The router's logits (any float dtype; the softmax runs in float32).
    top_k : int
        Experts per token, 1 <= top_k <= E.
    normalize : bool
        Renormalize each token's k probabilities to sum to 1 (Mixtral, Qwen3); default the
        softmax's values (DeepSeek-V2's).
    """
    probs, experts = _top_k(logits, top_k, normalize=normalize)
    t, e = logits.shape
    ends, row_of, token_of_row, row_ends = _route_rows(experts, e, padded_rows(t, e, top_k))
    return Routing(probs, experts, ends, row_of, token_of_row, row_ends)


def _route_rows_torch(experts: Tensor, e: int, rows: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    t, top_k = experts.shape
    dev, n = experts.device, t * top_k
    flat = experts.reshape(-1)
    # Counts by scatter (bincount's length would depend on the data), padded per expert.
    counts = torch.zeros(e, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + M_ALIGNED - 1) // M_ALIGNED * M_ALIGNED
    ends = padded.cumsum(0)
    # Each choice's rank among its expert's choices, in token order (a stable sort).
    order = torch.sort(flat, stable=True).indices
    sorted_e = flat[order]
    rank = torch.arange(n, device=dev) - (counts.cumsum(0) - counts)[sorted_e]
    row_flat = torch.empty_like(flat).scatter_(0, order, (ends - padded)[sorted_e] + rank)
    token_of_row = torch.full((rows,), -1, dtype=torch.int64, device=dev)
    token_of_row.scatter_(0, row_flat, torch.arange(n, device=dev) // top_k)
    return ends.to(torch.int32), row_flat.view(t, top_k), token_of_row, (ends - padded + counts).to(torch.int32)


def gather(x: Tensor, routing: Routing) -> Tensor:
    """(R, H): row i is token ``routing.token_of_row[i]`` of ``x`` (T, H), zeros for padding.

    Its gradient in ``x`` is each token's sum over its k rows (:func:`combine`'s forward), a
    deterministic gather instead of ``index_select``'s backward (an ``index_add_`` with atomics
    across the k copies of a token, 8x slower on the H200 at top-k 8).
    """
    if x.dim() != 2 or x.shape[0] != routing.row_of.shape[0]:
        raise ArgumentError("x.shape", tuple(x.shape), f"({routing.row_of.shape[0]}, H): one row per routed token")
    return _Gather.apply(x, routing.token_of_row, routing.row_of)


def _rows_of_tokens_torch(x: Tensor, token_of_row: Tensor, row_of: Tensor | None = None) -> Tensor:
    # Padding rows (-1) read an appended zero row: one copy of x (T rows) is cheaper than masking R rows.
    t = x.shape[0]
    source = torch.where(token_of_row < 0, t, token_of_row)
    return torch.cat((x, x.new_zeros(1, x.shape[1]))).index_select(0, source)


def _sum_rows_torch(rows: Tensor, row_of: Tensor) -> Tensor:
    # Each token's k rows, summed in choice order in at least float32 (the reduction upcasts as it reads).
    t, k = row_of.shape
    picked = rows.index_select(0, row_of.reshape(-1)).view(t, k, rows.shape[1])
    return picked.sum(1, dtype=torch.promote_types(rows.dtype, torch.float32)).to(rows.dtype)


class _OnDevice:
    """One of the routing's permutations: its kernel (fusegemm/permute.py) on CUDA tensors, called
    directly outside torch.compile (a custom op's dispatch costs host time on every call) and as
    the torch custom op ``torch.ops.fusegemm.<name>`` inside it (``fake`` gives its outputs'
    shapes); torch's operations (``fallback``) elsewhere and where the kernel does not serve the
    tensors. The same values on every path."""

    def __init__(self, name: str, schema: str, kernel, fallback, fake) -> None:
        self.kernel, self.fallback = kernel, fallback
        self.op = torch.library.custom_op(f"fusegemm::{name}", self._served, mutates_args=(), schema=schema)
        self.op.register_fake(fake)

    def _served(self, *args):
        out = self.kernel(*args)
        return out if out is not None else self.fallback(*args)

    def __call__(self, lead: Tensor, *args):
        if not lead.is_cuda:
            return self.fallback(lead, *args)
        return self.op(lead, *args) if torch.compiler.is_compiling() else self._served(lead, *args)


_route_rows = _OnDevice(
    "route_rows", "(Tensor experts, int num_experts, int rows) -> (Tensor, Tensor, Tensor, Tensor)",
    permute.route_rows, _route_rows_torch,
    lambda experts, e, rows: (experts.new_empty((e,), dtype=torch.int32), experts.new_empty(experts.shape),
                              experts.new_empty((rows,)), experts.new_empty((e,), dtype=torch.int32)))
# (given the inverse row_of, the kernel writes the rows in token order: permute.gather_rows)
_rows_of_tokens = _OnDevice(
    "gather_rows", "(Tensor x, Tensor token_of_row, Tensor? row_of) -> Tensor", permute.gather_rows,
    _rows_of_tokens_torch, lambda x, token_of_row, row_of: x.new_empty((token_of_row.shape[0], x.shape[1])))

# Whether the layer's gathers (x in the forward, dy in the backward) run in token order
# (permute.gather_rows with row_of: each token's row read once, stored to its k rows) rather than
# row order (read once per row: k times, from DRAM at dsv3's x). Bit for bit the row-order gather
# (tests/gpu/test_permute_gpu.py and test_moe_layer_gpu.py, H100, 2026-12-06). Alone it is 1.42x as
# fast at dsv3 with 32 experts and 1.00x with 8 (bench/results/permute_h100_token_order.json); in
# the graphed layer's step it was no faster (dsv3-32: 15.57 / 15.41 / 15.79 ms against 15.67 /
# 15.13 / 15.36 in three runs, mixtral 15.23 against 14.78, dsv3-8 14.17 against 14.00;
# bench/results/moe_layer_h100_flags_*.json), so it stays off.
TOKEN_ORDER = False


def _token_rows(x: Tensor, token_of_row: Tensor, row_of: Tensor) -> Tensor:
    """(R, H): row i is ``x[token_of_row[i]]``, zeros for padding (the routing's gather, on its
    kernel where it serves the tensors: in token order with ``TOKEN_ORDER``)."""
    return _rows_of_tokens(x, token_of_row, row_of if TOKEN_ORDER else None)


_sum_rows = _OnDevice(
    "sum_rows", "(Tensor rows, Tensor row_of) -> Tensor", permute.sum_rows, _sum_rows_torch,
    lambda rows, row_of: rows.new_empty((row_of.shape[0], rows.shape[1])))


class _Gather(torch.autograd.Function):
    # Each of gather and combine is the other's transpose: the backward of one is the other's forward.
    @staticmethod
    def forward(ctx, x: Tensor, token_of_row: Tensor, row_of: Tensor) -> Tensor:
        ctx.save_for_backward(token_of_row, row_of)
        return _token_rows(x, token_of_row, row_of)

    @staticmethod
    def backward(ctx, grad_rows: Tensor):
        return _Combine.apply(grad_rows, *ctx.saved_tensors), None, None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows: Tensor, token_of_row: Tensor, row_of: Tensor) -> Tensor:
        ctx.save_for_backward(token_of_row, row_of)
        return _sum_rows(rows, row_of)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _Gather.apply(grad, *ctx.saved_tensors), None, None


def row_probs(routing: Routing) -> Tensor:
    """(R,) float32: each row's routing weight (0 for padding rows); differentiable."""
    r = routing
    return torch.zeros(r.rows, dtype=torch.float32, device=r.probs.device).scatter(
        0, r.row_of.reshape(-1), r.probs.reshape(-1))


def combine(y_rows: Tensor, routing: Routing) -> Tensor:
    """(T, H): each token's sum over its k rows of ``y_rows`` (R, H), in choice order, in at least
    float32 and then ``y_rows``' dtype. The routing weights are the rows' own (applied by whatever made
    them, as the expert MLP's fused SwiGLU does)."""
    r = routing
    if y_rows.dim() != 2 or y_rows.shape[0] != r.rows:
        raise ArgumentError("y_rows.shape", tuple(y_rows.shape), f"({r.rows}, H): the routing's rows")
    return _Combine.apply(y_rows, r.token_of_row, r.row_of)
