"""Expert parallelism for :class:`fusegemm.moe.ExpertMLP` with ``torch.distributed``.

Each of the ``W`` ranks of a process group owns ``L = E / W`` consecutive experts of ``E``
(rank r: experts ``r*L .. r*L + L - 1``). A rank routes its own tokens: ``topk_idx`` (T, k)
global expert ids and ``topk_weight`` (T, k) routing weights. :func:`dispatch` sends every
(token, expert) assignment to the expert's rank with ``all_to_all_single`` and lays the rows it
receives out grouped by local expert, each expert padded to 256 rows (``padded_offsets``);
:func:`combine` sends the expert outputs back and sums each token's ``k`` outputs. Both are
differentiable (``torch.distributed.nn.functional.all_to_all_single``), so gradients of the
tokens, routing weights and expert weights flow through one ``backward()``.

    ep = ExpertParallelMLP(num_experts=16, hidden=1024, intermediate=2048, device="cuda")
    y = ep(x, topk_idx, topk_weight)            # x (T, H) this rank's tokens -> y (T, H)

:class:`ExpertParallelMoEBlock` is :class:`fusegemm.moe.MoEBlock` over a process group: router
logits in (the same softmax top-k, :func:`fusegemm.routing.top_k`), the experts spread as above.

The routing weight gates each expert's SwiGLU inside the fused kernel (``prob``), so combine
is a plain sum. Split sizes cross to the host once per dispatch (all_to_all needs them).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .moe import ExpertMLP, block_rows
from .routing import check_choice
from .routing import top_k as _top_k

__all__ = ["ExpertParallelMLP", "ExpertParallelMoEBlock", "dispatch", "combine", "Plan"]


def _all_to_all(out: Tensor, inp: Tensor, out_splits: list[int], in_splits: list[int], group) -> Tensor:
    """Differentiable all_to_all_single (its backward is the reverse exchange); the identity
    in a single process."""
    import warnings

    if not _distributed(group):
        return inp

    from torch.distributed.nn.functional import all_to_all_single
    with warnings.catch_warnings():   # torch 2.9+ points at _functional_collectives (async tensors)
        warnings.simplefilter("ignore", FutureWarning)
        return all_to_all_single(out, inp, out_splits, in_splits, group=group)

ROWS = 256   # every expert's rows are padded to a multiple of this (the kernels' M alignment)


@dataclass
class Plan:
    """What :func:`combine` needs to undo a :func:`dispatch`.

    Parameters
    ----------
    token : (T*k,) tensor
        The token of each sent row, in send order.
    send_splits : list of int
        Rows sent to each rank.
    recv_splits : list of int
        Rows received from each rank.
    pos : (R,) tensor
        Row of each received row in the padded local batch.
    num_tokens : int
        T, this rank's tokens.
    """

    token: Tensor
    send_splits: list[int]
    recv_splits: list[int]
    pos: Tensor
    num_tokens: int


def _distributed(group) -> bool:
    """False for a single process: no group given and torch.distributed not initialised."""
    import torch.distributed as dist
    return group is not None or (dist.is_available() and dist.is_initialized())


def _group_size(group) -> tuple[int, int]:
    import torch.distributed as dist
    if not _distributed(group):
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def dispatch(x: Tensor, topk_idx: Tensor, topk_weight: Tensor, experts_per_rank: int,
             group=None) -> tuple[Tensor, Tensor, Tensor, Plan]:
    """Send this rank's token rows to their experts' ranks.

    Parameters
    ----------
    x : (T, H) tensor
        This rank's tokens.
    topk_idx : (T, k) integer tensor
        Global expert of each of a token's k routes, in ``[0, experts_per_rank * world)``.
    topk_weight : (T, k) float tensor
        Routing weight of each route.
    experts_per_rank : int
        L, the experts each rank owns.
    group : ProcessGroup, optional
        Default: the world (a single process when ``torch.distributed`` is not initialised).

    Returns
    -------
    (x_local (M, H), padded_offsets (L,) int32, prob (M,) float32, plan): the rows this rank's
    experts process, grouped by local expert and zero-padded to 256 per expert, and the plan
    :func:`combine` reverses.
    """
    import torch.distributed as dist
    world, _ = _group_size(group)
    if topk_idx.shape != topk_weight.shape or topk_idx.dim() != 2 or topk_idx.shape[0] != x.shape[0]:
        raise ValueError(f"topk_idx/topk_weight: got {tuple(topk_idx.shape)} and {tuple(topk_weight.shape)} for "
                         f"x {tuple(x.shape)}; allowed: equal (T, k) shapes with T = x.shape[0]")
    num_experts = experts_per_rank * world
    t, k = topk_idx.shape
    flat = topk_idx.reshape(-1).long()
    if flat.numel():
        lo, hi = torch.stack(torch.aminmax(flat)).tolist()   # one host copy for both bounds
        if lo < 0 or hi >= num_experts:
            raise ValueError(f"topk_idx: got ids in [{lo}, {hi}]; allowed: [0, {num_experts}) "
                             f"({experts_per_rank} experts x {world} ranks)")
    order = torch.argsort(flat, stable=True)           # rank-major, then local expert
    token = torch.arange(t, device=x.device).repeat_interleave(k)[order]
    counts = torch.bincount(flat, minlength=num_experts)
    recv_counts = torch.empty_like(counts)
    if _distributed(group):
        dist.all_to_all_single(recv_counts, counts, group=group)   # (world, L): rows from each source
    else:
        recv_counts.copy_(counts)
    # One host copy serves every size below: the splits all_to_all needs and the local rows.
    sent, got = torch.stack((counts, recv_counts)).view(2, world, experts_per_rank).tolist()
    send_splits, recv_splits = [sum(r) for r in sent], [sum(r) for r in got]
    m = sum(-(-sum(col) // ROWS) * ROWS for col in zip(*got))   # each local expert padded to ROWS
    recv_counts = recv_counts.view(world, experts_per_rank)
    x_recv = _all_to_all(x.new_empty((sum(recv_splits), x.shape[1])), x[token], recv_splits, send_splits, group)
    w_recv = _all_to_all(topk_weight.new_empty(sum(recv_splits)), topk_weight.reshape(-1)[order],
                         recv_splits, send_splits, group)
    # Received rows come source by source, each source's in local-expert order: place them
    # expert by expert, each expert's block padded to ROWS.
    local = torch.arange(experts_per_rank, device=x.device).repeat(world).repeat_interleave(
        recv_counts.reshape(-1), output_size=sum(recv_splits))
    per_expert = recv_counts.sum(0)
    padded = (per_expert + ROWS - 1) // ROWS * ROWS
    padded_offsets = padded.cumsum(0)
    by_expert = torch.argsort(local, stable=True)
    e = local[by_expert]
    starts = per_expert.cumsum(0) - per_expert           # first row of each expert, unpadded
    pos = torch.empty_like(local)
    pos[by_expert] = (padded_offsets - padded)[e] + torch.arange(e.numel(), device=x.device) - starts[e]
    x_local = x.new_zeros((m, x.shape[1])).index_copy(0, pos, x_recv)
    prob = torch.zeros(m, device=x.device, dtype=torch.float32).index_copy(0, pos, w_recv.float())
    plan = Plan(token, send_splits, recv_splits, pos, t)
    return x_local, padded_offsets.to(torch.int32), prob, plan


def combine(y_local: Tensor, plan: Plan, group=None) -> Tensor:
    """Return each received row's expert output to its token's rank and sum a token's routes.

    Parameters
    ----------
    y_local : (M, H) tensor
        The local experts' outputs on :func:`dispatch`'s ``x_local`` rows.
    plan : Plan
        From the matching :func:`dispatch`.
    group : ProcessGroup, optional
        The group dispatch used.

    Returns
    -------
    (T, H) tensor in ``y_local``'s dtype (summed in float32).
    """
    back = _all_to_all(y_local.new_empty((sum(plan.send_splits), y_local.shape[1])),
                       y_local.index_select(0, plan.pos), plan.send_splits, plan.recv_splits, group)
    y = torch.zeros((plan.num_tokens, y_local.shape[1]), device=y_local.device, dtype=torch.float32)
    return y.index_add(0, plan.token, back.float()).to(y_local.dtype)


class ExpertParallelMLP(torch.nn.Module):
    """The expert MLP of an MoE layer spread over a process group: this rank's
    ``num_experts / world`` experts as an :class:`~fusegemm.moe.ExpertMLP`, tokens exchanged
    with :func:`dispatch` / :func:`combine`.

    Parameters
    ----------
    num_experts : int
        E, experts over all ranks (a multiple of the group size).
    hidden : int
        H, the model dimension.
    intermediate : int
        F, each expert's intermediate size (a multiple of 32).
    group : ProcessGroup, optional
        Default: the world; without ``torch.distributed`` initialised, this one process holds
        every expert (the same routing and padding, no exchange).
    **kwargs
        Passed to :class:`~fusegemm.moe.ExpertMLP` (dtype, backend, device, generator).
    """

    def __init__(self, num_experts: int, hidden: int, intermediate: int, *, group=None, **kwargs) -> None:
        super().__init__()
        world, rank = _group_size(group)
        if num_experts % world:
            raise ValueError(f"num_experts: got {num_experts}; allowed: a multiple of the group size {world}")
        self.group, self.rank, self.experts_per_rank = group, rank, num_experts // world
        self.local = ExpertMLP(self.experts_per_rank, hidden, intermediate, **kwargs)

    def forward(self, x: Tensor, topk_idx: Tensor, topk_weight: Tensor) -> Tensor:
        """``y[t] = sum_j topk_weight[t, j] * expert_{topk_idx[t, j]}(x[t])`` for this rank's tokens.

        Parameters
        ----------
        x : (T, H) tensor
            This rank's tokens.
        topk_idx : (T, k) integer tensor
            Global expert ids.
        topk_weight : (T, k) float tensor
            Routing weights.
        """
        x_local, offsets, prob, plan = dispatch(x, topk_idx, topk_weight, self.experts_per_rank, self.group)
        return combine(self.local(x_local, offsets, prob), plan, self.group)


class ExpertParallelMoEBlock(torch.nn.Module):
    """:class:`fusegemm.moe.MoEBlock` with its experts spread over a process group: each rank
    routes its own tokens from the router's logits (:func:`fusegemm.routing.top_k`, as MoEBlock
    does) and runs :class:`ExpertParallelMLP`. Gradients reach the tokens, the logits (through the
    routing weights) and this rank's expert weights (``self.mlp.local``).

    Parameters
    ----------
    hidden : int
        H, the model dimension.
    intermediate : int
        F, each expert's intermediate size (a multiple of 32).
    experts : int
        E, the experts over all ranks (a multiple of the group size).
    top_k : int
        Experts per token, 1 <= top_k <= experts.
    normalize : bool
        Renormalize each token's k routing weights to sum to 1.
    group : ProcessGroup, optional
        As :class:`ExpertParallelMLP`.
    **kwargs
        Passed to :class:`~fusegemm.moe.ExpertMLP` (dtype, backend, recipe, device, generator).
    """

    def __init__(self, hidden: int, intermediate: int, experts: int, top_k: int, *, normalize: bool = False,
                 group=None, **kwargs) -> None:
        super().__init__()
        check_choice(top_k, experts, normalize)
        self.top_k, self.normalize = top_k, normalize
        self.mlp = ExpertParallelMLP(experts, hidden, intermediate, group=group, **kwargs)

    def forward(self, x: Tensor, logits: Tensor) -> Tensor:
        """The layer on this rank's tokens.

        Parameters
        ----------
        x : (T, H) tensor, or (..., H)
            This rank's tokens, in the expert weights' dtype (leading dimensions flattened into T;
            the output has x's shape).
        logits : (T, E) float tensor, or (..., E)
            The router's logits for each of them, over all E experts (x's leading shape).
        """
        experts = self.mlp.experts_per_rank * _group_size(self.mlp.group)[0]
        x2, logits2, lead = block_rows(x, logits, self.mlp.local.w1, experts)
        probs, chosen = _top_k(logits2, self.top_k, normalize=self.normalize)
        return self.mlp(x2, chosen, probs).reshape(*lead, x2.shape[1])
