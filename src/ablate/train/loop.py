"""The training loop: the steps themselves, and what happens between them (checkpoints, stop signals, the
non-finite rule). Built by trainer.py, which assembles a rank's run around it.
"""
from __future__ import annotations

import errno
import math
import os
import shutil
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Dict, List, Optional

from ablate import optim, parallel, units
from ablate.config import RunStopped
from ablate.metrics.activations import SavedTensors
from ablate.metrics.collectors import Collected, StepEvent
from ablate.metrics.profile import StepProfiler
from ablate.metrics.step_memory import NOT_TRACKED, StepMemory, tracked_step
from ablate.metrics.stopped import Continued
from ablate.model import checkpointing
from ablate.train import checkpoint, hooks, signals

PIPELINE_UNCOUNTED = ("parallel.pp > 1: not counted (autograd's saved tensors are counted around one module's "
                      "forward, not a schedule's; ablate.plan gives a stage's)")


class Diverged(RunStopped):
    """Training diverged (non-finite loss or gradient norm): the run stops in one line, its figures so far still
    summarised (summary.json), as a run that ended."""


class Loop:
    """The steps themselves, plus what happens between them: checkpoints, stop signals, and the
    non-finite rule (checked at log steps and before every checkpoint: no host sync per step)."""

    def __init__(self, cfg, env, strategy, feeder, meter, tracker, progress, run_dir: Path, resolved: Dict,
                 blocks=None):
        self.cfg, self.env, self.strategy, self.feeder = cfg, env, strategy, feeder
        self.meter, self.tracker, self.progress, self.run_dir = meter, tracker, progress, run_dir
        self.resolved = resolved
        self.profiler = StepProfiler(cfg.metrics.profile_steps, env.device, run_dir, env.rank, env.is_main)
        self._profile_logged = False
        self.preemption = signals.Preemption(env.world_size)
        self.continued = Continued().install()   # when this rank was continued after a stop (stalls name it)
        self.saved_step: Optional[int] = None
        self.predicted_here: Optional[Dict] = None   # rank 0's prediction on a CPU, made before the first step
        self.unconfirmed: Optional[int] = None   # the step of a checkpoint whose weights' loss is not known yet
        self.hooks = hooks.load()   # ABLATE_STEP_HOOKS: called as each step begins (train/hooks.py)
        self.lr = cfg.optim.lr
        self.blocks = blocks or []
        self.activation_bytes: Optional[int] = None
        self.step_memory: Optional[StepMemory] = None   # one step's peak (metrics/step_memory.py)
        self.collected = Collected(cfg.metrics.collectors)   # the user's own figures (metrics.collectors)
        self.last_loss = None
        if strategy.pipeline is not None:   # absent under a schedule (counted around one module's forward only)
            self.meter.notes["activation_bytes"] = PIPELINE_UNCOUNTED

    def micro_steps(self) -> None:
        t, strategy = self.cfg.train, self.strategy
        if strategy.pipeline is not None:
            return self.pipelined_step()
        for micro in range(t.grad_accum):
            x, y = next(self.feeder)
            if self.step_memory is not None:
                self.step_memory.micro_step()
            self.meter.clock.begin()
            # the run's first micro-step counts what autograd saves for backward (summary.json's activation_bytes)
            first = self.activation_bytes is None
            saved = SavedTensors(self.blocks) if first else nullcontext()
            # selective checkpointing keeps its ops' outputs where autograd's hooks do not see them: counted per op
            kept = checkpointing.KeptBySelective(self.blocks) \
                if first and self.cfg.model.activation_checkpointing == "selective" else nullcontext()
            with strategy.micro_step(last=micro == t.grad_accum - 1):
                with strategy.autocast(), saved, kept:
                    loss = strategy.model(x, y)
                if first:
                    self.activation_bytes = self.saved_for_backward(saved, getattr(kept, "by_block", []))
                strategy.backward(loss / t.grad_accum)
            self.meter.clock.end("fwd_bwd")
            self.meter.on_micro(loss)
            self.last_loss = loss

    def pipelined_step(self) -> None:
        """parallel.pp > 1: the schedule owns the step's forward and backward over its micro-batches
        (parallel/pipeline.py); its loss is the step's, on every rank of the pipeline."""
        x, y = next(self.feeder)
        self.meter.clock.begin()
        with self.strategy.autocast():
            loss = self.strategy.pipeline.step(x, y)
        self.meter.clock.end("fwd_bwd")
        self.meter.on_micro(loss)
        self.last_loss = loss

    def saved_for_backward(self, saved: SavedTensors, kept: List[int]) -> int:
        """With activation checkpointing torch's checkpoint keeps each checkpointed block's input out of autograd's
        sight, and selective checkpointing the outputs it saves (`kept`, counted per op): added (a block's recompute
        in backward is not seen here: ablate.plan adds one)."""
        mode = self.cfg.model.activation_checkpointing
        if not mode:
            return saved.bytes
        self.meter.notes["activation_bytes"] = ("activation checkpointing: the checkpointed blocks' inputs, what "
                                                "selective checkpointing keeps, and what autograd saves outside "
                                                "them; one block's recompute in backward not included")
        inputs = [b for i, b in enumerate(saved.block_inputs) if checkpointing.checkpointed(i, mode)]
        return saved.bytes + sum(inputs) + sum(kept)

    def run(self, start_step: int) -> None:
        t = self.cfg.train
        first_measured = min(start_step + t.warmup_steps + 1, t.steps)
        self.meter.excluded["warmup"] = list(range(start_step + 1, first_measured))
        traced = set(self.profiler.traced_steps(start_step + 1))
        tracked = tracked_step(start_step, first_measured, t.steps)
        left_out = tracked if tracked is not None and tracked >= first_measured else None   # not a warm-up step
        for step in range(start_step + 1, t.steps + 1):
            if step == first_measured:
                self.meter.start_measuring()
            if step in traced:
                self.meter.exclude_from(step)
            if step == left_out:
                self.meter.exclude_from(step, "memory_tracked")
            self.meter.step_begins(step)
            for hook in self.hooks:
                hook(self.env.rank, step)
            self.lr = optim.lr_at(step, self.cfg.optim, t.steps)
            optim.set_lr(self.strategy.optimizer_param_groups, self.lr)
            with self.tracking_memory(step == tracked):
                self.micro_steps()
                self.meter.clock.begin()
                grad_norm = self.strategy.step(measure_state=step == t.steps)
                self.meter.clock.end("optimizer")
            self.meter.on_step(grad_norm)
            self.collect(step)
            self.confirm_saved(step)
            self.profiler.step()
            if (step in traced and step + 1 not in traced) or step == left_out:   # steady steps again
                self.meter.include_again()
            row = None
            if step % t.log_every == 0 or step == t.steps:
                row = self.meter.log_point(step)
                row["lr"] = self.lr
                self.collected.into_row(row)
                self.add_profile(row)
                self.log(step, row)
                self.check_finite(step)
                self.check_ended_finite(step, row)
            self.progress.advance(step, row)
            self.between_steps(step)

    def memory_record(self) -> Dict[str, object]:
        """summary.json's measured peak (metrics/step_memory.py), with why where no step was tracked."""
        if self.step_memory is None or self.step_memory.why:
            why = self.step_memory.why if self.step_memory else NOT_TRACKED
            self.meter.notes.setdefault("peak_bytes_measured", why)   # (a pipeline's reason, said when it was not)
            return StepMemory.absent()
        return self.step_memory.record()

    def tracking_memory(self, tracked: bool):
        if not tracked:
            return nullcontext()
        if self.strategy.pipeline is not None and self.strategy.pipeline.untracked:
            self.meter.notes["peak_bytes_measured"] = self.strategy.pipeline.untracked
            return nullcontext()
        self.step_memory = StepMemory(self.env.device, self.strategy.model, getattr(self.strategy, "optimizer", None))
        if self.strategy.pipeline is not None:   # each micro-batch's forward is one call of the stage's modules
            self.strategy.pipeline.before_forward = self.step_memory.micro_step
        return self.step_memory

    def collect(self, step: int) -> None:
        if self.collected.collectors:
            self.collected.on_step(StepEvent(step, self.last_loss.detach(), self.feeder.tokens, self.strategy.model,
                                             getattr(self.strategy, "optimizer", None), self.env.rank,
                                             self.env.world_size))

    def log(self, step: int, row: Dict) -> None:
        """A row to metrics.jsonl (and W&B); a disk that cannot take it (full, gone read-only) stops the run in one
        line naming the last good checkpoint, which stays as it was."""
        try:
            self.tracker.log(row)
        except OSError as e:
            where = self.run_dir / "metrics.jsonl"
            free = shutil.disk_usage(self.run_dir).free if self.run_dir.exists() else 0
            raise RunStopped(f"stopped at step {step}: {where} cannot be written ({os.strerror(e.errno or errno.EIO)}; "
                             f"{units.fmt('free_bytes', free)} free); {self.last_good()}, intact") from None

    def add_profile(self, row: Dict) -> None:
        """The traced steps' figures join the first log row after the trace is in (and W&B gets the trace)."""
        if self.profiler.result is None or self._profile_logged:
            return
        row.update(self.profiler.figures())
        self.tracker.add_file(self.profiler.path, "trace")
        self._profile_logged = True

    def last_good(self) -> str:
        return (f"last good checkpoint: {self.run_dir / checkpoint.DIRNAME} (step {self.saved_step})"
                if self.saved_step else "no good checkpoint was written")

    def confirm_saved(self, step: int) -> None:
        """A checkpoint's weights are known good only once the next step's loss, computed from them, is finite
        (fp16: finite weights whose forward overflows); a bad one is set aside, the previous one the latest."""
        if self.unconfirmed != step - 1:   # (None: nothing awaits its confirmation)
            return
        bad, self.unconfirmed = self.unconfirmed, None
        if self.strategy.finite_on_every_rank(self.meter.last_loss_finite())[1]:
            return
        self.saved_step = checkpoint.set_aside(self.run_dir / checkpoint.DIRNAME, self.env.is_main)
        if self.env.is_main:
            print(f"ablate: warning: step {step}: the loss of the weights checkpointed at step {bad} is not finite; "
                  f"that checkpoint is set aside ({checkpoint.BROKEN}), "
                  f"{self.last_good() if self.saved_step else 'no good one is left'}", file=sys.stderr, flush=True)

    def check_finite(self, step: int) -> None:
        """train.max_nonfinite_steps consecutive steps with a NaN/inf loss or gradient norm (fp16's skipped
        steps count alike) stop the run with one line."""
        limit, bad = self.cfg.train.max_nonfinite_steps, self.meter.consecutive_nonfinite()
        if limit and bad >= limit:
            raise Diverged(f"stopped at step {step}: {bad} consecutive steps with a non-finite loss or "
                           f"gradient norm (train.max_nonfinite_steps={limit}); {self.last_good()}")

    def check_ended_finite(self, step: int, row: Dict) -> None:
        """A run whose last logged loss (the mean over ranks: every rank agrees) is NaN or inf did not train: it
        ends in one line and a non-zero exit, its summary.json kept (fp16's skipped steps keep a finite loss)."""
        loss = row.get("loss")
        if step == self.cfg.train.steps and loss is not None and not math.isfinite(loss):
            raise Diverged(f"ended at step {step} with a non-finite loss ({loss}; {self.meter.consecutive_nonfinite()} "
                           f"consecutive steps with a non-finite loss or gradient norm): training diverged; the "
                           f"figures are in {self.run_dir / 'summary.json'}; {self.last_good()}")

    def between_steps(self, step: int) -> None:
        every, last = self.cfg.train.checkpoint_every, self.cfg.train.steps
        if step < last and self.preemption.due(step):   # at the last step the run simply finishes
            self.save(step)
            raise checkpoint.Preempted(self.preemption.signum, step)
        if every and (step % every == 0 or step == last):
            self.save(step)
            self.preemption.check_after(step)   # (a stop signal that came during the save: acted on at the next step)

    def save(self, step: int) -> None:
        """A checkpoint, only of a step whose weights and loss were finite on every rank (else the previous
        one stays the latest, so "last good checkpoint" names one that resumes finite)."""
        self.check_finite(step)
        weights_finite, loss_finite = self.strategy.finite_on_every_rank(self.meter.last_loss_finite())
        if not weights_finite:   # NaN weights never recover: stop, keep the last good one
            raise Diverged(f"stopped at step {step}: the weights are not finite, so no checkpoint was written from "
                           f"them; {self.last_good()}")
        if not loss_finite:      # fp16: finite weights whose forward overflows; resuming them is NaN at once
            if self.env.is_main:
                print(f"ablate: warning: step {step}: the loss is not finite, so no checkpoint was written "
                      f"({self.last_good() if self.saved_step else 'none yet'})", file=sys.stderr, flush=True)
            return
        self.meter.step_times.take()      # CUDA: the save has synchronised; a resume keeps every step's time
        meta = {"wandb_id": self.tracker.wandb_id, "world_size": self.env.world_size, "totals": self.meter.totals,
                "config": {k: v for k, v in self.resolved.items() if k != "hydra"},
                "mesh": parallel.layout_of(self.cfg).record()}
        checkpoint.save(self.run_dir / checkpoint.DIRNAME, self.strategy, step, meta, self.env.is_main)
        self.saved_step = self.unconfirmed = step
