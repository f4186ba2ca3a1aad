"""A mixture of experts' figures (model.moe, or any model whose mixtures keep the rule of `mixtures_of`): how evenly
its routers spread the slots (each token's k (token, expert) pairs) over the experts, what a capacity dropped, and
the balance loss the model added to its loss. Each mixture leaves, after each forward, `load` (the slots each
expert was routed, before any capacity), `dropped` and `aux_loss`; this collector sums them per micro-batch on the
device (no host sync), and at log steps over every rank (one collective, not counted as the strategy's):

- moe_load_imbalance: per mixture, the most loaded expert's slots over the mean expert's, over the interval and
  every rank's tokens; the mean over the mixtures (1 = even; top-k of E experts at most E / k);
- moe_dropped_frac: the slots a capacity dropped over all slots (0 dropless);
- moe_aux_loss: the balance losses added to the loss, summed over the mixtures, the mean over micro-batches and
  ranks;
summary.json's `moe` keeps each mixture's slots per expert over the measured steps (`load_by_layer`), and
`params_active`: the parameters a token meets (the shared ones, and k of each mixture's E experts).
"""
from __future__ import annotations

from typing import Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from ablate.metrics.collectors import BuiltIn, Span
from ablate.metrics.counting import paused


def mixtures_of(model: nn.Module) -> Iterator[nn.Module]:
    """Every mixture of experts in the model, by rule: a module with `top_k` and `experts`, a module whose
    parameters stack the experts along dim 0, and either
    - `dispatch`, what carries the slots sorted by expert to them (dispatch(experts, slots, counts per expert), the
      experts called as experts(slots, counts)): the built-in's (model/moe.py), which records its routing;
    - or, as transformers' mixtures have them (Mixtral, Qwen-MoE: `experts.num_experts`), experts called as
      experts(hidden_states, top_k_index, top_k_weights)."""
    for m in model.modules():
        experts = getattr(m, "experts", None)
        if isinstance(experts, nn.Module) and isinstance(getattr(m, "top_k", None), int) and \
                (callable(getattr(m, "dispatch", None)) or isinstance(getattr(experts, "num_experts", None), int)):
            yield m


def numel(p: torch.Tensor) -> int:
    """A parameter's whole size (a DTensor's is global; DeepSpeed's partitioned ones keep it as ds_numel)."""
    return getattr(p, "ds_numel", p.numel())


def active_params(model: nn.Module) -> int:
    """The parameters one token meets (this rank's stages'): all but (E - k) / E of each mixture's experts."""
    idle = 0.0
    for m in mixtures_of(model):
        stacked = list(m.experts.parameters())
        n_experts = stacked[0].shape[0] if stacked else 1
        idle += sum(numel(p) for p in stacked) * (1 - m.top_k / n_experts)
    return int(sum(numel(p) for p in model.parameters()) - idle)


class Experts(BuiltIn):
    def __init__(self, env, model: nn.Module):
        super().__init__()
        self.env, self.mixtures = env, list(mixtures_of(model))
        self.params_active = active_params(model)
        self.totals = dict(moe_load=[], moe_dropped=0.0, moe_aux=0.0, moe_micro=0)
        self._load: Optional[torch.Tensor] = None
        self._dropped, self._aux, self._micro = 0, torch.zeros((), device=env.device), 0

    def on_micro(self, loss: torch.Tensor) -> None:
        ran = [m for m in self.mixtures if getattr(m, "load", None) is not None]   # (a transformers' mixture: none)
        if not ran:
            return
        load = torch.stack([m.load.to(self._aux.device) for m in ran]).double()
        self._load = load if self._load is None else self._load + load
        self._dropped += sum(int(m.dropped) for m in ran)
        losses = [m.aux_loss.detach().float() for m in ran if m.aux_loss is not None]
        if losses:   # (none under bias balancing: the figure is absent, not 0)
            self._aux += sum(losses)
            self._micro += 1

    def mark(self) -> None:
        self._load, self._dropped, self._aux, self._micro = None, 0, torch.zeros_like(self._aux), 0

    def _over_ranks(self) -> Optional[torch.Tensor]:
        """[load per expert..., dropped, balance loss sum, micro-batches with one] summed over every rank."""
        if self._load is None:
            return None
        flat = torch.cat([self._load.flatten(), torch.tensor([self._dropped, float(self._aux), self._micro],
                                                             dtype=torch.float64, device=self._load.device)])
        if dist.is_initialized() and dist.get_world_size() > 1:
            with paused():
                dist.all_reduce(flat)
        return flat

    def interval(self, span: Span) -> Dict[str, object]:
        flat = self._over_ranks()
        if flat is None:
            return {}
        load = flat[:-3].view_as(self._load)
        t = self.totals
        t["moe_load"] = (torch.tensor(t["moe_load"], dtype=torch.float64) + load.cpu()).tolist() if t["moe_load"] \
            else load.cpu().tolist()
        t["moe_dropped"] += float(flat[-3])
        t["moe_aux"] += float(flat[-2])
        t["moe_micro"] += int(flat[-1])
        return figures(load.cpu().tolist(), float(flat[-3]), float(flat[-2]), int(flat[-1]))

    def summary(self, span: Span) -> Dict[str, object]:
        t = self.totals
        out = figures(t["moe_load"], t["moe_dropped"], t["moe_aux"], t["moe_micro"]) if t["moe_load"] else \
            dict.fromkeys(("moe_load_imbalance", "moe_dropped_frac", "moe_aux_loss"))
        load = [[int(x) for x in row] for row in t["moe_load"]]
        return {**out, "params_active": self.params_active, "moe": {"mixtures": len(self.mixtures),
                                                                    "load_by_layer": load}}


def figures(load: List[List[float]], dropped: float, aux: float, micro: int) -> Dict[str, Optional[float]]:
    imbalance = [max(row) / (sum(row) / len(row)) for row in load if sum(row)]
    slots = sum(map(sum, load))
    return {"moe_load_imbalance": sum(imbalance) / len(imbalance) if imbalance else None,
            "moe_dropped_frac": dropped / slots if slots else None,
            "moe_aux_loss": aux / micro if micro else None}
