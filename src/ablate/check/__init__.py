"""`python -m ablate.check [--config-dir DIR] [--steps N] [--rtol X] [--dir D] OVERRIDES`: does a layout train the
model that one rank trains? Before a sweep trusts a tensor-parallel plan (a user's `tp_plan` above all: a fused
projection split as one block trains another model without an error), run a few steps of the layout the overrides
ask for and of one rank on the same batches, and compare the loss at every step.

The one-rank run reads what the layout's data-parallel ranks read together: batch size per rank, and grad_accum x
the data-parallel degree (batch i of a step is a function of (seed, i): dataloader.RankBatches), from the same
initial weights (the seed). Exit 0: the same at every step (within --rtol); 1: different, with the first step
where the losses part; 2: bad input, in one line.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import List, Optional, Tuple

from ablate.config import ConfigError
from ablate.config.command_line import config_dir_override
from ablate.config.dims import DIMS_NAMED

EXIT_DIFFERENT = 1
# relative tolerance per precision: float32 arithmetic in another order (a sum over tp ranks) moves a loss by ~1e-6
# per step; a wrong split moves it by ~1e-4 at the first step and more after (tests/test_your_split.py)
RTOL = {"fp32": 2e-5, "bf16": 2e-2, "fp16": 2e-2, "fp8": 5e-2}
# keys the one-rank reference sets itself: its own layout and launcher, the batch the layout's ranks read together
REFERENCE_OWNS = ("parallel", "launcher", "train.batch_size", "train.global_batch_size", "train.grad_accum")
CHECK_SETS = ("train.steps", "train.log_every", "train.warmup_steps", "train.resume", "train.checkpoint_every",
              "logger", "hydra.run.dir")


def key_of(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def owned(override: str, keys) -> bool:
    key = key_of(override)
    return any(key == k or key.startswith(k + ".") for k in keys)


def run_args(overrides: List[str], steps: int) -> List[str]:
    """What both runs train: the user's overrides, a few steps, every step logged, nothing else written."""
    kept = [o for o in overrides if not owned(o, CHECK_SETS)]
    return [*kept, f"train.steps={steps}", "train.log_every=1", "train.warmup_steps=1", "train.checkpoint_every=0",
            "logger=none"]


def reference_args(overrides: List[str], cfg, layout) -> List[str]:
    """One rank, reading per step what the layout's data-parallel ranks read together."""
    t = cfg.train
    kept = [o for o in overrides if not owned(o, REFERENCE_OWNS)]
    return [*kept, "parallel=none", "launcher=local", "launcher.nodes=1", "launcher.nproc_per_node=1",
            f"train.batch_size={t.batch_size}", f"train.grad_accum={t.grad_accum * layout.dp}"]


def losses(run_dir: Path) -> List[float]:
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(r)["loss"] for r in rows if r.strip()]


def first_difference(layout: List[float], one: List[float], rtol: float) -> Optional[Tuple[int, float]]:
    """(step, relative difference) of the first step whose losses differ by more than rtol; None: the same."""
    for step, (a, b) in enumerate(zip(layout, one), start=1):
        diff = abs(a - b) / max(abs(b), 1e-12)
        if not diff <= rtol:   # NaN included
            return step, diff
    return None


def train(args: List[str], run_dir: Path, what: str) -> List[float]:
    from ablate.launcher.group import run_ablate

    done, _ = run_ablate(args, run_dir, then=f"what it trained is in {run_dir.parent}; the same command checks anew")
    if done.returncode != 0:
        last = (done.stderr or "").strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise ConfigError(f"the {what} run failed ({run_dir}): {last[0][:240]}")
    return losses(run_dir)


def check(args) -> int:
    from ablate import parallel
    from ablate.compose import config_of

    overrides = [*config_dir_override(args.config_dir), *args.overrides]
    cfg = config_of(overrides)[1]   # composed and checked as the run will be: a bad override is one line here
    layout = parallel.layout_of(cfg)
    rtol = args.rtol if args.rtol is not None else RTOL.get(cfg.precision.name, 2e-2)
    base = args.dir or Path(tempfile.mkdtemp(prefix="ablate-check-"))
    split, one = base / "layout", base / "one_rank"
    print(f"ablate.check: {args.steps} steps of mesh {layout.label()} ({DIMS_NAMED}) and of one rank "
          f"with grad_accum {cfg.train.grad_accum * layout.dp}, losses compared within {rtol:g}", flush=True)
    got = train(run_args(overrides, args.steps), split, "layout's")
    want = train(run_args(reference_args(overrides, cfg, layout), args.steps), one, "one-rank")
    parted = first_difference(got, want, rtol)
    if parted is None:
        worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, want))
        print(f"same: {len(got)} steps, largest relative difference {worst:.2g} (<= {rtol:g})")
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
        return 0
    step, diff = parted
    print(f"different: the losses part at step {step}: {got[step - 1]:.6g} (mesh {layout.label()}) vs "
          f"{want[step - 1]:.6g} (one rank), relative {diff:.2g} > {rtol:g}; the runs: {split}, {one}")
    return EXIT_DIFFERENT
