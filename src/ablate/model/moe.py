"""The built-in Llama's mixture-of-experts feed-forward (`model.moe`: config/moe.py cites each default's source).

A router (softmax over the experts, the top k kept and renormalised) sends each token to k experts; the (token,
expert) slots are sorted by expert, each expert's SwiGLU runs on its slots (`Experts`: stacked weights, a loop or
one grouped matmul per weight), and the outputs are summed back per token with the router's weights; shared experts
see every token. `dispatch` is what carries the sorted slots to the experts and back: here, the local experts; under
expert parallelism (parallel/ep.py), an all-to-all to the ranks that hold them.

Each forward leaves its figures on the module (metrics/experts.py reads them): the slots each expert received
(`load`), the slots dropped at the capacity (`dropped`), and the balance loss (`aux_loss`, which the model's loss
adds: model/contract.py).
"""
from __future__ import annotations

import math
from typing import List

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import is_fake, unset_fake_temporarily

from ablate.config.moe import MoEConfig
from ablate.model.swiglu import SwiGLU


def local(param: torch.Tensor) -> torch.Tensor:
    """A weight as this rank holds it (an expert-parallel DTensor's own experts)."""
    return param.to_local() if hasattr(param, "to_local") else param


def no_values(t: torch.Tensor) -> bool:
    """A tensor the plan runs the model on (meta or fake): shapes, no values to route by."""
    return t.device.type == "meta" or is_fake(t)


class Experts(nn.Module):
    """`n` SwiGLU experts with stacked weights: w1, w3 [n, dim, hidden], w2 [n, hidden, dim] (torchtitan's
    GroupedExperts): expert parallelism splits dim 0."""

    def __init__(self, n: int, dim: int, hidden: int, matmul: str):
        super().__init__()
        self.matmul = matmul
        self.w1 = nn.Parameter(torch.empty(n, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(n, dim, hidden))
        self.w2 = nn.Parameter(torch.empty(n, hidden, dim))

    def forward(self, x: torch.Tensor, counts: List[int]) -> torch.Tensor:
        """x: slots sorted by (local) expert, counts[e] of them for expert e."""
        w1, w3, w2 = local(self.w1), local(self.w3), local(self.w2)
        # grouped: CUDA's and the CPU's kernels (bf16 wants dim and hidden in multiples of 8); the plan's meta and
        # fake tensors run the loop (torch's meta kernel takes bf16 only): the same FLOPs and shapes
        if self.matmul == "grouped" and not no_values(x):
            ends = torch.tensor(counts, device=x.device).cumsum(0).to(torch.int32)
            kind = x.device.type
            autocast = kind in ("cuda", "cpu") and torch.is_autocast_enabled(kind)   # (not on the plan's meta)
            dtype = torch.get_autocast_dtype(kind) if autocast else x.dtype
            x, w1, w3, w2 = (t.to(dtype) for t in (x, w1, w3, w2))
            h = F.silu(torch._grouped_mm(x, w1, offs=ends)) * torch._grouped_mm(x, w3, offs=ends)
            return torch._grouped_mm(h, w2, offs=ends)
        # unbind, not w[e]: its backward stacks the experts' gradients once (each w[e]'s would write a zero-filled
        # gradient of the whole stack, E times per weight)
        outs = [F.silu(part @ a) * (part @ c) @ b
                for part, a, c, b in zip(x.split(counts), w1.unbind(0), w3.unbind(0), w2.unbind(0))]
        return torch.cat(outs) if outs else x.new_zeros(0, w2.shape[-1])


def local_dispatch(experts: Experts, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Every expert on this rank: the sorted slots straight to them."""
    return experts(x, counts.tolist())


def balance_loss(probs: torch.Tensor, chosen: torch.Tensor, sequences: int, experts: int) -> torch.Tensor:
    """DeepSeek-V3's sequence-wise balance loss, mean over sequences: sum_i f_i P_i, f_i = E / (k T) x the slots
    of expert i in the sequence, P_i its mean router probability there."""
    k = chosen.shape[-1]
    routed = F.one_hot(chosen, experts).sum(1).view(sequences, -1, experts).float()   # [seq, T, E]
    f = routed.mean(1) * experts / k
    p = probs.view(sequences, -1, experts).mean(1)
    return (f * p).sum(-1).mean()


def routed_counts(slots: torch.Tensor, experts: int) -> torch.Tensor:
    """The slots each expert receives; where there are no values to route by (the plan's meta or fake tensors), as
    evenly as they can be spread (a host tensor: the plan's activations are those of a balanced router)."""
    if no_values(slots):
        n = slots.numel()
        with unset_fake_temporarily():
            return torch.tensor([n // experts + (e < n % experts) for e in range(experts)])
    return torch.bincount(slots, minlength=experts)


class MoE(nn.Module):
    def __init__(self, dim: int, ffn_hidden: int, moe: MoEConfig):
        super().__init__()
        self.cfg = moe
        hidden = moe.hidden or ffn_hidden
        self.router = nn.Linear(dim, moe.experts, bias=False)
        self.experts = Experts(moe.experts, dim, hidden, moe.matmul)
        self.shared = None
        if moe.shared_experts:   # the shared experts as one SwiGLU of their summed width
            self.shared = SwiGLU(dim, hidden * moe.shared_experts)
        self.dispatch = local_dispatch
        self.top_k = moe.top_k
        # balance=bias: the bias on each expert's score (kept in checkpoints), and the slots this step routed
        self.register_buffer("expert_bias", torch.zeros(moe.experts))
        self.register_buffer("step_load", torch.zeros(moe.experts), persistent=False)
        self.load = self.dropped = self.aux_loss = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        flat = x.reshape(-1, d)
        probs = self.router(flat).float().softmax(-1)
        chosen = (probs + self.expert_bias).topk(self.cfg.top_k, dim=-1).indices   # (the bias chooses, never weighs)
        weights = probs.gather(-1, chosen)
        weights = (weights / weights.sum(-1, keepdim=True)).type_as(x)
        self.aux_loss = balance_loss(probs, chosen, b, self.cfg.experts) * self.cfg.loss_coef \
            if self.cfg.loss_coef else None
        slots = chosen.flatten()
        order = slots.argsort(stable=True)          # slots by expert, each expert's in token order
        counts = routed_counts(slots, self.cfg.experts)
        self.load = counts                          # routed, before a capacity (no gradient)
        if self.training and self.cfg.balance == "bias" and not no_values(counts):
            self.step_load += counts.to(self.step_load.dtype)
        order, counts = self.capped(order, counts)
        self.dropped = slots.numel() - order.numel()
        token = order // self.cfg.top_k
        out = self.dispatch(self.experts, flat[token], counts)
        weighted = (out * weights.flatten()[order, None].type_as(out)).to(flat.dtype)
        combined = torch.zeros_like(flat).index_add(0, token, weighted)
        if self.shared is not None:
            combined = combined + self.shared(flat)
        return combined.view(b, t, d)

    def capped(self, order: torch.Tensor, counts: torch.Tensor):
        """At a capacity factor: each expert's first ceil(c k T / E) slots (in token order), the rest dropped."""
        if self.cfg.capacity_factor is None:
            return order, counts
        cap = math.ceil(self.cfg.capacity_factor * order.numel() / self.cfg.experts)
        if no_values(order):   # the plan's balanced router (routed_counts): each expert's first cap
            kept = [min(int(c), cap) for c in counts.tolist()]
            with unset_fake_temporarily():
                return order[:sum(kept)], torch.tensor(kept)
        starts = counts.cumsum(0) - counts
        place = torch.arange(order.numel(), device=order.device) - starts.repeat_interleave(counts)
        return order[place < cap], counts.clamp(max=cap)

    def rebalance(self, load: torch.Tensor) -> None:
        """balance=bias, after an optimizer step: each expert's bias moved by bias_update towards the mean load
        (`load`: the step's slots per expert over every data-parallel rank)."""
        with torch.no_grad():
            self.expert_bias += self.cfg.bias_update * torch.sign(load.mean() - load)
            self.step_load.zero_()
