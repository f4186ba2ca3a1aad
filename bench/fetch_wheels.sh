#!/usr/bin/env bash
# Wheels of what bench/gpu_week4.sh needs and a bare GPU image lacks, for a box with no network.
# The device image (see bench/README.md) already has torch, numpy, scipy, matplotlib, rich, pyyaml, tqdm
# and nvidia-ml-py (and submitit's own needs, cloudpickle and typing-extensions); ablate's GPU rows
# (launcher=local, logger=none) import nothing else but Hydra, submitit (the launcher registry) and pyDOE3
# (ablate.sweeps plans factorial designs with it; scipy and numpy, its needs, are in the image):
#   hydra-core, omegaconf, antlr4-python3-runtime, submitit, pyDOE3   (all pure Python: one set serves any python 3)
# antlr4-python3-runtime 4.9.3 is published as an sdist only: `pip wheel` builds its wheel here.
# Usage: bash bench/fetch_wheels.sh [DEST]   (default .whl, ignored by git; the device tool carries it)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.whl}
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
mkdir -p "$DEST"
"$PY" -m pip wheel -q --no-deps -w "$DEST" hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 \
  submitit==1.5.4 pyDOE3==1.6.2
ls "$DEST"
