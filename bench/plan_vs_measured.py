"""Planned against measured memory, for every run under the folders given: what `ablate.plan` predicts for the
run's own overrides (.hydra/overrides.yaml) beside what the run recorded (summary.json: `activation_bytes`, the
bytes autograd saved at its first micro-step; `state_bytes`, the largest rank's; the peak: `peak_bytes_planned`
beside `peak_bytes_measured`, the step's most live tensor memory - on CUDA the allocator's max allocated - and
`peak_reserved_bytes_measured`, what the allocator held, against the plan's peak with its GPU allowance), and a GPU
run's predicted step time (summary.json's `predicted`, docs/prediction.md) beside its measured median step. On a
GPU this is the plan's check against CUDA's own attention kernels (flash / memory-efficient SDPA) and allocator, and
the step-time model's first check. With `--hardware FILE` (bench/gpu_week4.sh gives the file `ablate.calibrate`
wrote on that GPU first), each run's step is also predicted on that file's figures, op by op (`calibrated`).

    .venv/bin/python bench/plan_vs_measured.py [--hardware FILE] RUNS_DIR [RUNS_DIR ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from ablate import hardware, parallel
from ablate.compose import config_of
from ablate.plan import plan
from ablate.predict import for_plan


def runs(folders):
    for folder in folders:
        for summary in sorted(Path(folder).rglob("summary.json")):
            overrides = summary.parent / ".hydra" / "overrides.yaml"
            if overrides.exists():
                yield summary.parent, json.loads(summary.read_text()), yaml.safe_load(overrides.read_text()) or []


def main(folders, calibrated=None) -> None:
    hw = hardware.named(calibrated) if calibrated else None
    print(f"{'run':<48} {'activations planned':>20} {'measured':>12} {'ratio':>6}   {'state planned':>14} "
          f"{'measured':>12}   {'peak planned':>13} {'measured':>12} {'ratio':>6} {'reserved':>12} "
          f"{'vs peak_bytes':>13}   {'step predicted':>14} {'measured':>10} {'ratio':>6}"
          + (f" {'calibrated':>14} {'ratio':>6}" if hw else ""))
    for run_dir, summary, overrides in runs(folders):
        keep = [o for o in overrides if not o.startswith(("hydra.", "train.resume"))]
        try:
            cfg = config_of(keep)[1]
            p = plan(cfg)
        except Exception as e:   # a run whose overrides no longer compose: said, the rest go on
            print(f"{run_dir.name:<48} not planned: {type(e).__name__}: {e}")
            continue
        measured = summary.get("activation_bytes")
        ratio = f"{measured / p['activation_bytes']:.3f}" if measured and p["activation_bytes"] else "—"
        state = max((sum(r["state_bytes"].values()) for r in summary.get("per_rank", []) if r.get("state_bytes")),
                    default=None)
        print(f"{str(run_dir.relative_to(run_dir.parents[1]))[-48:]:<48} {p['activation_bytes'] / 1e6:>17.1f} MB "
              f"{(measured or 0) / 1e6:>9.1f} MB {ratio:>6}   {p['ablate'].total / 1e6:>11.1f} MB "
              f"{(state or 0) / 1e6:>9.1f} MB   {peak_columns(summary, p)}   {step_columns(summary)}"
              f"{calibrated_columns(cfg, p, hw, summary) if hw else ''}")


def calibrated_columns(cfg, p, hw, summary) -> str:
    """The run's step predicted on a calibrated hardware file (the per-op model), and measured / that."""
    predicted = for_plan(cfg, parallel.layout_of(cfg), p["params"], p["blocks"], hw).get("step_time_s")
    measured = summary.get("step_time_s")
    ratio = f"{measured / predicted:.3f}" if predicted and measured else "—"
    return (f" {predicted * 1e3:>11.1f} ms" if predicted else f" {'—':>14}") + f" {ratio:>6}"


def step_columns(summary) -> str:
    """The run's predicted step time (GPU runs only) beside its measured median step, and measured / predicted."""
    predicted, measured = (summary.get("predicted") or {}).get("step_time_s"), summary.get("step_time_s")
    ratio = f"{measured / predicted:.3f}" if predicted and measured else "—"
    return (f"{predicted * 1e3:>11.1f} ms" if predicted else f"{'—':>14}") + \
        (f" {measured * 1e3:>7.1f} ms" if measured else f" {'—':>10}") + f" {ratio:>6}"


def peak_columns(summary, p) -> str:
    """The run's own planned and measured peak and their ratio; on CUDA its reserved memory against the plan's
    peak_bytes (tensors + the GPU allowance)."""
    def mb(n):
        return f"{n / 1e6:>9.1f} MB" if n else f"{'—':>12}"
    planned, measured = summary.get("peak_bytes_planned"), summary.get("peak_bytes_measured")
    reserved = summary.get("peak_reserved_bytes_measured")
    ratio = f"{summary['peak_ratio']:.3f}" if summary.get("peak_ratio") else "—"
    vs = f"{reserved / p['peak_bytes']:.3f}" if reserved and p.get("peak_bytes") else "—"
    return f"{mb(planned):>13} {mb(measured)} {ratio:>6} {mb(reserved)} {vs:>13}"


if __name__ == "__main__":
    args = sys.argv[1:]
    given = args.index("--hardware") if "--hardware" in args else None
    calibrated = args[given + 1] if given is not None else None
    folders = [a for i, a in enumerate(args) if given is None or i not in (given, given + 1)]
    main(folders or ["."], calibrated)
