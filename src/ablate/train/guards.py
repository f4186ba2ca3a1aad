"""Refusals that protect what is already recorded: each one line, before work (no torch here: the
command line runs them while composing; whether a run fits in memory is memory_guard.py).

- The run directory: empty `hydra.run.dir=` (it would write into the current directory), a folder name longer
  than a filesystem takes, a directory that
  already holds a run (unless it is being resumed), one another live run is writing into (a lock), one
  that cannot be written (read-only, full).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Optional

from ablate.config import ConfigError
from ablate.config.arguments import DISK_SAYS, NAME_MAX

RUN_FILES = ("summary.json", "metrics.jsonl")
_LOCKS = {}   # run dir (resolved) -> open lock file, held until the run ends (release) or the process exits
_CLAIMED = set()   # run dirs this process claimed: the only ones a refusal of this process may remove


def check_run_dir_override(overrides) -> None:
    for o in overrides:
        if not o.startswith(("hydra.run.dir=", "hydra.sweep.dir=")):
            continue
        key, value = o.split("=", 1)
        value = value.strip().strip("'\"").strip()
        # '' and "" too: Hydra reads a quoted empty string as the empty path, the current directory
        if not value:
            raise ConfigError(f"{key} is empty: it would write into the current directory; give a directory "
                              "(the default is runs/<date>/<time>)")
        long = next((part for part in Path(value).parts if len(part.encode()) > NAME_MAX), None)
        if long is not None:
            raise ConfigError(f"{key}: a name of {len(long.encode())} bytes ({long[:40]}...); a filesystem takes at "
                              f"most {NAME_MAX} in one folder name")


def holds_a_run(run_dir: Path) -> bool:
    return any((run_dir / f).exists() for f in RUN_FILES)


def check_fresh(run_dir: Path, resume: Optional[str]) -> None:
    """A directory that already holds a run is continued with train.resume, never overwritten."""
    resuming_here = resume and Path(resume).resolve() in (run_dir.resolve(), (run_dir / "checkpoint").resolve())
    if holds_a_run(run_dir) and not resuming_here:
        found = ", ".join(f for f in RUN_FILES if (run_dir / f).exists())
        raise ConfigError(f"hydra.run.dir={run_dir}: already holds a run ({found}); choose another directory, "
                          f"or continue it with train.resume={run_dir}")


def check_writable(run_dir: Path, need_bytes: int = 1 << 20, key: str = "hydra.run.dir") -> None:
    """The nearest existing folder of run_dir takes a file and has room."""
    probe = run_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        raise ConfigError(f"{key}={run_dir}: {probe} is not writable (read-only or no permission)")
    try:   # (root may write anywhere by its permissions: /proc or /sys still take no folder)
        os.rmdir(tempfile.mkdtemp(prefix=".ablate-probe-", dir=probe))
    except OSError as e:
        if e.errno not in DISK_SAYS:   # (a read-only or full disk: said below, in its own words)
            raise ConfigError(f"{key}={run_dir}: {probe} does not take a folder ({e.strerror}); choose a directory "
                              "on a disk") from None
    if shutil.disk_usage(probe).free < need_bytes:
        raise ConfigError(f"{key}={run_dir}: no space left on {probe} "
                          f"({shutil.disk_usage(probe).free // 1024} kB free)")


LOCK_FILE = ".ablate.lock"


class Held(ConfigError):
    """Another live process holds the directory's lock."""


def _held(run_dir: Path) -> ConfigError:
    return Held(f"hydra.run.dir={run_dir}: another run is writing into it; choose another directory")


def check_unlocked(run_dir: Path) -> None:
    """Refuse, before anything is written into it, a directory a live run holds (`lock` takes it later)."""
    try:
        handle = open(run_dir / LOCK_FILE)
    except OSError:
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise _held(run_dir) from None
        fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _holder(run_dir: Path):
    """(the open lock file, the pid written in it) while a live process holds run_dir's lock, else None."""
    try:
        handle = open(run_dir / LOCK_FILE)
    except OSError:
        yield None
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(handle, fcntl.LOCK_UN)
            held = False
        except OSError:
            held = True
        try:
            pid = int(handle.read().strip() or 0) if held else 0
        except ValueError:
            pid = 0
        yield (handle, pid) if held else None


def wait_for_holder(run_dir: Path, said) -> Optional[int]:
    """Wait until the live process that holds run_dir's lock ends (an orphan a driver killed with -9 left going,
    which goes on to finish its run), after `said(pid)` tells whoever waits; the pid it was, or None if none held
    it. Ctrl-C ends the wait (the run goes on)."""
    with _holder(run_dir) as held:
        if held is None:
            return None
        handle, pid = held
        said(pid)
        fcntl.flock(handle, fcntl.LOCK_EX)   # (blocks until the holder's process ends or releases it)
        fcntl.flock(handle, fcntl.LOCK_UN)
        return pid


def stop_holder(run_dir: Path, grace_s: float = 10.0) -> Optional[int]:
    """End the live process that holds run_dir's lock (an orphan: a driver killed with -9 leaves its child run
    going), its whole process group, SIGTERM then SIGKILL after `grace_s`; the pid it was, or None if none held
    it."""
    with _holder(run_dir) as held:
        if held is None or held[1] <= 0:
            return None
        handle, pid = held
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(pid), sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(handle, fcntl.LOCK_UN)
                    return pid
                except OSError:
                    time.sleep(0.1)
        return pid


def lock(run_dir: Path, made_here: Optional[bool] = None) -> None:
    """One live run per directory, claimed before anything is written into it: the lock file is created
    and locked at once (flock), so of two calls racing for one directory exactly one gets it, and the other
    touches nothing. Taking it again in the process that holds it is a no-op."""
    if run_dir.resolve() in _LOCKS:
        return
    existed = run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(run_dir / LOCK_FILE, "a+")
    except OSError as e:
        reason = os.strerror(e.errno or errno.EIO)
        raise ConfigError(f"hydra.run.dir={run_dir}: cannot be written ({reason})") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise _held(run_dir) from None
    try:   # the holder's pid, for a person looking: a full disk keeps the lock without it
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
    except OSError:
        pass
    _LOCKS[run_dir.resolve()] = handle
    if (not existed) if made_here is None else made_here:
        _CLAIMED.add(run_dir.resolve())


def hold(root: Path, who: str, what: str) -> None:
    """A driver (ablate.sweeps, ablate.tune) runs its work in `root`: a second call into it is refused while this
    one lives (the lock goes with the process), so nothing is run twice or reported as another's."""
    try:
        lock(root)
    except Held:
        raise ConfigError(f"--dir {root}: another {who} call is running this {what}; wait for it, or run this "
                          "command again when it has ended (it continues what is left)") from None
    except ConfigError as e:   # read-only, no permission: not another call
        raise ConfigError(f"--dir {root}: {str(e).split(': ', 1)[1]}") from None
    check_writable(root, need_bytes=1 << 20, key="--dir")


def claimed(run_dir: Path) -> bool:
    """This process made this directory when it claimed it (a refusal may remove it; nothing else may)."""
    return run_dir.resolve() in _CLAIMED


def release(run_dir: Path) -> None:
    handle = _LOCKS.pop(run_dir.resolve(), None)
    if handle is not None:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
