"""An ablate.sweeps call's plan (D/plan.json: every run, in order) as the report reads it: where the i-th run goes
(the one rule sweeps/runner.py writes by), and which planned runs left no record."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List, Tuple

from ablate.config import record


def run_dir_of(root: Path, i: int, name: str, r: int, label: str) -> Path:
    """Where an ablate.sweeps call puts the i-th run of its plan (sweeps/runner.py writes there, the report
    looks there for what is missing)."""
    return root / name / f"{i:03d}_r{r}_{re.sub(r'[^A-Za-z0-9.+-]+', '-', label)[:60]}"


PLAN_FILE = "plan.json"   # an ablate.sweeps call's runs, in order (sweeps/runner.py)
# a planned run's dir that a later call set aside (kept, never deleted) before running it again: one that did not
# finish (`<dir>.incomplete-N`), or a finished one whose config.yaml is not the plan's run (`<dir>.other-N`)
SET_ASIDE = (".incomplete-", ".other-")


def set_aside(run_dir: Path) -> bool:
    return any(mark in run_dir.name for mark in SET_ASIDE)


def missing(dirs: List[Path]) -> List[str]:
    """The runs an ablate.sweeps call planned in these folders (their plan.json) that have no summary.json: never
    started, stopped, or failed; each as `<sweep> #i, repeat r: <overrides>`."""
    out = []
    for d in dirs:
        try:
            plan = json.loads((Path(d) / PLAN_FILE).read_text())
        except (OSError, ValueError):
            continue
        for i, run in enumerate(plan if isinstance(plan, list) else [], 1):
            done = [p for p in (Path(d) / str(run.get("sweep"))).glob(f"{i:03d}_r{run.get('repeat')}_*")
                    if not set_aside(p) and record.exists(p)]
            if not done:
                out.append(f"{run.get('sweep')} #{i}, repeat {run.get('repeat')}: "
                           f"{' '.join(run.get('overrides') or []) or '(the sweep as it is)'}")
    return out


FAILED_FILE = "failed.txt"   # what ablate.sweeps keeps of a run that failed: its exit code and its error's last line


def note_failed(run_dir: Path, code: int, stderr: str) -> None:
    """A failed run's note in its run dir (made if the run refused before making one), for the report to name."""
    last = [ln.strip() for ln in (stderr or "").strip().splitlines() if ln.strip()][-1:]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        line = last[0] if last else "no error output"
        (run_dir / FAILED_FILE).write_text(f"exit {code}: {line if len(line) <= 200 else line[:200] + '...'}\n")
    except OSError:   # (a full disk: the sweep's own line said it)
        pass


def failed(dirs: List[Path]) -> Dict[str, List[Tuple[Path, str]]]:
    """{sweep: [(run dir, its error line)]} of the planned runs in these folders that failed (failed.txt, no record)."""
    out: Dict[str, List[Tuple[Path, str]]] = {}
    for d in dirs:
        for note in sorted(Path(d).glob(f"*/*/{FAILED_FILE}")):
            if not record.exists(note.parent) and not set_aside(note.parent):
                out.setdefault(note.parent.parent.name, []).append((note.parent, note.read_text().strip()))
    return out
