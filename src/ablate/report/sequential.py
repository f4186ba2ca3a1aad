"""Repeats that stop by themselves: `ablate.sweeps NAME --repeats auto [--min-repeats 2] [--max-repeats N]`.

After each block of repeats (from --min-repeats on) the sweep looks at its verdicts, and stops when every
check with a claim is decided (its interval wholly on one side of its threshold: *reproduced* or *not
reproduced*) or at --max-repeats. Looking again and again at 95% intervals would declare a false effect
far more often than 5%; so every look uses intervals at 1 - 0.05 / (number of possible looks)
(Bonferroni over the looks: the chance that any look errs is at most 5%, whatever the data do), and the
final report's intervals are at that same level (`--confidence`). A test over many seeded synthetic A/A
sequences shows the false-positive rate at or below 5%. `D/sequential.json` records the level, the
looks and why the sweep stopped; report.md quotes it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ALPHA = 0.05
FILE = "sequential.json"
UNDECIDED = ("inconclusive",)


def level(min_repeats: int, max_repeats: int, alpha: float = ALPHA) -> float:
    """The interval level of each look: Bonferroni over the possible looks (one after each repeat from
    min_repeats to max_repeats)."""
    looks = max(1, max_repeats - min_repeats + 1)
    return 1 - alpha / looks


def undecided(checks) -> List[str]:
    """The checks with a claim whose verdict is still open ('C3 tokens_per_s')."""
    return [f"{c.claim} {c.metric}" for c in checks if c.claimed is not None and c.verdict in UNDECIDED]


def decision(checks, n: int, max_repeats: int) -> Tuple[bool, str]:
    """(stop now, why) after a look at n repeats."""
    open_checks = undecided(checks)
    if not open_checks:
        return True, f"every verdict decided at n={n}"
    if n >= max_repeats:
        return True, f"max repeats reached (n={n}): {', '.join(open_checks)} still inconclusive"
    return False, f"n={n}: {', '.join(open_checks)} still inconclusive"


def write(root: Path, record: Dict[str, object]) -> None:
    (root / FILE).write_text(json.dumps(record, indent=1))


def read(root: Path) -> Optional[Dict[str, object]]:
    try:
        return json.loads((Path(root) / FILE).read_text())
    except (OSError, ValueError):
        return None


def header_line(record: Optional[Dict[str, object]]) -> str:
    if not record:
        return ""
    return (f"**Repeats: auto** — {record['stopped']} (looks at n={', '.join(map(str, record['looks']))}; "
            f"each look's intervals at {record['level']:.2%}, Bonferroni over {record['possible_looks']} possible "
            "looks, so peeking keeps the false-positive rate at or below 5%; the intervals below are at that level).")
