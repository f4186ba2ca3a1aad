"""The report's CSV tables (report.csv, effects.csv, waterfall.csv): one row per dataclass record."""
from __future__ import annotations

import csv
from dataclasses import asdict
from pathlib import Path
from typing import Iterable, Sequence


def write(path: Path, fields: Sequence[str], records: Iterable) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields))
        writer.writeheader()
        for record in records:
            writer.writerow(asdict(record))
