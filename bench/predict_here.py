"""The step-time model on this machine against runs: `ablate.plan --hardware here`'s prediction (predict/here.py)
for each configuration, then `python -m ablate` runs of each, repeats interleaved (config 1, 2, ..., 12, then
again); prints each configuration's predicted step, the measured steps' median [min, max] (summary.json's
`step_time_s`: the median of the steady steps), the error of the prediction against the median, the mean
absolute percentage error (MAPE; target <= 10%), and for each sweep whether its arms rank alike by predicted and
by measured step where the measured ranges do not overlap. Runs whose machine was more than 10% off its
calibration at start or end (summary.json's `machine_speed.off`) are named, and the MAPE is given again with each
prediction scaled by the machine's speed then (the calibration's GEMM probe, timed beside the prediction) over its
speed in each run (the mean of the run's start and end probes): a machine that slows between the prediction and
the run is not the model's error. Each repeat predicts each configuration just before its run (with --per-op,
calibrated then too), and its prediction is the median of its repeats': a machine whose speed wanders meets the
prediction and the runs alike. Each run's own prediction (summary.json's `predicted`, made by the run before its
first step) is set beside it, with its MAPE.

The configurations: the layouts sweep's three arms (4 ranks, global batch 16), the matrix / C3 arms (ddp and
ddp_sync, fp32 and bf16, 2 ranks, grad_accum 8 x batch 4), C4's model (dim 256, 4 layers, seq 128) in fp32 and
bf16 on one rank, the default run, a larger batch, FSDP2 on 2 ranks; #68's pipeline, ZeRO-2 and large-collective
arms.

    .venv/bin/python bench/predict_here.py [--repeats 3] [--per-op] [--only NAME ...] [--out DIR] [--report]

Each run is added to DIR/results.jsonl as it ends: `--report --out DIR` reports a bench stopped part-way.
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
    # #68's further arms: a pipeline, a ZeRO stage, collectives of 40 MB a call (not predicted by --hardware here)
    "pipeline 1f1b, pp 2": ("pipeline", "parallel=fsdp2 parallel.pp=2 launcher.nproc_per_node=2 train.batch_size=8"),
    "zero2 x 2": ("zero", "parallel=zero2 launcher.nproc_per_node=2"),
    "small fsdp2 x 2": ("large collectives", "model=small parallel=fsdp2 launcher.nproc_per_node=2 train.steps=8 "
                                             "train.warmup_steps=3"),
}
STEPS = "train.steps=30 train.warmup_steps=5 logger=none"


def with_model(overrides: str) -> str:
    """The configuration's overrides on the tiny model unless it names its own; its own step counts win."""
    model = "" if "model=" in overrides else "model=tiny "
    steps = " ".join(o for o in STEPS.split() if o.split("=")[0] not in overrides)
    return f"{model}{overrides} {steps}"


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


def predicted(overrides: str, calibrated: Path = None) -> dict:
    """`--hardware here`'s prediction (None where it has none), and with `calibrated` the per-op model's on a
    hardware file `python -m ablate.calibrate` writes for this configuration (its model's shapes, its ranks)."""
    argv = with_model(overrides).split()
    cfg = config_of(argv)[1]
    speed = speed_now(cfg.launcher.nproc_per_node)
    out = {"step_time_s": here.predict(cfg).get("step_time_s"), "speed": speed, "per_op": None}
    if calibrated:
        subprocess.run([sys.executable, "-m", "ablate.calibrate", "--out", str(calibrated), *argv], check=True,
                       stdout=subprocess.DEVNULL)
        plan = subprocess.run([sys.executable, "-m", "ablate.plan", "--json", "--hardware", str(calibrated), *argv],
                              check=True, capture_output=True, text=True)
        out["per_op"] = json.loads(plan.stdout)["predicted"].get("step_time_s")
    return out


def run(overrides: str, run_dir: Path) -> dict:
    argv = [sys.executable, "-m", "ablate", *with_model(overrides).split(), f"hydra.run.dir={run_dir}"]
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
    ap.add_argument("--per-op", action="store_true", help="also the per-op model on a hardware file calibrated for "
                                                           "each configuration (python -m ablate.calibrate)")
    ap.add_argument("--report", action="store_true", help="report what --out's results.jsonl holds, running nothing")
    args = ap.parse_args()
    configs = {k: v for k, v in CONFIGS.items() if not args.only or k in args.only}
    out = Path(args.out or tempfile.mkdtemp(prefix="predict_here_"))
    out.mkdir(parents=True, exist_ok=True)
    if args.report:
        return report(configs, *read_back(out, configs), out)
    with (out / "results.jsonl").open("a") as log:
        for r in range(args.repeats):
            for i, (name, (_, o)) in enumerate(configs.items()):
                calibrated = out / f"calibrated-{i:02d}-r{r}.yaml" if args.per_op else None
                row = {"name": name, "repeat": r, "predicted": predicted(o, calibrated),
                       "measured": run(o, out / f"{i:02d}-r{r}")}
                log.write(json.dumps(row) + "\n")
                log.flush()
    report(configs, *read_back(out, configs), out)


def read_back(out: Path, configs) -> tuple:
    """Each configuration's predictions (the median over its repeats: each calibrated and predicted just before
    its run, so that a machine whose speed wanders is met alike by both) and measured runs, from results.jsonl (a
    bench stopped part-way reports the repeats it finished)."""
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    predictions, measured = {}, {}
    for name in configs:
        mine = [row for row in rows if row["name"] == name]
        if not mine:
            continue
        measured[name] = [row["measured"] for row in mine]
        preds = [row["predicted"] for row in mine]
        predictions[name] = {key: (statistics.median(p[key] for p in preds) if all(p[key] for p in preds) else None)
                             for key in ("step_time_s", "speed", "per_op")}
    repeats = min(len(m) for m in measured.values()) if measured else 0
    return predictions, measured, repeats


def error_text(p, median: float) -> str:
    return f"{p * 1e3:>7.1f} ms {(p - median) / median:>+7.1%}" if p else f"{'—':>10} {'':>7}"


def report(configs, predictions, measured, repeats: int, out: Path) -> None:
    """Each configuration's predictions (--hardware here, the runs' own, the per-op model's) beside its measured
    steps; each model's MAPE over the configurations it predicts, and whether each sweep's arms rank alike."""
    errors = {"here": [], "scaled": [], "own": [], "per-op": []}
    rows = {"here": {}, "per-op": {}}
    print(f"{'configuration':<22} {'measured median [min, max]':>32} {'here':>18} {'run own':>18} {'per-op':>18}")
    for name, runs in measured.items():
        steps = [m["step_time_s"] for m in runs]
        median, pred = statistics.median(steps), predictions[name]
        own = statistics.median(m["own"] for m in runs) if all(m["own"] for m in runs) else None
        for key, p in (("here", pred["step_time_s"]), ("own", own), ("per-op", pred["per_op"])):
            if p:
                errors[key].append(abs(p - median) / median)
                if key in rows:
                    rows[key][name] = {"predicted": p, "median": median, "measured": steps}
        if pred["step_time_s"]:
            p = pred["step_time_s"]
            scaled = statistics.median(p * pred["speed"] / m["speed"] if m["speed"] else p for m in runs)
            errors["scaled"].append(abs(scaled - median) / median)
        off = sum(m["off"] for m in runs)
        note = f"  ({off} run(s) off their calibration)" if off else ""
        print(f"{name:<22} {median * 1e3:>9.1f} ms [{min(steps) * 1e3:6.1f}, {max(steps) * 1e3:6.1f}] "
              f"{error_text(pred['step_time_s'], median)} {error_text(own, median)} "
              f"{error_text(pred['per_op'], median)}{note}")
    for key, errs in errors.items():
        if errs:
            print(f"MAPE {key}: {statistics.mean(errs):.1%} over {len(errs)} configurations ({repeats} runs each)")
    print(f"runs in {out}")
    for key, by_name in rows.items():
        for sweep in sorted({s for s, _ in configs.values()}):
            arms = {n: by_name[n] for n, (s, _) in configs.items() if s == sweep and n in by_name}
            if len(arms) > 1:
                print(f"  {key}, {sweep}: {agreement(arms)}")

if __name__ == "__main__":
    main()
