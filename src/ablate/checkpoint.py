"""Atomic checkpoints, resume, and preemption: a Slurm warning signal becomes a checkpoint at the next
step boundary, then a requeue; the requeued job resumes with no lost and no repeated steps.

A checkpoint is a directory: the strategy's own files (one torch.save for none/ddp, torch.distributed.checkpoint
shards for FSDP2, DeepSpeed's save_checkpoint for ZeRO) and meta.pt with the GradScaler, the step (which
fixes the data position: batch i is a pure function of i), RNG states and the W&B run id; the loss
scaler's state is the strategy's (it owns the numerics). Only tensors and plain values are stored, and
loaded with weights_only=True: a checkpoint never runs code. It is written
beside the old one and swapped in, so a kill mid-write leaves the previous checkpoint whole.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Dict, Optional

import torch
import torch.distributed as dist

from ablate.config import ConfigError

DIRNAME = "checkpoint"     # <run dir>/checkpoint/: meta.pt (rank 0) + the strategy's own files


class Preempted(Exception):
    """Raised at a step boundary after the checkpoint is written."""

    def __init__(self, signum: int):
        super().__init__(f"preempted by {signal.Signals(signum).name}")
        self.signum = signum


def resolve(resume: Optional[str]) -> Optional[Path]:
    """train.resume: a checkpoint directory, or a run directory holding one."""
    if not resume:
        return None
    path = Path(resume)
    path = path / DIRNAME if (path / DIRNAME / "meta.pt").exists() else path
    if not (path / "meta.pt").is_file():
        raise ConfigError(f"train.resume={resume}: no checkpoint there (expected {DIRNAME}/meta.pt in a run dir)")
    return path


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save(target: Path, strategy, step: int, wandb_id: Optional[str], is_main: bool) -> None:
    """Write into <target>.tmp, then swap it in: a kill at any moment leaves a whole checkpoint behind."""
    tmp, old = target.with_name(target.name + ".tmp"), target.with_name(target.name + ".old")
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    strategy.save_checkpoint(tmp)     # collective for sharded strategies: every rank writes its part
    if is_main:
        torch.save({"step": step, "rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                    "wandb_id": wandb_id}, tmp / "meta.pt")
    _barrier()
    if is_main:
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    _barrier()


def load(path: Path, strategy) -> Dict:
    meta = torch.load(path / "meta.pt", map_location="cpu", weights_only=True)
    strategy.load_checkpoint(path)
    torch.set_rng_state(meta["rng"])
    if meta.get("cuda_rng") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(meta["cuda_rng"])
    return meta


def truncate_metrics(run_dir: Path, step: int) -> None:
    """Drop log rows past the checkpoint: they will be computed again, and each step is logged once."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    os.replace(tmp, path)


class Preemption:
    """Inside a submitit job: the warning signal (USR2) and SIGTERM set a flag instead of acting at once;
    the loop checks it at step boundaries (`due`), all ranks agree, and then `hand_over` lets submitit
    requeue. Outside Slurm nothing is installed and `due` costs nothing."""

    def __init__(self, world_size: int):
        self.signum: Optional[int] = None
        self.previous = {}
        self.active = "SUBMITIT_EXECUTOR" in os.environ or "SLURM_JOB_ID" in os.environ
        self.world_size = world_size
        if not self.active:
            return
        for sig in (signal.SIGUSR2, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._flag)

    def _flag(self, signum, frame) -> None:
        self.signum = signum

    def due(self) -> bool:
        if not self.active:
            return False
        if self.world_size == 1:
            return self.signum is not None
        from ablate.metrics.comm import paused

        flag = torch.tensor([self.signum or 0], dtype=torch.int64)
        with paused():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=_control_group())
        if flag.item() and self.signum is None:
            self.signum = int(flag.item())
        return bool(flag.item())

    def hand_over(self, is_main: bool) -> None:
        """After the checkpoint: rank 0 lets submitit requeue (USR2) or Slurm requeue (SIGTERM), then leaves."""
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
