"""Faults the tests plant in a real run through ablate's step hooks (src/ablate/train/hooks.py), never in
the training loop: `planted(failure="1:3")` is the environment that makes rank 1 raise at step 3,
`planted(delay="1:0.05")` the one that makes rank 1 sleep 50 ms before each step (a straggler)."""
import os
import time
from pathlib import Path
from typing import Dict

TESTS = str(Path(__file__).resolve().parent)


# each planted fault: its argument -> (the variable it sets, the hook that reads it)
FAULTS = {"failure": ("PLANTED_FAILURE", "fail_at"), "delay": ("PLANTED_DELAY", "sleep_before"),
          "kill": ("PLANTED_KILL", "kill_at"), "stop": ("PLANTED_STOP", "stop_at"), "fill": ("PLANTED_FILL", "fill_at")}


def planted(**faults: str) -> Dict[str, str]:
    """The environment that plants these faults (failure, delay, kill, stop, fill: see each hook below)."""
    unknown = set(faults) - set(FAULTS)
    assert not unknown, f"no such planted fault: {unknown}"
    given = {k: v for k, v in faults.items() if v}
    env = {FAULTS[k][0]: v for k, v in given.items()}
    hooks = [f"planted:{FAULTS[k][1]}" for k in FAULTS if k in given]
    path = [TESTS, *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**env, "ABLATE_STEP_HOOKS": ",".join(hooks), "PYTHONPATH": os.pathsep.join(path)}


def fail_at(rank: int, step: int) -> None:
    """PLANTED_FAILURE=RANK:STEP: that rank raises at that step."""
    want_rank, want_step = (int(v) for v in os.environ["PLANTED_FAILURE"].split(":"))
    if (rank, step) == (want_rank, want_step):
        raise RuntimeError(f"injected failure on rank {rank} at step {step} (planted)")


def sleep_before(rank: int, step: int) -> None:
    """PLANTED_DELAY=RANK:SECONDS: that rank sleeps before each step's work."""
    want_rank, seconds = os.environ["PLANTED_DELAY"].split(":")
    if rank == int(want_rank):
        time.sleep(float(seconds))


def kill_at(rank: int, step: int) -> None:
    """PLANTED_KILL=RANK:STEP: that rank is killed with SIGKILL at that step (kill -9: it says nothing)."""
    want_rank, want_step = (int(v) for v in os.environ["PLANTED_KILL"].split(":"))
    if (rank, step) == (want_rank, want_step):
        os.kill(os.getpid(), 9)


def stop_at(rank: int, step: int) -> None:
    """PLANTED_STOP=RANK:STEP:SECONDS[:AFTER]: that rank is stopped (SIGSTOP, as a debugger or the OS would) at that
    step for that long, AFTER seconds into the step (wherever it then is: computing, or inside a collective) or at
    its start; a helper process stops it and continues it (SIGCONT)."""
    import signal
    import subprocess

    want_rank, want_step, seconds, *after = os.environ["PLANTED_STOP"].split(":")
    if (rank, step) == (int(want_rank), int(want_step)):
        if after:
            subprocess.Popen(["sh", "-c", f"sleep {after[0]}; kill -STOP {os.getpid()}; sleep {seconds}; "
                                          f"kill -CONT {os.getpid()}"])
            return
        subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"])
        os.kill(os.getpid(), signal.SIGSTOP)


def fill_at(rank: int, step: int) -> None:
    """PLANTED_FILL=DIR:STEP: at that step rank 0 fills the filesystem of DIR (a file of zeros until it is full),
    as another job's output would."""
    folder, want_step = os.environ["PLANTED_FILL"].rsplit(":", 1)
    if rank == 0 and step == int(want_step):
        try:
            with open(os.path.join(folder, "filler"), "wb") as f:
                while True:
                    f.write(b"\0" * (1 << 16))
        except OSError:
            pass
