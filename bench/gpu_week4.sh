#!/usr/bin/env bash
# The GPU-meaningful week-4 rows on ONE GPU (H100/H200), unattended, about 8 minutes; everything lands
# under one folder, which ends with report.md / report.csv / PNGs:
#   C1  MFU/HFU and nvidia-smi utilisation, model=1b bf16 + torch.compile, checkpointing off/on.
#       The baseline arm is the 1B MFU run: fused AdamW, flash SDPA (GQA in-kernel), side-stream
#       prefetch, no host syncs in the step; target >= 60% MFU against the 989 TFLOP/s datasheet peak.
#   C4  fp32 vs bf16 vs fp16 on the ~125M model: memory, tokens/s, overflow.
#   C5  default vs expandable_segments with variable-length batches: fragmentation, reserved memory.
#   C6  naive vs pinned loader with simulated storage latency: data-wait share.
# Usage:  bash bench/gpu_week4.sh [OUT_DIR]      (PY=..., LOGGER=wandb to log to W&B too)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-multirun/gpu_week4_$(date +%Y-%m-%d_%H-%M-%S)}
COMMON=(train.device=cuda "logger=${LOGGER:-none}" train.log_every=5 metrics.gemm_probe_n=8192)
SMALL=(model=small model.max_seq_len=1024 train.seq_len=1024 train.batch_size=16 train.steps=30 train.warmup_steps=10)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"

run() {   # run SWEEP TIMEOUT_S overrides...
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date +%T))"
  timeout "$limit" "$PY" -m ablate "+sweeps=$name" "hydra.sweep.dir=$OUT/$name" "${COMMON[@]}" "$@" \
    > "$OUT/$name.log" 2>&1 || echo "!! $name failed or timed out: see $OUT/$name.log"
  grep -E "^step [0-9]+/[0-9]+ .*tok/s" "$OUT/$name.log" | tail -n 3
}

run c1_mfu 260 model=1b precision=bf16 train.compile=true dataloader=pinned train.seq_len=2048 \
  train.batch_size=4 train.steps=30 train.warmup_steps=12
run c4_bf16 120 "${SMALL[@]}" model.dim=768 model.n_layers=12 model.n_heads=12 model.n_kv_heads=12 model.ffn_hidden=2048
run c5_expandable 60 "${SMALL[@]}" train.seq_len_min=64
run c6_pinned 45 train.steps=60 train.warmup_steps=10

"$PY" -m ablate.report "$OUT"
echo "everything is under $OUT"
