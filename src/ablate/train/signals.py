"""Stop signals: a Slurm warning signal, SIGTERM or Ctrl-C becomes a flag the loop checks at step boundaries;
the ranks agree, the loop checkpoints, and the run ends with one line (`stopped`) or is requeued."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from ablate.metrics.comm import paused
from ablate.train.checkpoint import DIRNAME, read_meta
from ablate.train.ranks import rank_env


def stopped(signum: int, run_dir: Path, cause: str = "") -> str:
    """The one line a run stopped by a signal ends with: the checkpoint it left, and how to continue."""
    name = cause or f"stopped by {signal.Signals(signum).name}"
    meta = run_dir / DIRNAME / "meta.pt"
    if not meta.is_file():
        return f"{name} before a checkpoint was written; nothing to continue from in {run_dir}"
    step = read_meta(meta.parent)["step"]
    return f"{name}: checkpoint at step {step} in {meta.parent}; continue with train.resume={run_dir}"


ORPHANED = "the launching process was killed (its ranks stopped by themselves)"

# One Ctrl-C reaches a rank of a local multi-rank run twice: from the terminal (the whole process group)
# and from the launcher, which forwards what it got. Copies this close together are one request.
REPEAT_WINDOW_S = 2.0


class Preemption:
    """Stop signals become a flag the loop checks at step boundaries (`due`); all ranks agree, the loop
    checkpoints, then `hand_over`. Inside a submitit job: USR2 (the time-limit warning) and SIGTERM, then
    submitit requeues. Anywhere else: SIGTERM and SIGINT (Ctrl-C), then the run ends with one line that
    says how to continue it."""

    def __init__(self, world_size: int):
        self.signum: Optional[int] = None
        self.first_at = 0.0
        self.previous = {}
        self.slurm = rank_env().in_slurm
        self.world_size = world_size
        # a rank started by a local launcher (torch elastic: ours, or torchrun) whose launcher is killed outright
        # (kill -9) has nobody left to say what happened (`orphaned`: rank 0 says it itself)
        self.parent = os.getppid() if rank_env().elastic else None
        self.orphaned = False
        signals = (signal.SIGUSR2, signal.SIGTERM) if self.slurm else (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            try:
                self.previous[sig] = signal.signal(sig, self._flag)
            except ValueError:   # not the main thread (e.g. an embedding caller): no signal handling
                pass

    def _flag(self, signum, frame) -> None:
        if self.signum is None:
            self.signum, self.first_at = signum, time.monotonic()
        elif signum == signal.SIGINT and time.monotonic() - self.first_at > REPEAT_WINDOW_S:
            raise KeyboardInterrupt   # a second, deliberate Ctrl-C: stop now

    def due(self) -> bool:
        if self.parent and os.getppid() != self.parent:   # the launcher is gone: torch's spawn sends its ranks
            self.orphaned = True                            # SIGINT then (PR_SET_PDEATHSIG); or nothing at all
            self.signum = self.signum or signal.SIGTERM
        if self.world_size == 1:
            return self.signum is not None
        flag = torch.tensor([self.signum or 0], dtype=torch.int64)
        with paused():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=_control_group())
        if flag.item() and self.signum is None:
            self.signum = int(flag.item())
        return bool(flag.item())

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def hand_over(self, is_main: bool) -> None:
        """After the checkpoint: under Slurm rank 0 lets submitit requeue (USR2) or Slurm requeue (SIGTERM)
        and the process leaves without a result; elsewhere the caller ends the run with one line."""
        if not self.slurm:
            return
        handler = self.previous.get(self.signum)
        if self.signum == signal.SIGUSR2 and is_main and callable(handler):
            handler(self.signum, None)     # submitit: checkpoint() + scontrol requeue + exit
        os._exit(0)   # leave without a result file: the job is not over, it is requeued


_CONTROL = None


def _control_group():
    """A gloo group for control flags, so that checking one never syncs a GPU stream."""
    global _CONTROL
    if _CONTROL is None:
        _CONTROL = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD
    return _CONTROL
