"""The planned peak against the measured one on this machine: model=small, batch 4 x 128 tokens, each layout (1 rank,
fsdp2 x 2, hsdp 2x2, fsdp2 x tp2) x activation checkpointing (false, true, selective) x precision (bf16, fp32),
a real run each (3 steps, the second tracked: metrics/step_memory.py); prints planned, measured and their ratio
from every run's summary.json (`peak_bytes_planned`, `peak_bytes_measured`, `peak_ratio`), and the largest
difference. Target: every ratio within 10% of 1.

    .venv/bin/python bench/peak_matrix.py [OUT_DIR] [--only LAYOUT ...]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

LAYOUTS = {
    "1 rank": [],
    "fsdp2 x 2": ["parallel=fsdp2", "launcher.nproc_per_node=2"],
    "hsdp 2x2": ["parallel=hsdp", "parallel.shard_size=2", "launcher.nproc_per_node=4"],
    "fsdp2 x tp2": ["parallel=fsdp2", "parallel.tp=2", "launcher.nproc_per_node=4"],
}
MODES = ("false", "true", "selective")
PRECISIONS = ("bf16", "fp32")
COMMON = ["model=small", "train.batch_size=4", "train.seq_len=128", "train.steps=3", "train.warmup_steps=2",
          "logger=none", "metrics.gemm_probe=false", "train.checkpoint_every=0"]


def run(out: Path, layout: str, mode: str, precision: str) -> dict:
    run_dir = out / f"{layout.replace(' ', '')}_{mode}_{precision}"
    if not (run_dir / "summary.json").exists():
        command = [sys.executable, "-m", "ablate", *COMMON, *LAYOUTS[layout], f"precision={precision}",
                   f"model.activation_checkpointing={mode}", f"hydra.run.dir={run_dir}"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{' '.join(command)}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads((run_dir / "summary.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default="runs/peak_matrix")
    p.add_argument("--only", nargs="*", choices=list(LAYOUTS), default=list(LAYOUTS))
    args = p.parse_args()
    out, worst, started = Path(args.out), 0.0, time.monotonic()
    print(f"{'layout':<12} {'checkpointing':<10} {'precision':<9} {'planned':>10} {'measured':>10} {'ratio':>6}")
    for layout in args.only:
        for mode in MODES:
            for precision in PRECISIONS:
                s = run(out, layout, mode, precision)
                planned, measured, ratio = s["peak_bytes_planned"], s["peak_bytes_measured"], s["peak_ratio"]
                worst = max(worst, abs(ratio - 1)) if ratio else worst
                print(f"{layout:<12} {mode:<10} {precision:<9} {planned / 1e6:>7.1f} MB {measured / 1e6:>7.1f} MB "
                      f"{ratio:>6.3f}", flush=True)
    print(f"largest difference: {worst:.1%} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
