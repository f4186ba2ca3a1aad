"""A checkpoint's manifest: written last, it says the checkpoint is complete.

manifest.json lists every file the ranks wrote (path, bytes, CRC-32), the step and the world size. Rank 0
writes it after a barrier that follows every rank's writes, through a temporary file and an atomic rename,
so a checkpoint with a manifest is whole; its copy in the run dir (checkpoint_digests.json) verifies a
checkpoint whose manifest was lost, and one with neither is refused (never loaded unchecked). On resume every
rank checks a share of the files (`problem`) and the ranks agree on the answer before any of them loads
(checkpoint.load).
"""
from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Dict, List, Optional

NAME = "manifest.json"
CHUNK = 1 << 24   # 16 MiB reads: CRC-32 runs at about a GB/s, so a 12 GB 1B-model checkpoint costs ~10 s


def crc32(path: Path) -> int:
    value = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            value = zlib.crc32(chunk, value)
    return value


def write(directory: Path, step: int, world_size: int) -> None:
    """List every file under `directory` (all ranks' writes are done), keep the listing beside the run's checkpoints
    too (DIGESTS), then make it visible in the checkpoint at once."""
    files = {str(p.relative_to(directory)): {"bytes": p.stat().st_size, "crc32": crc32(p)}
             for p in sorted(directory.rglob("*")) if p.is_file() and p.name != NAME}
    listing = {"step": step, "world_size": world_size, "files": files}
    _keep_digest(directory.parent, listing)
    _atomic_json(directory / NAME, listing)


def _atomic_json(path: Path, value) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


# the last few checkpoints' listings again, in the folder that holds them (the run dir): a checkpoint whose own
# manifest is gone is still verified (found by its meta.pt's size and checksum), never loaded unchecked
DIGESTS = "checkpoint_digests.json"
KEPT_DIGESTS = 4


def _keep_digest(folder: Path, listing: Dict) -> None:
    kept = [d for d in _digests(folder) if d.get("files", {}).get("meta.pt") != listing["files"].get("meta.pt")]
    _atomic_json(folder / DIGESTS, [*kept, listing][-KEPT_DIGESTS:])


def _digests(folder: Path) -> List[Dict]:
    try:
        kept = json.loads((folder / DIGESTS).read_text())
    except (OSError, ValueError):
        return []
    return [d for d in kept if isinstance(d, dict) and isinstance(d.get("files"), dict)] \
        if isinstance(kept, list) else []


def _from_digests(directory: Path) -> Optional[Dict]:
    """This checkpoint's listing as kept beside it, matched by its meta.pt; None when none matches."""
    meta = directory / "meta.pt"
    if not meta.is_file():
        return None
    size = meta.stat().st_size
    kept = [d for d in _digests(directory.parent) if (d["files"].get("meta.pt") or {}).get("bytes") == size]
    if not kept:
        return None
    crc = crc32(meta)
    return next((d for d in reversed(kept) if d["files"]["meta.pt"].get("crc32") == crc), None)


def read(directory: Path) -> Optional[Dict]:
    """The listing (the checkpoint's own, else its copy beside it); None when there is none; {"unreadable": reason}
    when it is torn (a kill or full disk)."""
    path = directory / NAME
    if not path.is_file():
        return _from_digests(directory)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return {"unreadable": type(e).__name__}


def problem(directory: Path, share: int = 0, shares: int = 1, checksums: bool = True) -> Optional[str]:
    """What is wrong with this checkpoint, as a short phrase, or None: no listing (unfinished, or its manifest gone
    with no copy beside it: nothing can vouch for its files), then of files share::shares a missing one, a size or
    a checksum."""
    listing = read(directory)
    if listing is None:
        if (directory / "meta.pt").is_file():
            return f"{directory.name} cannot be verified (no {NAME}, and no copy of it in {DIGESTS})"
        return f"{directory.name} is incomplete (no {NAME})"
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
