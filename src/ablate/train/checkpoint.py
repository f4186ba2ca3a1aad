"""Atomic checkpoints and safe resume: a requeued or resumed run continues with no lost and no repeated steps,
every rank from the same checkpoint (stop signals that ask for one: signals.py).

A checkpoint is a directory: the strategy's own files (one torch.save for none/ddp, torch.distributed.checkpoint
shards for FSDP2, DeepSpeed's save_checkpoint for ZeRO; the loss scaler is the strategy's) and meta.pt with
the step (which fixes the data position: batch i is a pure function of i), RNG states, the W&B run id, the
config it was made with and the meter's totals (so the summary covers every attempt), and last a manifest of
every file (manifest.py). It is written beside the old one and swapped in; the one before stays as
`checkpoint.prev`, the fallback when the latest is incomplete or cannot be read by every rank. Only tensors
and plain values are stored, and loaded with weights_only=True: a checkpoint never runs code.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from ablate import units
from ablate.config import ConfigError, RunStopped
from ablate.metrics.counting import all_gather_object
from ablate.train import manifest, pickles

DIRNAME = "checkpoint"     # <run dir>/checkpoint/: meta.pt (rank 0) + the strategy's own files
PREVIOUS = DIRNAME + ".prev"
BROKEN = DIRNAME + ".broken"   # a damaged latest checkpoint, kept for a look, never resumed from


class Preempted(Exception):
    """Raised at a step boundary after the checkpoint is written."""

    def __init__(self, signum: int, step: int = 0):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum, self.step = signum, step


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
    """Write into <target>.tmp, then its manifest (manifest.py), then swap it in: the old one becomes
    <target>.prev, unless it is damaged (then <target>.broken: never rotated over an intact one). A kill at
    any moment leaves a whole checkpoint behind; a full disk leaves the previous one and says so."""
    tmp, prev = target.with_name(target.name + ".tmp"), target.with_name(PREVIOUS)
    try:
        _write(tmp, strategy, step, meta, is_main)
    except Exception as e:
        free = shutil.disk_usage(target.parent).free
        shutil.rmtree(tmp, ignore_errors=True)     # any rank may: the partial checkpoint is abandoned
        if not _out_of_space(e, free):
            raise
        kept = f"{target} (step {read_meta(target)['step']}) is intact; make room, then continue with " \
            f"train.resume={target.parent}" if (target / "meta.pt").is_file() else "there is no earlier checkpoint"
        raise RunStopped(f"step {step}: the checkpoint could not be written: no space left on {target.parent} "
                         f"({units.fmt('free_bytes', free)} free); the partial one was removed and {kept}") from None
    if is_main:
        if target.exists():
            # checksums, not sizes: a same-size corruption of the latest must never become the prev
            keep = prev if manifest.problem(target, checksums=True) is None else target.with_name(BROKEN)
            shutil.rmtree(keep, ignore_errors=True)
            os.replace(target, keep)
        os.replace(tmp, target)
    _barrier()


def set_aside(target: Path, is_main: bool) -> Optional[int]:
    """The latest checkpoint turned out bad (the loss of its weights, at the next step, was not finite): it
    becomes <target>.broken and the previous one, when there is one, the latest again. The latest's step now
    (None: none is left)."""
    prev = target.with_name(PREVIOUS)
    if is_main:
        broken = target.with_name(BROKEN)
        shutil.rmtree(broken, ignore_errors=True)
        os.replace(target, broken)
        if prev.exists():
            os.replace(prev, target)
    _barrier()
    return read_meta(target)["step"] if (target / "meta.pt").is_file() else None


def _write(tmp: Path, strategy, step: int, meta: Dict, is_main: bool) -> None:
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    strategy.save_checkpoint(tmp)     # collective for sharded strategies: every rank writes its part
    if is_main:
        torch.save({"step": step, "rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None, **meta},
                   tmp / "meta.pt")
    _barrier()                        # every rank's files are written: the manifest can list them
    if is_main:
        manifest.write(tmp, step, meta.get("world_size") or 1)


def _out_of_space(e: BaseException, free: int) -> bool:
    """ENOSPC itself, or a failed write on a filesystem left (nearly) full: torch's serializer reports that
    in its own words ("iostream error", "unexpected pos"), without the errno."""
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return True
    return "No space left" in str(e) or free < SPACE_MARGIN


SPACE_MARGIN = 64 << 20   # below this, a failed write on the checkpoint's filesystem is taken as a full disk


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


def _candidates(path: Path) -> List[Path]:
    """The checkpoint asked for, then (for a run's own) the previous one beside it: newest first."""
    return [path] + ([path.with_name(PREVIOUS)] if path.name == DIRNAME else [])


def _agreed(problem: Optional[str], env) -> List[str]:
    """Every rank's problem with a candidate, known to every rank ("rank 1: ...")."""
    said = all_gather_object(problem, env)
    return [f"rank {r}: {p}" if len(said) > 1 else p for r, p in enumerate(said) if p]


def load(path: Path, strategy, env) -> Dict:
    """Restore the newest of `path` and the previous checkpoint beside it that every rank finds complete and
    can read; the ranks agree before and after loading, so all of them continue from the same step. The
    checkpoint used is meta["path"]; a fallback is said once, with every rank's reason."""
    candidates, refused = _candidates(path), []
    for candidate in candidates:
        if not (candidate / "meta.pt").is_file():
            continue
        # sizes and digests first: a truncated file is never handed to a loader, even the pickle check's
        problems = _agreed(manifest.problem(candidate, env.rank, env.world_size) or pickles.unsafe(candidate)
                           or strategy.missing_for(candidate, env.rank), env)
        if not problems:
            try:
                meta = read_meta(candidate)
                strategy.load_checkpoint(candidate)
                failed = None
            except ConfigError:
                raise
            except Exception as e:   # (a strategy raises its library's failures as plain exceptions: fsdp2.py)
                failed = f"cannot be read ({describe(e)})"
            problems = _agreed(failed, env)
        if problems:
            refused.append(f"{candidate.name}: {'; '.join(problems)}")
            continue
        if refused and env.is_main:
            print(f"ablate: warning: resuming from {candidate}, the newest checkpoint every rank can read "
                  f"({'; '.join(refused)})", file=sys.stderr)
        torch.set_rng_state(meta["rng"])
        if meta.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(meta["cuda_rng"])
        return {**meta, "path": candidate}
    raise ConfigError(f"train.resume: no checkpoint every rank can read in {path.parent} ({'; '.join(refused)})")


def check_complete(path: Path) -> None:
    """Before any rank starts: a resume needs a checkpoint whose files are all there (sizes; the ranks
    check the contents themselves) and whose pickles name nothing their format does not need, else one line."""
    problems = [manifest.problem(c, checksums=False) or pickles.unsafe(c) for c in _candidates(path)
                if (c / "meta.pt").is_file()]
    if problems and all(problems):
        raise ConfigError(f"train.resume: no complete checkpoint in {path.parent} ({'; '.join(problems)})")


def newest_whole(path: Path) -> Path:
    """The newest of `path` and its previous checkpoint whose files are whole (sizes) and whose meta.pt reads:
    what a resume is judged on (the ranks then check checksums and load, falling back alike)."""
    return next((c for c in _candidates(path) if (c / "meta.pt").is_file()
                 and manifest.problem(c, checksums=False) is None and _readable_meta(c)), path)


def _readable_meta(path: Path) -> bool:
    try:
        read_meta(path)
        return True
    except ConfigError:
        raise
    except Exception:
        return False


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
