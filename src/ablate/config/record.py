"""A run's record, `<run dir>/summary.json`: one object with a schema version, written by one writer (`write`,
atomic: a crash mid-write never leaves half a file) and read by one loader (`load`) that every reader uses - the
report, sweeps, tune, maxbatch, the baseline, `-m`'s job result and the Slurm array's lines.

Two kinds: "run" (python -m ablate: the figures docs/records.md defines) and "max_batch" (python -m
ablate.maxbatch: the largest batch that fits and every trial). Every figure is kept by its key (`record["mfu"]`,
`record.figure("comm_bytes_by_dim.tp")`); the keys every reader relies on are typed properties here.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional

from ablate.config import AblateError

SCHEMA_VERSION = 1   # 1: schema_version and kind added; 0: a record written before them (read the same)
FILE = "summary.json"
KINDS = ("run", "max_batch")


class RecordError(AblateError):
    """A record that cannot be read: missing, torn, not an object, or of a newer schema than this ablate."""
    exit_code = 2


def path_of(run_dir: Path) -> Path:
    return Path(run_dir) / FILE


def exists(run_dir: Path) -> bool:
    """Whether the run finished (its record is written last, atomically)."""
    return path_of(run_dir).is_file()


@dataclass(frozen=True)
class Record(Mapping[str, Any]):
    run_dir: Path
    data: Dict[str, Any]

    # -- a mapping of its figures ------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def figure(self, key: str) -> Any:
        """A figure by its key, or a nested one by `node.key` (comm_bytes_by_dim.tp); None where absent."""
        if key in self.data or "." not in key:
            return self.data.get(key)
        node, sub = key.split(".", 1)
        return (self.data.get(node) or {}).get(sub) if isinstance(self.data.get(node), dict) else None

    # -- the keys every reader relies on -------------------------------------------------------------
    @property
    def schema_version(self) -> int:
        return int(self.data.get("schema_version", 0))

    @property
    def kind(self) -> str:
        return self.data.get("kind") or ("max_batch" if "max_batch" in self.data and "trials" in self.data
                                         else "run")

    @property
    def device(self) -> str:
        return str(self.data.get("device", "cpu"))

    @property
    def notes(self) -> Dict[str, str]:
        return self.data.get("notes") or {}

    @property
    def tokens_per_s(self) -> Optional[float]:
        return self.data.get("tokens_per_s")

    @property
    def mem_peak_bytes(self) -> Optional[int]:
        return self.data.get("mem_peak_bytes")

    @property
    def loss(self) -> Optional[float]:
        return self.data.get("loss")


def jsonable(value):
    """JSON has no inf or NaN: NaN is null, an infinity its text (a figure's value survives a round trip)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    return value


def write(run_dir: Path, data: Mapping[str, Any], kind: str = "run") -> Record:
    """The one writer: the record stamped with its schema and kind, written atomically (a temporary file, then a
    rename), so a reader sees the whole record or none."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: one of {KINDS}")
    body = {"schema_version": SCHEMA_VERSION, "kind": kind,
            **{k: jsonable(v) for k, v in data.items() if k not in ("schema_version", "kind")}}
    path = path_of(run_dir)
    tmp = path.with_name(f".{FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return Record(Path(run_dir), body)


def load(run_dir: Path) -> Record:
    """The one loader: RecordError (one line) for a record that is missing, torn, or newer than this ablate."""
    path = path_of(run_dir)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordError(f"{path}: no such record (the run did not finish)") from None
    except (OSError, ValueError) as e:
        raise RecordError(f"{path} cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{path}: not a record (a JSON object)")
    if int(data.get("schema_version", 0)) > SCHEMA_VERSION:
        raise RecordError(f"{path}: schema {data['schema_version']}, newer than this ablate reads ({SCHEMA_VERSION}):"
                          " upgrade ablate")
    return Record(Path(run_dir), data)


def update(run_dir: Path, **figures: Any) -> Record:
    """A finished record with figures added (a sweep's rerun marks, its arm's largest batch), written as ever."""
    found = load(run_dir)
    return write(run_dir, {**found.data, **figures}, found.kind)
