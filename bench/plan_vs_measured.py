"""Planned against measured memory, for every run under the folders given: what `ablate.plan` predicts for the
run's own overrides (.hydra/overrides.yaml) beside what the run recorded (summary.json: `activation_bytes`, the
bytes autograd saved at its first micro-step; `state_bytes`, the largest rank's). On a GPU this is the plan's
check against CUDA's own attention kernels (flash / memory-efficient SDPA).

    .venv/bin/python bench/plan_vs_measured.py RUNS_DIR [RUNS_DIR ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from ablate.compose import config_of
from ablate.plan import plan


def runs(folders):
    for folder in folders:
        for summary in sorted(Path(folder).rglob("summary.json")):
            overrides = summary.parent / ".hydra" / "overrides.yaml"
            if overrides.exists():
                yield summary.parent, json.loads(summary.read_text()), yaml.safe_load(overrides.read_text()) or []


def main(folders) -> None:
    print(f"{'run':<48} {'activations planned':>20} {'measured':>12} {'ratio':>6}   {'state planned':>14} "
          f"{'measured':>12}")
    for run_dir, summary, overrides in runs(folders):
        keep = [o for o in overrides if not o.startswith(("hydra.", "train.resume"))]
        try:
            p = plan(config_of(keep)[1])
        except Exception as e:   # a run whose overrides no longer compose: said, the rest go on
            print(f"{run_dir.name:<48} not planned: {type(e).__name__}: {e}")
            continue
        measured = summary.get("activation_bytes")
        ratio = f"{measured / p['activation_bytes']:.3f}" if measured and p["activation_bytes"] else "—"
        state = max((sum(r["state_bytes"].values()) for r in summary.get("per_rank", []) if r.get("state_bytes")),
                    default=None)
        print(f"{str(run_dir.relative_to(run_dir.parents[1]))[-48:]:<48} {p['activation_bytes'] / 1e6:>17.1f} MB "
              f"{(measured or 0) / 1e6:>9.1f} MB {ratio:>6}   {p['ablate'].total / 1e6:>11.1f} MB "
              f"{(state or 0) / 1e6:>9.1f} MB")


if __name__ == "__main__":
    main(sys.argv[1:] or ["."])
