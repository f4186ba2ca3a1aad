"""The training loop: built once, then the article's recipe step after step.

config -> ranks -> model/precision/strategy/data built once -> loop -> figures at log steps ->
summary. Runs on every rank; rank 0 writes the run directory.
"""
from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Dict, Optional

import torch

from ablate import distributed, parallel
from ablate import precision as precision_group
from ablate.config import AblateConfig
from ablate.console import StepProgress, print_summary
from ablate.data import DeviceFeeder, build_loader
from ablate.metrics.meter import Meter
from ablate.model import build_model, count_params
from ablate.tracking import Tracker


def versions() -> Dict[str, Optional[str]]:
    import hydra
    import omegaconf

    out = {"python": platform.python_version(), "torch": torch.__version__, "hydra": hydra.__version__,
           "omegaconf": omegaconf.__version__, "cuda": torch.version.cuda}
    for name in ("deepspeed", "wandb", "submitit"):   # metadata only: importing deepspeed is slow
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def build(cfg: AblateConfig, env: distributed.DistEnv):
    torch.manual_seed(cfg.train.seed)           # same initial weights on every rank
    model = build_model(cfg.model, env.device)
    precision = precision_group.Precision(cfg.precision, env.device)
    model = precision.prepare_model(model)
    if cfg.train.compile:
        model = torch.compile(model)
    strategy = parallel.build(cfg.parallel, model, cfg.train, precision, env.device, env.world_size)
    return model, precision, strategy


def injected_failure():
    """ABLATE_INJECT_FAILURE=RANK:STEP makes that rank raise at that step: tests of failure paths."""
    spec = os.environ.get("ABLATE_INJECT_FAILURE")
    return tuple(int(v) for v in spec.split(":")) if spec else (None, None)


def train_steps(cfg: AblateConfig, strategy, feeder: DeviceFeeder, meter: Meter, tracker: Tracker,
                progress: StepProgress, start_step: int, rank: int = 0) -> None:
    t = cfg.train
    fail_rank, fail_step = injected_failure()
    first_measured = min(start_step + t.warmup_steps + 1, t.steps)
    for step in range(start_step + 1, t.steps + 1):
        if step == first_measured:
            meter.start_measuring()
        if (rank, step) == (fail_rank, fail_step):
            raise RuntimeError(f"injected failure on rank {rank} at step {step} (ABLATE_INJECT_FAILURE)")
        for micro in range(t.grad_accum):
            x, y = next(feeder)
            meter.clock.begin()
            with strategy.micro_step(last=micro == t.grad_accum - 1):
                with strategy.precision.autocast():
                    loss = strategy.model(x, y)
                strategy.backward(loss / t.grad_accum)
            meter.clock.end("fwd_bwd")
            meter.on_micro(loss)
        meter.clock.begin()
        grad_norm = strategy.step(measure_state=step == t.steps)
        meter.clock.end("optimizer")
        meter.on_step(grad_norm)
        row = None
        if step % t.log_every == 0 or step == t.steps:
            row = meter.log_point(step)
            tracker.log(row)
        progress.advance(step, row)


def run(cfg: AblateConfig, run_dir: Path, resolved: Dict, choices: Dict[str, str],
        applied_env: Dict[str, object]) -> Optional[Dict[str, object]]:
    """Train on this rank; rank 0 returns the summary (other ranks return None)."""
    env = distributed.setup(cfg.train.device, need_group=cfg.parallel.name != "none")
    clean = False
    try:
        precision_group.check_hardware(cfg.precision, env.device)
        parallel.check(cfg, env.device.type == "cuda")
        model, precision, strategy = build(cfg, env)
        start_step = 0
        loader = build_loader(cfg.train, cfg.dataloader, cfg.model.vocab_size, env.rank, env.world_size,
                              start_step * cfg.train.grad_accum, env.device)
        feeder = DeviceFeeder(loader, cfg.dataloader, env.device)
        meter = Meter(cfg, env, feeder, strategy)
        tracker = Tracker(cfg.logger, run_dir, resolved, choices, env.is_main)
        progress = StepProgress(cfg.train.steps, start_step, env.is_main)
        try:
            train_steps(cfg, strategy, feeder, meter, tracker, progress, start_step, env.rank)
        except BaseException:
            tracker.close(exit_code=1)
            raise
        finally:
            progress.close()
            meter.close()
        summary = meter.summary()
        per_rank = distributed.all_gather_object(
            {"rank": env.rank, "state_bytes": strategy.measured_state,
             "tokens_per_s_per_device": summary["tokens_per_s_per_device"],
             "mem_peak_bytes": summary["mem_peak_bytes"], "comm_bytes_per_step": summary["comm_bytes_per_step"]},
            env)
        strategy.close()
        if not env.is_main:
            clean = True
            return None
        summary.update({
            "run_name": run_dir.name, "run_dir": str(run_dir), "choices": choices, "steps": cfg.train.steps,
            "params": count_params(model, non_embedding=False), "params_non_embedding": count_params(model),
            "state_bytes": strategy.measured_state, "per_rank": per_rank, "env": applied_env,
            "versions": versions(), "device": str(env.device),
            "notes": {**meter.notes, **{f"env.{k}": v["reason"] for k, v in applied_env.items() if "reason" in v}},
            "sweep": resolved.get("sweep") or {},
        })
        tracker.finish(summary)
        print_summary(summary)
        clean = True
        return summary
    finally:
        distributed.teardown(clean)
