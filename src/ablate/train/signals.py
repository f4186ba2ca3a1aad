"""Stop signals: a Slurm warning signal, SIGTERM or Ctrl-C becomes a flag the loop checks at step boundaries;
the ranks agree (about once a second), the loop checkpoints, and the run ends with one line (`stopped`) or is
requeued."""
from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from ablate.metrics.counting import paused
from ablate.train.checkpoint import DIRNAME, read_meta
from ablate.train.ranks import rank_env


def stopped(signum: int, run_dir: Path, cause: str = "") -> str:
    """The one line a run stopped by a signal ends with: the checkpoint it left, and how to continue."""
    name = cause or f"stopped by {signal.Signals(signum).name}"
    meta = run_dir / DIRNAME / "meta.pt"
    if not meta.is_file():
        return f"{name} before a checkpoint was written; nothing to continue from in {run_dir}"
    meta = read_meta(meta.parent)
    step, last = meta["step"], ((meta.get("config") or {}).get("train") or {}).get("steps")
    if last is not None and step >= last:   # (the signal came as the last step ended: a resume has nothing to do)
        return f"{name} as its last step ended: the run is complete (step {step} of {last}, checkpoint in " \
               f"{run_dir / DIRNAME}); nothing to continue"
    return f"{name}: checkpoint at step {step} in {run_dir / DIRNAME}; continue with train.resume={run_dir}"


ORPHANED = "the launching process was killed (its ranks stopped by themselves)"
PF_EXITING = 0x4   # a task's flag while it is being shut down (include/linux/sched.h)
# set by our local launcher for its ranks: a fork server, not the launcher, is their parent (launcher/local.py)
LAUNCHER_PID = "ABLATE_LAUNCHER_PID"


def launcher_pid() -> int:
    """The process that launched this rank: ours names itself; torchrun's agent is the rank's parent."""
    return int(os.environ.get(LAUNCHER_PID) or os.getppid())


HAS_PROC = os.path.isdir("/proc/self")   # Linux: processes and their threads are read from /proc


def _stat(path: str) -> Optional[list]:
    """A /proc stat file's fields after the command name (which may hold spaces); None once it is gone."""
    try:
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None


def identity(pid: int) -> Optional[tuple]:
    """(state, start time) of process `pid` (proc(5) fields 3 and 22), None once it is gone; without /proc,
    ("?", None) while a signal can reach it."""
    if HAS_PROC:
        fields = _stat(f"/proc/{pid}/stat")
        return None if fields is None else (fields[0], fields[19])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except OSError:
        pass
    return "?", None


def gone(pid: int, known: Optional[tuple]) -> bool:
    """Whether the process `known` as identity(pid) has ended: no such process, a zombie, or the pid reused
    (`known` None: it was gone when first looked at)."""
    now = identity(pid)
    return known is None or now is None or now[0] in ("Z", "X", "x") or now[1] != known[1]


def exiting(pid: Optional[int]) -> bool:
    """Whether a thread of process `pid` is going down (kill -9 takes a process's threads down one by one, and
    the process stays until the last is gone). Linux's /proc; elsewhere, and for None, False."""
    if not pid or not HAS_PROC:
        return False
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    except OSError:
        return False
    for tid in threads:
        fields = _stat(f"/proc/{pid}/task/{tid}/stat")
        if fields and (fields[0] in ("Z", "X", "x") or int(fields[6]) & PF_EXITING):
            return True   # (a thread that ended between the listing and the read has no fields)
    return False

def watch(pid: int) -> Optional[int]:
    """A pidfd for process `pid` (Linux 5.3+): readable once it has ended, so asking costs a poll, not a /proc
    read, and a reused pid cannot fool it. None where there is none (then identity() at agreement steps)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def ended(pidfd: int) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


# Stop requests are agreed by the ranks about once a second of training, never more often than once a step: a
# collective per step is one the user's training does not make (and a gloo round trip on a fast step), while a
# stop a second late costs nothing (Slurm warns minutes ahead). The interval in steps is agreed at each check.
AGREE_EVERY_S = 1.0
MAX_STEPS_BETWEEN_CHECKS = 100

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
        self.parent = launcher_pid() if rank_env().elastic else None
        self.parent_identity = identity(self.parent) if self.parent else None
        self.parent_fd = watch(self.parent) if self.parent else None
        self.orphaned = False
        self.next_check, self.checked_step, self.checked_at = 0, 0, time.monotonic()
        signals = (signal.SIGUSR2, signal.SIGTERM) if self.slurm else (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            try:
                self.previous[sig] = signal.signal(sig, self._flag)
            except ValueError:   # not the main thread (e.g. an embedding caller): no signal handling
                pass

    def _flag(self, signum, frame) -> None:
        if self.signum is None:
            self.signum, self.first_at = signum, time.monotonic()
        elif signum == signal.SIGINT and time.monotonic() - self.first_at > REPEAT_WINDOW_S \
                and not self.launcher_gone() and not exiting(self.parent):
            # (a dying launcher's late copy is nobody's second Ctrl-C: torch's spawn leaves a rank silently
            # on a KeyboardInterrupt, and rank 0 would never say that its launcher was killed)
            raise KeyboardInterrupt   # a second, deliberate Ctrl-C: stop now

    def launcher_gone(self, settle_s: float = 0) -> bool:
        """Whether the local launcher that started this rank is gone (ended, or a zombie nobody reaped yet).
        `settle_s`: a launcher seen exiting is given that long to be gone (a loaded host can take seconds to
        take down a killed process's threads)."""
        if not self.parent or self.orphaned:
            return self.orphaned
        if not settle_s and self.parent_fd is not None:
            self.orphaned = ended(self.parent_fd)
            return self.orphaned
        if settle_s and exiting(self.parent):
            deadline = time.monotonic() + settle_s
            while not gone(self.parent, self.parent_identity) and time.monotonic() < deadline:
                time.sleep(0.05)
        self.orphaned = gone(self.parent, self.parent_identity)
        return self.orphaned

    def due(self, step: int) -> bool:
        """Whether to stop after `step`: at once for one rank; several ranks agree at check steps only (about
        once a second, AGREE_EVERY_S), all of them at the same steps."""
        if self.world_size == 1:
            if self.launcher_gone():   # (SIGINT from the kernel, or nothing at all: stop all the same)
                self.signum = self.signum or signal.SIGTERM
            return self.signum is not None
        if step < self.next_check:
            return False
        if self.launcher_gone():
            self.signum = self.signum or signal.SIGTERM
        # the ranks share their launcher, yet each sees it gone at its own moment: agree on that too, so that
        # rank 0 says so even when only its peer noticed first; the next check step is the soonest proposed
        flags = torch.tensor([self.signum or 0, int(self.orphaned), -self.steps_to_next_check(step)],
                             dtype=torch.int64)
        with paused():
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=_control_group())
        signum, orphaned, minus_steps = (int(v) for v in flags.tolist())
        self.next_check = step - minus_steps
        if signum and self.signum is None:
            self.signum = signum
        self.orphaned = bool(orphaned)
        return bool(signum)

    def check_after(self, step: int) -> None:
        """After a pause every rank takes at the same step (a checkpoint's save): agree at the next step, since the
        pause may have held a stop signal for longer than a check's interval already."""
        self.next_check = min(self.next_check, step + 1)

    def steps_to_next_check(self, step: int) -> int:
        """This rank's proposal: as many steps as it ran in AGREE_EVERY_S since the last check (1 to 100)."""
        now = time.monotonic()
        per_step = (now - self.checked_at) / max(step - self.checked_step, 1)
        self.checked_step, self.checked_at = step, now
        return max(1, min(MAX_STEPS_BETWEEN_CHECKS, int(AGREE_EVERY_S / max(per_step, 1e-6))))

    def restore(self) -> None:
        """The handlers from before the run. A launched rank that stops on a signal leaves right after: late
        copies of the stop (Ctrl-C reaches it from the terminal and the launcher; the kernel repeats a dead
        launcher's SIGINT) are ignored then, so that none interrupts its exit with a traceback."""
        leaving = self.parent is not None and self.signum is not None
        for sig, handler in self.previous.items():
            signal.signal(sig, signal.SIG_IGN if leaving else handler)

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
