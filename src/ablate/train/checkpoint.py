"""Atomic checkpoints, safe resume, and stop signals: a Slurm warning signal, SIGTERM or Ctrl-C becomes a
checkpoint at the next step boundary; a requeued or resumed run continues with no lost and no repeated steps.

A checkpoint is a directory: the strategy's own files (one torch.save for none/ddp, torch.distributed.checkpoint
shards for FSDP2, DeepSpeed's save_checkpoint for ZeRO; the loss scaler is the strategy's) and meta.pt with
the step (which fixes the data position: batch i is a pure function of i), RNG states, the W&B run id, the
config it was made with and the meter's totals (so the summary covers every attempt). It is written beside
the old one and swapped in; the one before stays as `checkpoint.prev`, the fallback when the latest cannot
be read. Only tensors and plain values are stored, and loaded with weights_only=True: a checkpoint never
runs code.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from ablate import parallel
from ablate.config import ConfigError
from ablate.metrics.comm import paused
from ablate.train.distributed import rank_env

DIRNAME = "checkpoint"     # <run dir>/checkpoint/: meta.pt (rank 0) + the strategy's own files
PREVIOUS = DIRNAME + ".prev"


class Preempted(Exception):
    """Raised at a step boundary after the checkpoint is written."""

    def __init__(self, signum: int, step: int = 0):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum, self.step = signum, step


class RunStopped(Exception):
    """The run ended early on purpose (a stop signal, non-finite training): one line for the user."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def resolve(resume: Optional[str]) -> Optional[Path]:
    """train.resume: a checkpoint directory, or a run directory holding one."""
    if not resume:
        return None
    path = Path(resume)
    for candidate in (path / DIRNAME, path / PREVIOUS, path):
        if (candidate / "meta.pt").is_file():
            return candidate
    raise ConfigError(f"train.resume={resume}: no checkpoint there (expected {DIRNAME}/meta.pt in a run dir)")


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save(target: Path, strategy, step: int, meta: Dict, is_main: bool) -> None:
    """Write into <target>.tmp, then swap it in (the old one becomes <target>.prev): a kill at any moment
    leaves a whole checkpoint behind."""
    tmp, prev = target.with_name(target.name + ".tmp"), target.with_name(PREVIOUS)
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    strategy.save_checkpoint(tmp)     # collective for sharded strategies: every rank writes its part
    if is_main:
        torch.save({"step": step, "rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None, **meta},
                   tmp / "meta.pt")
    _barrier()
    if is_main:
        if target.exists():
            shutil.rmtree(prev, ignore_errors=True)
            os.replace(target, prev)
        os.replace(tmp, target)
    _barrier()


def read_meta(path: Path) -> Dict:
    """meta.pt, refusing anything but tensors and plain values (nothing in it can run code)."""
    try:
        return torch.load(path / "meta.pt", map_location="cpu", weights_only=True)
    except Exception as e:
        if "weights_only" in str(e) or "Unsupported global" in str(e) or "UnpicklingError" in type(e).__name__:
            raise ConfigError(f"train.resume: {path / 'meta.pt'} holds more than tensors and plain values; refused "
                              "(loading it could run code)") from None
        raise


def describe(e: BaseException) -> str:
    """An exception as one short phrase; a bare one (`AssertionError:`) says where it was raised."""
    import traceback

    text = (str(e).strip().splitlines() or [""])[-1][:200]
    if text:
        return f"{type(e).__name__}: {text}"
    frames = traceback.extract_tb(e.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno} ({frames[-1].name})" if frames else ""
    return f"{type(e).__name__}{where}"


def load(path: Path, strategy) -> Dict:
    """Restore `path`; when it cannot be read, the previous checkpoint beside it (said in one line)."""
    candidates: List[Path] = [path] + ([path.with_name(PREVIOUS)] if path.name == DIRNAME else [])
    for i, candidate in enumerate(candidates):
        if not (candidate / "meta.pt").is_file():
            continue
        try:
            meta = read_meta(candidate)
            strategy.load_checkpoint(candidate)
        except ConfigError:
            raise
        except Exception as e:
            if i + 1 < len(candidates) and (candidates[i + 1] / "meta.pt").is_file():
                if not dist.is_initialized() or dist.get_rank() == 0:
                    print(f"ablate: warning: checkpoint {candidate} cannot be read ({describe(e)}); resuming "
                          f"from {candidates[i + 1]}", file=sys.stderr)
                continue
            raise ConfigError(f"train.resume: checkpoint {candidate} cannot be read ({describe(e)})") from None
        torch.set_rng_state(meta["rng"])
        if meta.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(meta["cuda_rng"])
        return meta
    raise ConfigError(f"train.resume: no readable checkpoint in {path}")


# what a checkpoint's format cannot change on resume (parallel: each strategy's file layout, in its registry)
FIXED = ("model", "precision.name")
CHANGEABLE = ("train.lr", "train.weight_decay", "train.beta1", "train.beta2", "train.max_grad_norm")


def _flat(node, prefix="") -> Dict[str, object]:
    out = {}
    for k, v in (node or {}).items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_resumable(saved: Optional[Dict], now: Dict, step: int, world: int, saved_world: Optional[int]) -> Dict:
    """Refuse (one line) what a checkpoint cannot become; return {key: [saved, now]} of what changes."""
    steps = now["train"]["steps"]
    if steps <= step:
        raise ConfigError(f"train.steps={steps}: the checkpoint is at step {step}; ask for more steps to continue "
                          f"(e.g. train.steps={step + max(step, 10)})")
    if not saved:
        return {}
    a, b = _flat(saved), _flat(now)
    fixed = [k for k in sorted(set(a) | set(b)) if k.startswith(FIXED) and a.get(k) != b.get(k)]
    was, now_ = (parallel.REGISTRY.get(a.get("parallel.name")), parallel.REGISTRY.get(b.get("parallel.name")))
    if was is None or now_ is None or was.checkpoint != now_.checkpoint \
            or (was.checkpoint_per_world and saved_world not in (None, world)):
        fixed.append(f"parallel ({a.get('parallel.name')} on {saved_world} ranks -> {b.get('parallel.name')} on "
                     f"{world})")
    if fixed:
        what = ", ".join(f"{k}={a.get(k)} -> {b.get(k)}" if "=" not in k and "(" not in k else k for k in fixed[:4])
        raise ConfigError(f"train.resume: the checkpoint cannot continue with a different {fixed[0].split('.')[0]}: "
                          f"{what}; resume with the checkpoint's values, or start a new run")
    return {k: [a.get(k), b.get(k)] for k in CHANGEABLE if a.get(k) != b.get(k)}


def check_resume(cfg, record: Dict) -> None:
    """What a resume cannot become, refused before anything is written (each rank checks again as it loads)."""
    path = resolve(cfg.train.resume)
    if path is not None:
        meta = read_meta(path)
        check_resumable(meta.get("config"), record, meta["step"], cfg.launcher.world_size, meta.get("world_size"))


def read_metrics(path: Path) -> List[Dict]:
    """metrics.jsonl rows; a torn line (a kill or a full disk mid-write) is dropped, not fatal."""
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def truncate_metrics(run_dir: Path, step: int) -> None:
    """Drop log rows past the checkpoint (they will be computed again, each step is logged once) and any
    torn line."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return
    keep = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
    os.replace(tmp, path)


def stopped(signum: int, run_dir: Path) -> str:
    """The one line a run stopped by a signal ends with: the checkpoint it left, and how to continue."""
    name = signal.Signals(signum).name
    meta = run_dir / DIRNAME / "meta.pt"
    if not meta.is_file():
        return f"stopped by {name} before a checkpoint was written; nothing to continue from in {run_dir}"
    step = read_meta(meta.parent)["step"]
    return f"stopped by {name}: checkpoint at step {step} in {meta.parent}; continue with train.resume={run_dir}"


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
