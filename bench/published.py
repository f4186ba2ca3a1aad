"""The step-time model against torchtitan's published Llama 3.1 runs on H100s (benchmarks/
llama3_h100_202412_torchtitan.md: Grand Teton hosts, 96 GB HBM2e H100s at 500 W; conf/hardware/
h100_96gb_500w.yaml), each row predicted by `ablate.plan --json --hardware FILE` with the run's own layout; prints
docs/prediction.md's table. Nothing here is fitted: the hardware file's microbenchmark figures, as they are.

    .venv/bin/python bench/published.py [--hardware h100_96gb_500w]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

SEQ = "train.seq_len={0} model.max_seq_len={0} "
T1 = "model=8b parallel=fsdp2 train.batch_size=2 model.activation_checkpointing=selective " + SEQ.format(8192)
FULL = "model.activation_checkpointing=true train.compile=true precision=fp8 "
COMPILE, FP8 = "train.compile=true ", "train.compile=true precision=fp8 "
T5 = ("model=405b parallel=fsdp2 parallel.tp=8 parallel.pp=8 launcher.nodes=64 train.batch_size=32 " + FULL +
      SEQ.format(8192))
# (row, published tokens/s per GPU, tolerance, overrides): torchtitan's local batch size is train.batch_size
ROWS = [
    ("8B, 8 GPUs, FSDP 8, selective AC (Table 1)", 5762, 0.20, T1 + "launcher.nodes=1"),
    ("8B, 8 GPUs, + compile (Table 1)", 6667, 0.25, T1 + COMPILE + "launcher.nodes=1"),
    ("8B, 8 GPUs, + compile + Float8 (Table 1)", 8532, 0.25, T1 + FP8 + "launcher.nodes=1"),
    ("8B, 128 GPUs, FSDP 128, selective AC (Table 3)", 5605, 0.20, T1 + "launcher.nodes=16"),
    ("8B, 128 GPUs, + compile (Table 3)", 6514, 0.25, T1 + COMPILE + "launcher.nodes=16"),
    ("8B, 128 GPUs, + compile + Float8 (Table 3)", 8380, 0.25, T1 + FP8 + "launcher.nodes=16"),
    ("8B at 32k, 8 GPUs, FSDP 8, full AC, compile + Float8 (Table 2)", 3890, 0.25,
     "model=8b parallel=fsdp2 launcher.nodes=1 train.batch_size=1 " + FULL + SEQ.format(32768)),
    ("70B, 256 GPUs, FSDP 32 x TP 8, full AC, compile + Float8 (Table 4)", 829, 0.25,
     "model=70b parallel=fsdp2 parallel.tp=8 launcher.nodes=32 train.batch_size=16 " + FULL + SEQ.format(8192)),
    ("405B, 512 GPUs, FSDP 8 x TP 8 x PP 8, 1F1B, full AC, compile + Float8 (Table 5)", 100, 0.25,
     T5 + "parallel.pp_schedule=1f1b"),
    ("405B, 512 GPUs, as above, interleaved 1F1B (Table 5)", 128, 0.25,
     T5 + "parallel.pp_schedule=interleaved_1f1b parallel.pp_stages_per_rank=2"),
]
COMMON = "launcher=slurm launcher.nproc_per_node=8 precision=bf16"


def predicted(hardware: str, overrides: str):
    cmd = [sys.executable, "-m", "ablate.plan", "--json", "--hardware", hardware, *COMMON.split(), *overrides.split()]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        return None, (out.stderr.strip().splitlines() or ["failed"])[-1]
    p = json.loads(out.stdout)
    return p.get("predicted") or {}, p


def bound_by(pred) -> str:
    parts = dict(pred.get("compute_s_by_class") or {})
    parts.update({f"{d} comm": s for d, s in (pred.get("exposed_comm_s") or {}).items() if s})
    if pred.get("bubble_s"):
        parts["bubble"] = pred["bubble_s"]
    total = pred["step_time_s"]
    return ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])[:4])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hardware", default="h100_96gb_500w")
    ap.add_argument("--only", default="", help="the rows whose name contains this")
    args = ap.parse_args()
    print("| published run (torchtitan, 2024-12) | published tok/s/GPU | predicted | predicted / published | within | "
          "where the step goes |")
    print("|---|---|---|---|---|---|")
    only = [r for r in ROWS if args.only in r[0]]
    for row, published, tolerance, overrides in only:
        pred, plan = predicted(args.hardware, overrides)
        if not pred or not pred.get("step_time_s"):
            print(f"| {row} | {published:,} | - | - | - | {plan if isinstance(plan, str) else pred.get('why')} |")
            continue
        gpus = plan["world_size"]
        per_gpu = pred["tokens_per_s"] / gpus
        ratio = per_gpu / published
        print(f"| {row} | {published:,} | {per_gpu:,.0f} (MFU {pred['mfu']:.0%}) | x{ratio:.2f} | "
              f"{'yes' if abs(ratio - 1) <= tolerance else 'no'} ({tolerance:.0%}) | {bound_by(pred)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
