#!/usr/bin/env bash
# The GPU-meaningful week-4 rows on ONE GPU (H100/H200), unattended, inside 10 minutes, on a bare offline
# box: the machine's own python and CUDA torch are kept; what it lacks (Hydra) comes as wheels.
#   C1  MFU/HFU beside NVML utilisation: model=1b bf16 + torch.compile, checkpointing off/on.
#   C4  fp32 vs bf16 vs fp16 on a ~125M model: memory, tokens/s, overflow.
#   C5  default vs expandable_segments on variable-length batches: fragmentation, reserved memory, and
#       each arm's largest batch (ablate.maxbatch; CUDA OOM decides), the report's "batch x4" check.
#   C6  naive vs pinned loader with simulated storage latency: data-wait share.
# Every run is its own process with its own timeout (--run-timeout), and no run starts after the deadline
# (--until): a slow row costs its own arm, never the rest. Everything lands under OUT: each run's
# summary.json, the logs, report.md / report.csv / PNGs.
#
# Usage:  bash bench/gpu_week4.sh [--install-only] [OUT]
#   OUT       default $OUT (the device tool's folder) or multirun/gpu_week4_<time>
#   PY        python to use (default python3: the machine's, with its CUDA torch)
#   WHEELS    wheel folder to install from when Hydra is missing (default .whl; bench/fetch_wheels.sh)
#   BUDGET_S  seconds for everything (default 570)
#   LOGGER    none (default) or wandb
#   SMOKE=1   the same script on a CPU at toy scale (tiny model, few steps): checks its mechanics, not a GPU
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
INSTALL_ONLY=0
if [ "${1:-}" = "--install-only" ]; then INSTALL_ONLY=1; shift; fi
PY=${PY:-python3}
WHEELS=${WHEELS:-.whl}
BUDGET_S=${BUDGET_S:-570}
DEST=${1:-${OUT:-multirun/gpu_week4_$(date +%Y-%m-%d_%H-%M-%S)}}
SITE=${SITE:-${TMPDIR:-/tmp}/ablate-site}
die() { echo "gpu_week4: $*" >&2; exit 1; }
say() { echo "[gpu_week4 +$(( $(date +%s) - T0 ))s] $*"; }

# ---------------------------------------------------------------- 1. install: wheels, never the network
if ! "$PY" -c "import hydra, omegaconf" 2>/dev/null; then
  ls "$WHEELS"/*.whl >/dev/null 2>&1 || die "Hydra is missing and $WHEELS has no wheels: run bash bench/fetch_wheels.sh where pip works, and carry $WHEELS"
  say "installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE (--no-index)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
    || die "pip could not install the wheels in $WHEELS"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"   # ablate itself, and its Hydra launcher plugin
"$PY" -c "import hydra, omegaconf, yaml, rich, numpy, ablate.train, ablate.sweeps, ablate.report, ablate.maxbatch" \
  || die "import failed with $PY (PYTHONPATH=$PYTHONPATH): see above"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
say "imports ok: $("$PY" -c 'import hydra, omegaconf; print("hydra", hydra.__version__, "omegaconf", omegaconf.__version__)')"
[ "$INSTALL_ONLY" = 1 ] && exit 0

# ---------------------------------------------------------------- 2. the rows
DEVICE=cuda TOY=()
if [ "${SMOKE:-0}" = 1 ]; then
  DEVICE=cpu TOY=(model=tiny train.seq_len=64 model.max_seq_len=256 train.batch_size=4 train.steps=4 train.warmup_steps=1
                  train.compile=false metrics.gemm_probe_n=128 dataloader.read_latency_ms=1 "metrics.profile_steps=[2,1]")
else
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || die "no CUDA device visible"
fi
mkdir -p "$DEST"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$DEST/gpu.txt" 2>&1
cat "$DEST/gpu.txt"
UNTIL=$(( T0 + BUDGET_S - 25 ))    # room for the report at the end
COMMON=(train.device=$DEVICE "logger=${LOGGER:-none}" train.log_every=5 metrics.gemm_probe_n=8192)
SMALL=(model=small model.max_seq_len=1024 train.seq_len=1024 train.batch_size=16 train.steps=30 train.warmup_steps=10)

row() {   # row SWEEP RUN_TIMEOUT_S [ablate.sweeps options --] overrides...
  local name=$1 limit=$2; shift 2
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  say "$name (each run at most ${limit}s; nothing starts after +$(( UNTIL - T0 ))s)"
  "$PY" -m ablate.sweeps "$name" --dir "$DEST/$name" --run-timeout "$limit" --until "$UNTIL" "${opts[@]}" -- \
    "${COMMON[@]}" "$@" "${TOY[@]}" > "$DEST/$name.log" 2>&1 || say "!! $name: some runs failed or did not run, see $DEST/$name.log"
  grep -E "^\[[0-9]+/[0-9]+\]" "$DEST/$name.log" | sed 's/^/    /'
}

row c1_mfu 150 -- model=1b precision=bf16 train.compile=true dataloader=pinned train.seq_len=2048 \
  train.batch_size=4 train.steps=30 train.warmup_steps=12
row c4_bf16 60 -- "${SMALL[@]}" model.dim=768 model.n_layers=12 model.n_heads=12 model.n_kv_heads=12 model.ffn_hidden=2048
row c5_expandable 100 --batch-search start=32 --batch-search multiple_of=32 --batch-search limit=512 \
  --batch-search steps=6 -- "${SMALL[@]}" train.seq_len_min=64
row c6_pinned 45 -- train.steps=60 train.warmup_steps=10

# ---------------------------------------------------------------- 3. one report over every row
say "report"
"$PY" -m ablate.report "$DEST" > "$DEST/report.log" 2>&1 || say "!! report: see $DEST/report.log"
tail -n 40 "$DEST/report.log"
say "done: everything is under $DEST"
