"""A checkpoint's manifest: written last, it says the checkpoint is complete.

manifest.json lists every file the ranks wrote (path, bytes, CRC-32), the step and the world size. Rank 0
writes it after a barrier that follows every rank's writes, through a temporary file and an atomic rename,
so a checkpoint with a manifest is whole and one without is either unfinished or from an older ablate
(then only meta.pt vouches for it). On resume every rank checks a share of the files (`problem`) and the
ranks agree on the answer before any of them loads (checkpoint.load).
"""
from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Dict, Optional

NAME = "manifest.json"
CHUNK = 1 << 24   # 16 MiB reads: CRC-32 runs at about a GB/s, so a 12 GB 1B-model checkpoint costs ~10 s


def crc32(path: Path) -> int:
    value = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            value = zlib.crc32(chunk, value)
    return value


def write(directory: Path, step: int, world_size: int) -> None:
    """List every file under `directory` (all ranks' writes are done), then make the listing visible at once."""
    files = {str(p.relative_to(directory)): {"bytes": p.stat().st_size, "crc32": crc32(p)}
             for p in sorted(directory.rglob("*")) if p.is_file() and p.name != NAME}
    tmp = directory / f"{NAME}.tmp"
    tmp.write_text(json.dumps({"step": step, "world_size": world_size, "files": files}, indent=1))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, directory / NAME)


def read(directory: Path) -> Optional[Dict]:
    """The listing; None when there is none; {"unreadable": reason} when it is torn (a kill or full disk)."""
    path = directory / NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return {"unreadable": type(e).__name__}


def problem(directory: Path, share: int = 0, shares: int = 1, checksums: bool = True) -> Optional[str]:
    """What is wrong with this checkpoint, as a short phrase, or None: a missing manifest (unfinished, unless
    meta.pt says it predates manifests), then of files share::shares a missing one, a size or a checksum."""
    listing = read(directory)
    if listing is None:
        return None if (directory / "meta.pt").is_file() else f"{directory.name} is incomplete (no {NAME})"
    if "unreadable" in listing:
        return f"{directory.name}/{NAME} cannot be read ({listing['unreadable']}: torn by a kill or a full disk?)"
    for name, want in sorted(listing["files"].items())[share::shares]:
        path = directory / name
        if not path.is_file():
            return f"{directory.name}/{name} is missing"
        if path.stat().st_size != want["bytes"]:
            return f"{directory.name}/{name} has {path.stat().st_size} bytes, {want['bytes']} were written"
        if checksums and crc32(path) != want["crc32"]:
            return f"{directory.name}/{name} does not match its checksum"
    return None
