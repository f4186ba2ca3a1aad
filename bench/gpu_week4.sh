#!/usr/bin/env bash
# The GPU-meaningful week-4 rows on ONE GPU (H100/H200), unattended, inside 9 minutes from install to the
# final report, on a bare offline box: the machine's own python and CUDA torch are kept; what it lacks
# (Hydra) comes as wheels. Cheapest rows first, so a slow row costs what comes after it, not the cheap ones:
#   C6  naive vs pinned loader with simulated storage latency, sized so the pinned loader keeps up.
#   C4  fp32 vs bf16 vs fp16 on a ~125M model: memory, tokens/s, overflow.
#   C5  default vs expandable_segments on variable-length batches: fragmentation, reserved memory, and
#       each arm's largest batch (ablate.maxbatch; CUDA OOM decides), the report's "batch x4" check.
#   C1  MFU/HFU (every convention) beside NVML utilisation: model=1b bf16 + torch.compile (per block),
#       checkpointing off/on.
# Every child process is bounded by the time left: each run has its own timeout (--run-timeout) and its
# batch search shares it, no run starts after the deadline (--until), each row's sweep and the final
# report run under `timeout`. Results come home in a few files: the device tool returns at most 8 files
# from OUT, none more than 2 folders down, so the rows write into a work folder and OUT gets
#   OUT/results.tar.gz  every run dir (summary.json, metrics.jsonl, logs, traces) and each row's report,
#                       packed again after each row and on exit (a killed script still returns what finished)
#   OUT/report.md, OUT/report.csv   the final report over every row
#   OUT/gpu_week4.log   this script's output;  OUT/gpu.txt   nvidia-smi's name, memory, driver
#   OUT/plan_vs_measured.txt   ablate.plan's activations and state for each run's overrides beside what it saved,
#                       and its step on this GPU's figures (ablate.calibrate, run first) beside the measured one
#
# Usage:  bash bench/gpu_week4.sh [--install-only] [OUT]
#   OUT       default $OUT (the device tool's folder) or multirun/gpu_week4_<time>
#   PY        python to use (default python3: the machine's, with its CUDA torch)
#   WHEELS    wheel folder to install from when Hydra is missing (default .whl; bench/fetch_wheels.sh)
#   BUDGET_S  seconds for everything, install to final report (default 500: 9 minutes less a margin)
#   LOGGER    none (default) or wandb
#   ROWS      the rows to run (default "c6_pinned c4_bf16 c5_expandable c1_mfu", in that order)
#   SMOKE=1   the same script on a CPU at toy scale (tiny model, few steps): checks its mechanics, not a GPU
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
INSTALL_ONLY=0
if [ "${1:-}" = "--install-only" ]; then INSTALL_ONLY=1; shift; fi
PY=${PY:-python3}
WHEELS=${WHEELS:-.whl}
BUDGET_S=${BUDGET_S:-500}
DEST=${1:-${OUT:-multirun/gpu_week4_$(date +%Y-%m-%d_%H-%M-%S)}}
SITE=${SITE:-${TMPDIR:-/tmp}/ablate-site}
WORK=${WORK:-${TMPDIR:-/tmp}/gpu_week4_work_$$}
DEADLINE=$(( T0 + BUDGET_S ))
if [ "$INSTALL_ONLY" = 0 ]; then   # the script's own output, stdout and stderr each as they are, also in OUT
  mkdir -p "$DEST" "$WORK"
  exec > >(tee -a "$DEST/gpu_week4.log") 2> >(tee -a "$DEST/gpu_week4.log" >&2)
fi
die() { echo "gpu_week4: $*" >&2; exit 1; }
say() { echo "[gpu_week4 +$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( $1 - $(date +%s) )); }
pack() {   # everything under WORK as one archive in OUT (atomically), the report beside it
  tar czf "$DEST/results.tar.gz.part" -C "$WORK" . 2>/dev/null && mv -f "$DEST/results.tar.gz.part" "$DEST/results.tar.gz"
  for f in report.md report.csv plan_vs_measured.txt; do [ -f "$WORK/$f" ] && cp -f "$WORK/$f" "$DEST/$f"; done
  return 0
}
[ "$INSTALL_ONLY" = 0 ] && trap pack EXIT

# ---------------------------------------------------------------- 1. install: wheels, never the network
if ! "$PY" -c "import hydra, omegaconf, submitit, pyDOE3" 2>/dev/null; then
  ls "$WHEELS"/*.whl >/dev/null 2>&1 || die "Hydra is missing and $WHEELS has no wheels: run bash bench/fetch_wheels.sh where pip works, and carry $WHEELS"
  say "installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE (--no-index)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
    || die "pip could not install the wheels in $WHEELS"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"   # ablate itself, and its Hydra launcher plugin
"$PY" -c "import hydra, omegaconf, yaml, rich, numpy, ablate.__main__, ablate.sweeps, ablate.report, ablate.maxbatch" \
  || die "import failed with $PY (PYTHONPATH=$PYTHONPATH): see above"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
say "imports ok: $("$PY" -c 'import hydra, omegaconf; print("hydra", hydra.__version__, "omegaconf", omegaconf.__version__)')"
[ "$INSTALL_ONLY" = 1 ] && exit 0

# ---------------------------------------------------------------- 2. the rows
DEVICE=cuda TOY=() C4_SHAPE=(model.dim=768 model.n_layers=12 model.n_heads=12 model.n_kv_heads=12 model.ffn_hidden=2048)
if [ "${SMOKE:-0}" = 1 ]; then
  C4_SHAPE=()   # the toy model stays toy
  DEVICE=cpu TOY=(model=tiny train.seq_len=64 model.max_seq_len=256 train.batch_size=4 train.steps=4 train.warmup_steps=1
                  train.compile=false metrics.gemm_probe_n=128 dataloader.read_latency_ms=1 "metrics.profile_steps=[2,1]")
else
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || die "no CUDA device visible"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$DEST/gpu.txt" 2>&1
cat "$DEST/gpu.txt"
UNTIL=$(( DEADLINE - 40 ))    # no run starts after this: room for the final report and the packing
COMMON=(train.device=$DEVICE "logger=${LOGGER:-none}" train.log_every=5 metrics.gemm_probe_n=8192)
SMALL=(model=small model.max_seq_len=1024 train.seq_len=1024 train.batch_size=16 train.steps=30 train.warmup_steps=10)

# this GPU's own figures first (matmul and SDPA at C4's shapes, memory bandwidth, a launch: docs/prediction.md,
# "Calibrate"), so that plan_vs_measured.txt sets the per-op model on them beside each run's measured step
CALIBRATED="$WORK/calibrated.yaml" CAL=("${SMALL[@]}" "${C4_SHAPE[@]}")
[ "${SMOKE:-0}" = 1 ] && CAL=("${TOY[@]}")
timeout --kill-after=5 60 "$PY" -m ablate.calibrate --out "$CALIBRATED" "${COMMON[@]}" "${CAL[@]}" \
  > "$WORK/calibrate.log" 2>&1 && cat "$WORK/calibrate.log" || { say "!! calibrate: see calibrate.log"; CALIBRATED=; }
ROWS=${ROWS:-c6_pinned c4_bf16 c5_expandable c1_mfu}
row() {   # row SWEEP RUN_TIMEOUT_S [ablate.sweeps options --] overrides...
  local name=$1 limit=$2; shift 2
  case " $ROWS " in *" $name "*) ;; *) return ;; esac
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  local budget; budget=$(left "$UNTIL")
  if [ "$budget" -lt 20 ]; then say "!! $name: not run, out of time"; return; fi
  [ "$limit" -gt "$budget" ] && limit=$budget
  say "$name (each run at most ${limit}s, the row at most ${budget}s)"
  timeout --kill-after=5 "$budget" "$PY" -m ablate.sweeps "$name" --dir "$WORK/$name" --run-timeout "$limit" \
    --until "$UNTIL" "${opts[@]}" -- "${COMMON[@]}" "$@" "${TOY[@]}" > "$WORK/$name.log" 2>&1 \
    || say "!! $name: some runs failed, did not run or ran out of time, see $name.log in results.tar.gz"
  grep -E "^\[[0-9]+/[0-9]+\]" "$WORK/$name.log" | sed 's/^/    /'
  pack
}

# C6: a ~125M model's step (tens of ms on an H100) against 2 workers at 6 ms a batch (333 batches/s):
# the pinned loader keeps up, so the row measures the loader, not a starved GPU (the report states both)
row c6_pinned 45 -- "${SMALL[@]}" dataloader.read_latency_ms=6
row c4_bf16 60 -- "${SMALL[@]}" "${C4_SHAPE[@]}"
row c5_expandable 100 --batch-search start=32 --batch-search multiple_of=32 --batch-search limit=512 \
  --batch-search steps=6 -- "${SMALL[@]}" train.seq_len_min=64
row c1_mfu 120 -- model=1b precision=bf16 train.compile=true dataloader=pinned train.seq_len=2048 \
  train.batch_size=4 train.steps=30 train.warmup_steps=12

# ---------------------------------------------------------------- 3. one report over every row
say "report"
budget=$(( $(left "$DEADLINE") - 10 ))
[ "$budget" -lt 5 ] && budget=5
timeout --kill-after=5 "$budget" "$PY" -m ablate.report "$WORK" > "$WORK/report.log" 2>&1 || say "!! report: see report.log"
tail -n 40 "$WORK/report.log"
# the plan (ablate.plan, fake tensors) against what each run's autograd saved on this GPU's attention kernels
timeout --kill-after=5 60 "$PY" bench/plan_vs_measured.py ${CALIBRATED:+--hardware "$CALIBRATED"} "$WORK" \
  > "$WORK/plan_vs_measured.txt" 2>&1 \
  || say "!! plan vs measured: see plan_vs_measured.txt"
cat "$WORK/plan_vs_measured.txt"
pack
say "done: $(ls "$DEST" | tr '\n' ' ')(in $DEST); every run dir is in results.tar.gz"
