"""The step-time model on this machine against runs: `ablate.plan --hardware here`'s prediction (predict/here.py)
for each configuration, then `python -m ablate` runs of each, repeats interleaved (config 1, 2, ..., 12, then
again); prints each configuration's predicted step, the measured steps' median [min, max] (summary.json's
`step_time_s`: the median of the steady steps), the error of the prediction against the median, the mean
absolute percentage error (MAPE; target <= 10%), and for each sweep whether its arms rank alike by predicted and
by measured step where the measured ranges do not overlap. Runs whose machine was more than 10% off its
calibration at start or end (summary.json's `machine_speed.off`) are named, and the MAPE is given again with each
prediction scaled by the machine's speed then (the calibration's GEMM probe, timed beside the prediction) over its
speed in each run (the mean of the run's start and end probes): a machine that slows between the prediction and
the run is not the model's error. Each run's own prediction (summary.json's `predicted`, made by the run before
its first step) is set beside it, with its MAPE.

The configurations: the layouts sweep's three arms (4 ranks, global batch 16), the matrix / C3 arms (ddp and
ddp_sync, fp32 and bf16, 2 ranks, grad_accum 8 x batch 4), C4's model (dim 256, 4 layers, seq 128) in fp32 and
bf16 on one rank, the default run, a larger batch, FSDP2 on 2 ranks.

    .venv/bin/python bench/predict_here.py [--repeats 3] [--only NAME ...] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from ablate.compose import config_of
from ablate.metrics.flops import gemm_probe
from ablate.metrics.machine_speed import PROBE_REPEATS
from ablate.metrics.peak import measured_peak
from ablate.predict import here
from ablate.report.predicted import agreement

C4 = "model.dim=256 model.n_layers=4 model.n_heads=8 model.n_kv_heads=4 model.ffn_hidden=768 train.seq_len=128"
MATRIX = "parallel={} launcher.nproc_per_node=2 train.grad_accum=8 train.batch_size=4 precision={}"
LAYOUTS = "launcher.nproc_per_node=4 train.global_batch_size=16 train.seq_len=64 "
CONFIGS = {   # name: (sweep, overrides)
    "layouts/fsdp2": ("layouts", LAYOUTS + "parallel=fsdp2"),
    "layouts/hsdp": ("layouts", LAYOUTS + "parallel=hsdp parallel.shard_size=2"),
    "layouts/fsdp2_tp2": ("layouts", LAYOUTS + "parallel=fsdp2 parallel.tp=2"),
    "matrix/ddp_sync fp32": ("matrix", MATRIX.format("ddp_sync", "fp32")),
    "matrix/ddp fp32": ("matrix", MATRIX.format("ddp", "fp32")),
    "matrix/ddp_sync bf16": ("matrix", MATRIX.format("ddp_sync", "bf16")),
    "matrix/ddp bf16": ("matrix", MATRIX.format("ddp", "bf16")),
    "c4/fp32": ("c4", C4 + " precision=fp32"),
    "c4/bf16": ("c4", C4 + " precision=bf16"),
    "default": ("one rank", ""),
    "default batch 32": ("one rank", "train.batch_size=32"),
    "fsdp2 x 2": ("fsdp2", "parallel=fsdp2 launcher.nproc_per_node=2"),
}
STEPS = "train.steps=30 train.warmup_steps=5 logger=none"


def speed_now(ranks: int) -> float:
    """This machine's speed against its calibration now, with a rank's threads: the runs' own probe (1024^3
    float32 products, metrics/machine_speed.py) over the cached calibration for those threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(here.threads_per_rank(ranks))
    try:
        cpu = torch.device("cpu")
        calibration = measured_peak(cpu, "cpu", torch.float32, 1024, None)["flops"]
        return gemm_probe(cpu, torch.float32, 1024, repeats=PROBE_REPEATS, warmup=3)[0] / calibration
    finally:
        torch.set_num_threads(threads)


def predicted(overrides: str) -> dict:
    cfg = config_of(f"model=tiny {overrides}".split())[1]
    speed = speed_now(cfg.launcher.nproc_per_node)
    return {"step_time_s": here.predict(cfg)["step_time_s"], "speed": speed}


def run(overrides: str, run_dir: Path) -> dict:
    argv = [sys.executable, "-m", "ablate", *f"model=tiny {overrides} {STEPS}".split(), f"hydra.run.dir={run_dir}"]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    s = json.loads((run_dir / "summary.json").read_text())
    speed = s.get("machine_speed") or {}
    return {"step_time_s": s["step_time_s"], "off": bool(speed.get("off")),
            "own": (s.get("predicted") or {}).get("step_time_s"),   # the run's own, made before its first step
            "speed": (speed["start_ratio"] + speed["end_ratio"]) / 2 if speed else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    configs = {k: v for k, v in CONFIGS.items() if not args.only or k in args.only}
    out = Path(args.out or tempfile.mkdtemp(prefix="predict_here_"))
    predictions = {name: predicted(o) for name, (_, o) in configs.items()}
    measured = {name: [] for name in configs}
    for r in range(args.repeats):
        for i, (name, (_, o)) in enumerate(configs.items()):
            measured[name].append(run(o, out / f"{i:02d}-r{r}"))
    rows, errors, scaled_errors, own_errors = {}, [], [], []
    print(f"{'configuration':<22} {'predicted':>10} {'measured median [min, max]':>32} {'error':>7} "
          f"{'run own':>10} {'error':>7}")
    for name, runs in measured.items():
        steps = [m["step_time_s"] for m in runs]
        median, p = statistics.median(steps), predictions[name]["step_time_s"]
        errors.append(abs(p - median) / median)
        scaled = statistics.median(p * predictions[name]["speed"] / m["speed"] if m["speed"] else p for m in runs)
        scaled_errors.append(abs(scaled - median) / median)
        rows[name] = {"predicted": p, "median": median, "measured": steps}
        off = sum(m["off"] for m in runs)
        note = f"  ({off} run(s) off their calibration)" if off else ""
        own = statistics.median(m["own"] for m in runs) if all(m["own"] for m in runs) else None
        if own:
            own_errors.append(abs(own - median) / median)
        own_text = f"{own * 1e3:>7.1f} ms {(own - median) / median:>+7.1%}" if own else f"{'—':>10} {'':>7}"
        print(f"{name:<22} {p * 1e3:>7.1f} ms {median * 1e3:>9.1f} ms [{min(steps) * 1e3:6.1f}, "
              f"{max(steps) * 1e3:6.1f}] {(p - median) / median:>+7.1%} {own_text}{note}")
    print(f"MAPE {statistics.mean(errors):.1%} over {len(errors)} configurations ({args.repeats} runs each); "
          f"scaled by the machine's speed at the prediction and in each run: {statistics.mean(scaled_errors):.1%}; "
          f"runs in {out}")
    if own_errors:
        print(f"the runs' own predictions (each made before its first step, median of its runs): MAPE "
              f"{statistics.mean(own_errors):.1%} over {len(own_errors)} configurations")
    for sweep in sorted({s for s, _ in configs.values()}):
        arms = {n: rows[n] for n, (s, _) in configs.items() if s == sweep}
        if len(arms) > 1:
            print(f"  {sweep}: {agreement(arms)}")


if __name__ == "__main__":
    main()
