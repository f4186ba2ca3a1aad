"""parallel.ep > 1: expert parallelism over the mesh's `ep` dim (carved from dp_shard: parallel/mesh.py), as
torchtitan lays it out (torchtitan/distributed/expert_parallel.py): each rank of an ep group holds E / ep of every
mixture's experts (their stacked weights a DTensor sharded on dim 0 over `ep`), and each MoE layer sends its sorted
(token, expert) slots to the ranks that hold their experts and the outputs back, with all-to-alls:

1. the slots per expert, exchanged (an all-to-all of E integers): what each rank will receive, from whom;
2. the slots (the dispatch), each rank's share for each peer in one all-to-all with uneven splits;
3. the received slots regrouped (source, expert) -> (expert, source), the local experts run, and put back;
4. the outputs sent back (the combine), the reverse all-to-all.
Gradients retrace 4 and 2 in reverse (torch's functional all_to_all_single, each direction called through
torch.distributed._functional_collectives so that the comm counter sees both: metrics/counting.py). FSDP2 then
shards each rank's experts over the ranks that hold the same ones (dp_shard / ep) and divides their gradients by
the whole data-parallel degree (parallel/fsdp2.py): every rank's tokens reached them through the all-to-all.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, List

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.tensor import Shard, distribute_tensor

from ablate.metrics.experts import mixtures_of


def experts_of(model: nn.Module) -> Iterator[nn.Module]:
    """Every mixture's experts in the model."""
    return (m.experts for m in mixtures_of(model))


class Exchange(torch.autograd.Function):
    """One all-to-all with uneven splits whose backward is the reverse one: torch's functional collective in both
    directions, looked up at call time (counted each way)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: List[int], in_splits: List[int], group) -> torch.Tensor:
        ctx.splits, ctx.group = (in_splits, out_splits), group
        return funcol.wait_tensor(funcol.all_to_all_single(x.contiguous(), out_splits, in_splits, group))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        back, forth = ctx.splits
        return funcol.wait_tensor(funcol.all_to_all_single(grad.contiguous(), back, forth, ctx.group)), None, None, \
            None


def regrouped(received: torch.Tensor) -> torch.Tensor:
    """The order that turns slots received (source, expert)-major into (expert, source)-major: `received` [ep,
    local experts] counts them."""
    ep, local = received.shape
    segment = torch.arange(ep * local, device=received.device).repeat_interleave(received.flatten())
    return ((segment % local) * ep + segment // local).argsort(stable=True)


class Dispatch:
    """A mixture's `dispatch` under expert parallelism: the sorted slots to the ranks that hold their experts, the
    local experts run, the outputs back (the module docstring's 1-4)."""

    def __init__(self, group: dist.ProcessGroup):
        self.group, self.ep = group, group.size()

    def __call__(self, experts, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.group)
        local = counts.numel() // self.ep
        got = received.view(self.ep, local)
        send, recv = counts.view(self.ep, local).sum(1).tolist(), got.sum(1).tolist()
        x = Exchange.apply(x, recv, send, self.group)
        order = regrouped(got)
        y = experts(x[order], got.sum(0).tolist())
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=order.device)
        return Exchange.apply(y[back], send, recv, self.group)


def parallelize(model: nn.Module, ep_mesh) -> None:
    """Split every mixture's experts over `ep_mesh` (this rank keeps its E / ep, cut from the weights every rank
    initialised alike: nothing sent) and route its slots through the all-to-alls."""
    for experts in list(experts_of(model)):
        for name, param in list(experts.named_parameters(recurse=False)):
            shard = distribute_tensor(param.detach(), ep_mesh, [Shard(0)], src_data_rank=None)
            experts.register_parameter(name, nn.Parameter(shard, requires_grad=param.requires_grad))
    dispatch = Dispatch(ep_mesh.get_group())
    for moe in list(mixtures_of(model)):
        if callable(getattr(moe, "dispatch", None)):
            moe.dispatch = dispatch
        else:   # a transformers' mixture: its experts' forward routed so (`routed_forward`)
            moe.experts.forward = routed_forward(moe.experts, dispatch)


@contextlib.contextmanager
def local_view(experts: nn.Module, count: int):
    """Within: `experts`' parameters are this rank's shards (plain tensors, through to_local: gradients reach the
    DTensors) and `num_experts` its count, so that its own forward runs its local experts."""
    saved, number = dict(experts._parameters), experts.num_experts
    try:
        for name, p in saved.items():
            experts._parameters[name] = p.to_local() if hasattr(p, "to_local") else p
        experts.num_experts = count
        yield
    finally:
        experts._parameters.update(saved)
        experts.num_experts = number


def routed_forward(experts: nn.Module, dispatch: Dispatch):
    """transformers' experts(hidden_states, top_k_index, top_k_weights) under expert parallelism: the (token,
    expert) slots sorted by expert and dispatched; on the rank holding them, the model's own forward over its local
    experts, each received slot a token routed to one expert with weight 1; the outputs back, weighted, summed per
    token."""
    forward, total = experts.forward, experts.num_experts
    local = total // dispatch.ep

    def run_local(slots: torch.Tensor, counts: List[int]) -> torch.Tensor:
        index = torch.arange(len(counts), device=slots.device).repeat_interleave(
            torch.tensor(counts, device=slots.device))
        with local_view(experts, local):
            return forward(slots, index[:, None], torch.ones(len(index), 1, dtype=slots.dtype, device=slots.device))

    def routed(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        k = top_k_index.shape[-1]
        slots = top_k_index.flatten()
        order = slots.argsort(stable=True)
        token = order // k
        out = dispatch(run_local, hidden_states[token], torch.bincount(slots, minlength=total))
        weighted = out * top_k_weights.flatten()[order, None].to(out.dtype)
        return torch.zeros_like(hidden_states).index_add(0, token, weighted.to(hidden_states.dtype))
    return routed
