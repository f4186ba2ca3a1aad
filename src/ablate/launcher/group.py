"""A child command (a sweep's run, a tune's trial, a batch search's trial) in a process group of its own, so
that whatever stops it reaches all of it (its ranks, its loader workers) and nothing is left orphaned: past
its timeout the group is killed and the result says so (exit 124); Ctrl-C or SIGTERM to the caller is passed
on, the child checkpoints at its next step boundary and ends, and the caller stops (RunStopped) in one line.
The one place ablate's drivers start such a child (sweeps/runner.py, tune/, maxbatch/)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ablate.config import RunStopped, record

STOP_GRACE_S = 120   # a stopped caller waits this long for its child to checkpoint and end, then kills it


class Interrupted(Exception):
    """SIGTERM to a driver (Ctrl-C is KeyboardInterrupt), raised where it waits (raise_on_sigterm)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_on_sigterm() -> None:
    """SIGTERM to the driver raises Interrupted where it waits (its default would kill it outright, leaving the
    child, which has its own session, orphaned)."""
    def stop(signum, frame):
        raise Interrupted(signum)
    signal.signal(signal.SIGTERM, stop)


def stopped_between(e: BaseException, then: str) -> RunStopped:
    """Ctrl-C (KeyboardInterrupt) or SIGTERM (Interrupted) to a driver while no child of its runs."""
    signum = getattr(e, "signum", signal.SIGINT)
    return RunStopped(f"stopped by {signal.Signals(signum).name} between runs; {then}", exit_code=128 + signum)


def stop(proc: subprocess.Popen, signum: int, then: str) -> None:
    """Pass the stop to the child's whole process group: it checkpoints at its next step boundary and ends;
    past STOP_GRACE_S it is killed. Then the caller ends, said in one line (`then`: what happens next)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    raise RunStopped(f"stopped by {signal.Signals(signum).name}: the run in progress was told to stop and ended; "
                     f"{then}", exit_code=128 + signum) from None


def _kill_after_timeout(proc: subprocess.Popen, grace_s: float) -> None:
    """With `grace_s` (a Slurm job step: srun passes SIGTERM on to its tasks on every node, which a SIGKILL to
    srun alone would leave running) the group gets SIGTERM first, then SIGKILL that much later."""
    if grace_s:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def run(cmd: List[str], env: Optional[Dict[str, str]] = None, timeout: Optional[float] = None, grace_s: float = 0,
        keep_stdout: bool = False, then: str = "the same command continues",
        on_terminal: bool = False) -> subprocess.CompletedProcess:
    """`cmd` in its own process group, to its end or its timeout (then exit 124, "timed out after N s" in its
    stderr); stdout kept only when asked (a run's console table is in its directory); `on_terminal`: both
    streams go where the caller's go (a -m job's progress and summary), nothing kept. What is kept goes through
    unlinked files, not pipes: a child whose caller is killed outright (kill -9) writes on and finishes its run,
    where a pipe with no reader would end it at its next line (BrokenPipeError)."""
    with tempfile.TemporaryFile("w+", errors="replace") as out_file, \
            tempfile.TemporaryFile("w+", errors="replace") as err_file:
        streams = dict(stdout=None, stderr=None) if on_terminal else \
            dict(stdout=out_file if keep_stdout else subprocess.DEVNULL, stderr=err_file)
        proc = subprocess.Popen(cmd, text=True, env=env, start_new_session=True, **streams)

        def kept(file) -> Optional[str]:
            if on_terminal or (file is out_file and not keep_stdout):
                return None
            file.seek(0)
            return file.read()
        try:
            proc.wait(timeout=timeout)
        except KeyboardInterrupt:
            stop(proc, signal.SIGINT, then)
        except Interrupted as e:
            stop(proc, e.signum, then)
        except subprocess.TimeoutExpired:
            _kill_after_timeout(proc, grace_s)
            proc.wait()
            return subprocess.CompletedProcess(cmd, 124, kept(out_file),
                                               f"{kept(err_file) or ''}\ntimed out after {timeout:.0f} s")
        except BaseException:   # anything else ends the caller: the child must not outlive it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        return subprocess.CompletedProcess(cmd, proc.returncode, kept(out_file), kept(err_file))


def run_ablate(args: List[str], run_dir: Path, module: str = "ablate", prefix: Sequence[str] = (),
               **how) -> Tuple[subprocess.CompletedProcess, Optional[record.Record]]:
    """`python -m ablate ARGS hydra.run.dir=RUN_DIR` (or another entry point: `module`, e.g. ablate.maxbatch) as a
    child, run() above with its options (`how`), after `prefix` (a Slurm job step's `srun ...`): its result and the
    record it left (None when it failed or left none). The one way a sweep, a tune or a batch search runs ablate."""
    done = run([*prefix, sys.executable, "-m", module, *args, f"hydra.run.dir={run_dir}"], **how)
    found = record.load(run_dir) if done.returncode == 0 and record.exists(run_dir) else None
    return done, found


OUT_OF_MEMORY = ("out of memory", "OutOfMemoryError", "needs about")   # CUDA's OOM; ablate's memory guard


def out_of_memory(result: subprocess.CompletedProcess) -> bool:
    """The child ran out of memory: CUDA said so, ablate's memory guard refused it, or the kernel's OOM killer
    ended it (SIGKILL)."""
    text = (result.stderr or "") + (result.stdout or "")
    return result.returncode in (-9, 137) or any(s in text for s in OUT_OF_MEMORY)
