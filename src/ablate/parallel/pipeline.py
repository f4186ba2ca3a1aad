"""parallel.pp > 1: what a pipeline cannot run (`check`), and a step that a schedule of torch.distributed.pipelining
owns (docs/layouts.md, "Pipelines"); the model is cut into stages by model/stages.py (any model whose forward runs
its blocks in turn), this rank's stages one `Pipeline` module, the strategy's model: its optimizer, gradient
clipping (the norm over every stage: `pp_norm`), checkpoints and health checks see every stage's parameters.
`Schedule.step` hands the schedule the step's batch; the schedule cuts it into parallel.pp_microbatches, takes the
loss on the last stage and scales the gradients by 1/m (the mean loss); the step's loss is sent to the pipeline's
other ranks, so that it is recorded once per pipeline. Its stages' actions are timed (metrics/bubble.py: the
measured bubble).
"""
from __future__ import annotations

from typing import List

import torch
import torch.distributed as dist

from ablate.config import AblateConfig, ConfigError, ModelConfig
from ablate.config.schedules import MULTI_STAGE, TORCH_CLASS
from ablate.metrics.bubble import StageClock
from ablate.metrics.counting import paused


def check(cfg: AblateConfig) -> None:
    """What a pipeline cannot run, refused in one line before any rank starts."""
    p, t = cfg.parallel, cfg.train
    if p.pp == 1:
        for key, default in (("pp_microbatches", None), ("pp_stages_per_rank", 1)):
            if getattr(p, key) != default:
                raise ConfigError(f"parallel.{key}={getattr(p, key)}: a pipeline's setting, with parallel.pp=1; give "
                                  "parallel.pp > 1 or leave it unset")
        return
    v, m, name = p.pp_stages_per_rank, p.microbatches, p.pp_schedule
    if name == "interleaved_1f1b" and v == 1:
        raise ConfigError("parallel.pp_schedule=interleaved_1f1b with parallel.pp_stages_per_rank=1: interleaving "
                          "needs several stages per rank; give parallel.pp_stages_per_rank=2 (or more), or "
                          "parallel.pp_schedule=1f1b")
    if name not in MULTI_STAGE and v > 1:
        raise ConfigError(f"parallel.pp_stages_per_rank={v} with parallel.pp_schedule={name}: one stage per rank; "
                          "valid with v > 1: interleaved_1f1b, zero_bubble")
    if name == "1f1b" and m < p.pp:
        raise ConfigError(f"parallel.pp_microbatches={m}: 1F1B needs at least as many micro-batches as stages "
                          f"(parallel.pp={p.pp}); valid: {p.pp} or more")
    rounds = max(1, m // p.pp)
    if name in MULTI_STAGE and m % rounds:
        raise ConfigError(f"parallel.pp_microbatches={m}: {name} runs them in {rounds} rounds (m // parallel.pp), "
                          f"which must divide them; valid: a multiple of {p.pp}, e.g. {rounds * p.pp}")
    if t.batch_size % m:
        raise ConfigError(f"train.batch_size={t.batch_size}: not divisible into parallel.pp_microbatches={m}; valid: "
                          f"a multiple of {m}")
    _check_run(cfg, v)


def _check_run(cfg: AblateConfig, v: int) -> None:
    p, t, model = cfg.parallel, cfg.train, cfg.model
    if t.grad_accum > 1:
        raise ConfigError(f"train.grad_accum={t.grad_accum} with parallel.pp={p.pp}: the schedule's micro-batches "
                          "are the accumulation; give parallel.pp_microbatches instead (and train.grad_accum=1)")
    if t.seq_len_min is not None:
        raise ConfigError(f"train.seq_len_min={t.seq_len_min} with parallel.pp={p.pp}: a stage's buffers take the "
                          "first batch's shape; valid: train.seq_len_min=null")
    if p.pp_schedule == "zero_bubble" and p.name != "none":   # checked: pp2 x fsdp2's loss parts from step 2
        raise ConfigError(f"parallel.pp_schedule=zero_bubble with parallel={p.name}: its weight gradients are "
                          "computed after FSDP2 has reduced the stage's gradients (the loss differs from one rank's); "
                          "valid: zero_bubble with parallel=none, or another schedule")
    if t.compile and p.pp_schedule == "zero_bubble":
        raise ConfigError("train.compile=true with parallel.pp_schedule=zero_bubble: torch's split backward does "
                          "not run compiled blocks; valid: train.compile=false, or another schedule")
    if isinstance(model, ModelConfig):
        stages = p.pp * v
        if model.n_layers % stages:
            raise ConfigError(f"parallel.pp={p.pp} x pp_stages_per_rank={v}: model={model.name}'s {model.n_layers} "
                              f"layers do not divide into {stages} stages; valid: pp x v dividing {model.n_layers}")
        if model.moe is not None and model.moe.loss_coef:
            raise ConfigError(f"parallel.pp={p.pp} with model.moe.aux_loss_coef={model.moe.aux_loss_coef}: the "
                              "schedule's loss is the last stage's, and the earlier stages' balance losses would not "
                              "reach it; valid: model.moe.balance=bias, model.moe.aux_loss_coef=0 (or parallel.pp=1)")
        if model.tie_embeddings:
            raise ConfigError(f"parallel.pp={p.pp} with model={model.name}'s tied embeddings: the first stage's "
                              "embedding and the last stage's head would be one weight on two ranks; valid: "
                              "model.tie_embeddings=false")


class Schedule:
    """The schedule that owns a pipelined step, over the stages of one rank; `step(x, y)` -> the step's loss."""

    def __init__(self, pipeline, cfg: AblateConfig, mesh, device: torch.device):
        """`pipeline`: this rank's stages as the strategy wrapped them (model/stages.py's Pipeline)."""
        # (torch.distributed.pipelining's import: paid by the pipelined runs only)
        from torch.distributed.pipelining import PipelineStage, schedules

        p = cfg.parallel
        self.group = mesh["pp"].get_group()
        count = p.pp * p.pp_stages_per_rank
        self.clock = StageClock(device)
        self.stages = [self._timed(PipelineStage(stage, index, count, device, group=self.group))
                       for stage, index in zip(pipeline.stages, pipeline.indices)]
        make = getattr(schedules, TORCH_CLASS[p.pp_schedule])
        self.schedule = make(self.stages if p.pp_schedule in MULTI_STAGE else self.stages[0],
                             n_microbatches=p.microbatches, loss_fn=pipeline.loss_fn)
        self.first = any(s.is_first for s in self.stages)
        self.last = any(s.is_last for s in self.stages)
        self.last_rank = dist.get_global_rank(self.group, p.pp - 1)   # stage count - 1 lives on pp rank pp - 1
        self.device = device
        self.before_forward = None   # called before each micro-batch's forward (the step's memory tracker)
        # torch's MemTracker follows one stage a rank (its per-module figures reset before each micro-batch); two
        # stages a rank lose its modules' stats, and its hooks break a split backward (zero bubble): not tracked
        self.untracked = None if p.pp_schedule not in MULTI_STAGE else \
            f"not measured: parallel.pp_schedule={p.pp_schedule} runs several stages a rank, which torch's memory " \
            "tracker cannot follow"

    def _timed(self, stage):
        for action in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
            setattr(stage, action, self.clock.timed(getattr(stage, action)))
        forward = stage.forward_one_chunk

        def announced(*args, **kwargs):
            if self.before_forward is not None:
                self.before_forward()
            return forward(*args, **kwargs)
        stage.forward_one_chunk = announced
        return stage

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimizer step's forward and backward over the batch; the mean micro-batch loss, on every rank of
        the pipeline."""
        losses: List[torch.Tensor] = []
        self.clock.step_begins()
        self.schedule.step(*((x,) if self.first else ()), target=y if self.last else None,
                           losses=losses if self.last else None, return_outputs=False)
        self.clock.step_ends()
        loss = torch.stack([part.detach().float() for part in losses]).mean() if self.last else \
            torch.zeros((), device=self.device)
        with paused():   # ablate's own bookkeeping: not the pipeline's traffic
            dist.broadcast(loss, src=self.last_rank, group=self.group)
        return loss


def pp_norm(total: torch.Tensor, mesh) -> torch.Tensor:
    """The gradient norm over every stage: each stage's norm squared, summed over the pipeline (counted on pp)."""
    squared = total.pow(2)
    dist.all_reduce(squared, group=mesh["pp"].get_group())
    return squared.sqrt()
