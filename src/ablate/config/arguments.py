"""One way to read the entry points' arguments (ablate.sweeps, report, plan, maxbatch, tune, baseline): argparse types
that refuse what cannot be meant, so that a bad value is argparse's usage line and one `error:` line, exit code 2,
before anything is written (the working directory and --dir included).

- counts: integers >= 1 (`count`), or >= 0 (`count0`);
- budgets, timeouts, seconds: finite numbers > 0 (`positive`); a share: in (0, 1) (`share`);
- an output folder (`out_dir`): not empty, no part of it a file, each name short enough for a filesystem; made
  later, by the command, only once everything else was checked;
- an input folder (`in_dir`: --config-dir, a run or sweep folder): one that exists;
- a name kept as a file name (`file_name`): not empty, no `/`, at most 100 characters.
Unknown flags are argparse's own refusal.
"""
from __future__ import annotations

import argparse
import errno
import math
import os
import tempfile
from pathlib import Path

NAME_MAX = 255      # bytes in one path component (ext4, xfs, APFS ...)


def count(text: str) -> int:
    return _integer(text, 1)


def count0(text: str) -> int:
    return _integer(text, 0)


def _integer(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value}: out of range; allowed: >= {low}")
    return value


def positive(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: out of range; allowed: a finite number > 0")
    return value


def share(text: str) -> float:
    value = _number(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text}: out of range; allowed: between 0 and 1 (e.g. 0.95)")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text}: not a finite number")
    return value


# a folder's refusals that are the disk's (read-only, no permission, full), which the commands say in their own line
DISK_SAYS = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


def out_dir(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: give a folder (it is made if missing)")
    path = Path(text).expanduser()
    long = next((part for part in path.parts if len(part.encode()) > NAME_MAX), None)
    if long is not None:
        raise argparse.ArgumentTypeError(f"{long[:40]}...: a name of {len(long.encode())} bytes; a filesystem takes "
                                         f"at most {NAME_MAX}")
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                raise argparse.ArgumentTypeError(f"{text}: {parent} is a file, not a folder")
            try:   # it must take what is made in it (/proc does not, whatever its permissions say)
                os.rmdir(tempfile.mkdtemp(prefix=".ablate-probe-", dir=parent))
            except OSError as e:
                if e.errno not in DISK_SAYS:   # (a read-only or full disk: each command says so in its own words)
                    raise argparse.ArgumentTypeError(f"{text}: {parent} does not take a folder ({e.strerror})") \
                        from None
            break
    return path


def in_dir(text: str) -> Path:
    path = Path(text).expanduser()
    long = next((part for part in path.parts if len(part.encode()) > NAME_MAX), None)
    if long is not None:   # (the filesystem's own answer is an OSError, not "no")
        raise argparse.ArgumentTypeError(f"{long[:40]}...: a name of {len(long.encode())} bytes; no folder has one")
    if not text.strip() or not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: no such folder")
    return path


def file_name(text: str) -> str:
    if not text.strip() or "/" in text or text in (".", "..") or len(text) > 100:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: a name of 1 to 100 characters without '/'")
    return text
