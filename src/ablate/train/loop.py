"""The training loop: built once, then the article's recipe step after step.

config -> ranks -> model/precision/strategy/data built once -> loop -> figures at log steps ->
summary. Runs on every rank; rank 0 writes the run directory.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, Optional

import torch

from ablate import allocator, optim, parallel
from ablate import precision as precision_group
from ablate.config import AblateConfig, RunStopped
from ablate.console import StepProgress, library_output_to_log, print_summary, route_library_logs
from ablate.dataloader import DeviceFeeder, build_loader
from ablate.logger import Tracker
from ablate.metrics import comm, host, steady
from ablate.metrics.meter import Meter
from ablate.metrics.profile import NOT_PROFILED, StepProfiler
from ablate.model import build as build_model
from ablate.model import count_params
from ablate.model.contract import vocab_size_of
from ablate.model.facts import flop_model
from ablate.train import checkpoint, distributed, hooks, provenance, ranks, signals

FAILURES_DIR = ".failures"   # <run dir>/.failures/rank{N}.txt: each failing rank's own error, as it happened


def check_runnable(cfg: AblateConfig, device: torch.device) -> None:
    """A precision or strategy this device cannot run: one ConfigError line, before any work."""
    precision_group.check_hardware(cfg.precision, device)
    parallel.check(cfg, device.type == "cuda")


def build(cfg: AblateConfig, env: distributed.DistEnv):
    """The model under the contract, its facts (summary.json's params, blocks, FLOPs' source) and the strategy."""
    torch.manual_seed(cfg.train.seed)           # same initial weights on every rank
    model = build_model(cfg.model, env.device)
    facts = {"params": count_params(model.net, non_embedding=False), "params_non_embedding": count_params(model.net),
             "blocks": model.blocks.record(), "vocab_size": vocab_size_of(model.net),
             "flops": flop_model(cfg.model, cfg.train.seq_len, model.net)}
    strategy = parallel.build(cfg.parallel, cfg.precision, model, cfg.train, cfg.optim, env.device, env.world_size)
    return facts, strategy


class Loop:
    """The steps themselves, plus what happens between them: checkpoints, stop signals, and the
    non-finite rule (checked at log steps and before every checkpoint: no host sync per step)."""

    def __init__(self, cfg, env, strategy, feeder, meter, tracker, progress, run_dir: Path, resolved: Dict):
        self.cfg, self.env, self.strategy, self.feeder = cfg, env, strategy, feeder
        self.meter, self.tracker, self.progress, self.run_dir = meter, tracker, progress, run_dir
        self.resolved = resolved
        self.profiler = StepProfiler(cfg.metrics.profile_steps, env.device, run_dir, env.rank, env.is_main)
        self._profile_logged = False
        self.preemption = signals.Preemption(env.world_size)
        self.saved_step: Optional[int] = None
        self.hooks = hooks.load()   # ABLATE_STEP_HOOKS: called as each step begins (train/hooks.py)
        self.lr = cfg.optim.lr

    def micro_steps(self) -> None:
        t, strategy = self.cfg.train, self.strategy
        for micro in range(t.grad_accum):
            x, y = next(self.feeder)
            self.meter.clock.begin()
            with strategy.micro_step(last=micro == t.grad_accum - 1):
                with strategy.autocast():
                    loss = strategy.model(x, y)
                strategy.backward(loss / t.grad_accum)
            self.meter.clock.end("fwd_bwd")
            self.meter.on_micro(loss)

    def run(self, start_step: int) -> None:
        t = self.cfg.train
        first_measured = min(start_step + t.warmup_steps + 1, t.steps)
        self.meter.excluded["warmup"] = list(range(start_step + 1, first_measured))
        traced = set(self.profiler.traced_steps(start_step + 1))
        for step in range(start_step + 1, t.steps + 1):
            if step == first_measured:
                self.meter.start_measuring()
            if step in traced:
                self.meter.exclude_from(step)
            self.meter.step_begins(step)
            for hook in self.hooks:
                hook(self.env.rank, step)
            self.lr = optim.lr_at(step, self.cfg.optim, t.steps)
            optim.set_lr(self.strategy.optimizer_param_groups, self.lr)
            self.micro_steps()
            self.meter.clock.begin()
            grad_norm = self.strategy.step(measure_state=step == t.steps)
            self.meter.clock.end("optimizer")
            self.meter.on_step(grad_norm)
            self.profiler.step()
            if step in traced and step + 1 not in traced:   # the trace is written: steady steps again
                self.meter.include_again()
            row = None
            if step % t.log_every == 0 or step == t.steps:
                row = self.meter.log_point(step)
                row["lr"] = self.lr
                self.add_profile(row)
                self.tracker.log(row)
                self.check_finite(step)
            self.progress.advance(step, row)
            self.between_steps(step)

    def add_profile(self, row: Dict) -> None:
        """The traced steps' figures join the first log row after the trace is in (and W&B gets the trace)."""
        if self.profiler.result is None or self._profile_logged:
            return
        row.update(self.profiler.figures())
        self.tracker.add_file(self.profiler.path, "trace")
        self._profile_logged = True

    def last_good(self) -> str:
        return (f"last good checkpoint: {self.run_dir / checkpoint.DIRNAME} (step {self.saved_step})"
                if self.saved_step else "no checkpoint was written")

    def check_finite(self, step: int) -> None:
        """train.max_nonfinite_steps consecutive steps with a NaN/inf loss or gradient norm (fp16's skipped
        steps count alike) stop the run with one line."""
        limit, bad = self.cfg.train.max_nonfinite_steps, self.meter.consecutive_nonfinite()
        if limit and bad >= limit:
            raise RunStopped(f"stopped at step {step}: {bad} consecutive steps with a non-finite loss or "
                                        f"gradient norm (train.max_nonfinite_steps={limit}); {self.last_good()}")

    def between_steps(self, step: int) -> None:
        every, last = self.cfg.train.checkpoint_every, self.cfg.train.steps
        if step < last and self.preemption.due():   # at the last step the run simply finishes
            self.save(step)
            raise checkpoint.Preempted(self.preemption.signum, step)
        if every and (step % every == 0 or step == last):
            self.save(step)

    def save(self, step: int) -> None:
        """A checkpoint, never of non-finite weights (the previous one stays the latest)."""
        self.check_finite(step)
        if not self.strategy.state_is_finite():   # NaN weights never recover: stop, keep the last good one
            raise RunStopped(f"stopped at step {step}: the weights are not finite, so no checkpoint was "
                                        f"written from them; {self.last_good()}")
        self.meter.step_times.take()      # CUDA: the save has synchronised; a resume keeps every step's time
        meta = {"wandb_id": self.tracker.wandb_id, "world_size": self.env.world_size, "totals": self.meter.totals,
                "config": {k: v for k, v in self.resolved.items() if k != "hydra"}}
        checkpoint.save(self.run_dir / checkpoint.DIRNAME, self.strategy, step, meta, self.env.is_main)
        self.saved_step = step


def profile_notes(profiler, strategy, env) -> Dict[str, str]:
    """Why an overlap figure is absent, or what it cannot mean here."""
    figures = profiler.figures()
    notes = {k: NOT_PROFILED for k, v in figures.items() if v is None and profiler.result is None}
    if profiler.result is not None and figures["comm_overlap_frac"] is None:
        notes["comm_overlap_frac"] = "no communication in the traced steps"
    if strategy.overlap_needs_streams and env.device.type != "cuda":
        why = ("DeepSpeed's CPU accelerator has no streams: overlap_comm cannot hide communication here (the "
               "figure is the engine's, on or off, not a result)")
        notes.update(comm_overlap_frac=why, comm_exposed_s=why)
    return notes


def resume_point(cfg: AblateConfig, run_dir: Path) -> Optional[Path]:
    """train.resume, or this run dir's own checkpoint when a requeued Slurm job starts again."""
    explicit = checkpoint.resolve(cfg.train.resume)
    if explicit:
        return explicit
    own = run_dir / checkpoint.DIRNAME
    return own if (own / "meta.pt").exists() and ranks.rank_env().slurm_job else None


def resume(cfg: AblateConfig, run_dir: Path, resolved: Dict, strategy, env) -> Dict[str, object]:
    """{step, wandb_id, totals, changed} from the checkpoint to continue, or a fresh start."""
    path = resume_point(cfg, run_dir)
    if path is None:
        return {"step": 0, "wandb_id": None, "totals": None, "changed": {}}
    meta = checkpoint.read_meta(checkpoint.newest_whole(path))
    changed = checkpoint.check_resumable(meta.get("config"), resolved, meta["step"], env.world_size,
                                         meta.get("world_size"))
    meta = checkpoint.load(path, strategy, env)
    strategy.apply_hyperparameters(cfg.optim)     # lr & co as this run asks, not as the checkpoint had them
    return {"step": meta["step"], "wandb_id": meta.get("wandb_id"), "totals": meta.get("totals"),
            "changed": changed, "from": str(meta["path"])}


def run(cfg: AblateConfig, run_dir: Path, resolved: Dict, choices: Dict[str, str],
        applied_env: Dict[str, object]) -> Optional[Dict[str, object]]:
    """Train on this rank; rank 0 returns the summary (other ranks return None)."""
    env = distributed.setup(cfg.train.device, need_group=parallel.choice(cfg.parallel.name).needs_group)
    route_library_logs(run_dir, env.rank)
    clean = False
    try:
        check_runnable(cfg, env.device)
        with library_output_to_log(run_dir):     # DeepSpeed's op builds and messages, compiler lines
            facts, strategy = build(cfg, env)
        resumed = resume(cfg, run_dir, resolved, strategy, env)
        start_step = resumed["step"]
        if env.is_main:
            checkpoint.truncate_metrics(run_dir, start_step)
        loader = build_loader(cfg.train, cfg.dataloader, cfg.data, facts["vocab_size"], env.rank, env.world_size,
                              start_step * cfg.train.grad_accum, env.device)
        feeder = DeviceFeeder(loader, cfg.dataloader, env.device)
        meter = Meter(cfg, env, feeder, strategy, facts.pop("flops"), resumed["totals"])
        tracker = Tracker(cfg.logger, run_dir, resolved, choices, env.is_main, resumed["wandb_id"])
        progress = StepProgress(cfg.train.steps, start_step, env.is_main)
        loop = Loop(cfg, env, strategy, feeder, meter, tracker, progress, run_dir, resolved)
        loop.saved_step = start_step or None
        try:
            loop.run(start_step)
        except checkpoint.Preempted as stop:
            tracker.close(exit_code=0)
            progress.close()
            distributed.teardown(clean=True)
            loop.preemption.hand_over(env.is_main)     # under Slurm: requeued, does not return
            if loop.preemption.orphaned:   # the launcher that would say it is gone: rank 0 says it
                if env.is_main:
                    print(f"ablate: {signals.stopped(stop.signum, run_dir, signals.ORPHANED)}", file=sys.stderr,
                          flush=True)
            raise RunStopped(signals.stopped(stop.signum, run_dir),
                                        exit_code=128 + stop.signum) from None
        except BaseException:
            tracker.close(exit_code=1)
            raise
        finally:
            progress.close()
            meter.close()
            loop.profiler.close()
            loop.preemption.restore()
        summary = {**meter.summary(), **loop.profiler.figures(), "profile": loop.profiler.record()}
        per_rank = comm.all_gather_object(
            {**distributed.place(env), "state_bytes": strategy.measured_state,
             "comm_exposed_s": summary["comm_exposed_s"],
             "tokens_per_s_per_device": summary["tokens_per_s_per_device"],
             **{k: summary[k] for k in ("step_time_s", "step_time_p90_s", "compute_before_comm_s")},
             "mem_peak_bytes": summary["mem_peak_bytes"], "comm_bytes_per_step": summary["comm_bytes_per_step"],
             **meter.host.rank_figures()},
            env)
        strategy.close()
        if env.is_main:
            summary.update({
                "run_name": run_dir.name, "run_dir": str(run_dir), "choices": choices, "steps": cfg.train.steps,
                "resumed_from_step": start_step,
                "resume": {k: resumed[k] for k in ("from", "changed") if k in resumed} if start_step else None,
                **facts, "numerics": strategy.numerics,
                "state_bytes": strategy.measured_state, "per_rank": per_rank, **distributed.layout(per_rank),
                "slurm": ranks.slurm_job(),
                "straggler": steady.straggler(per_rank, cfg.metrics.straggler_factor),
                "host_load": host.summarize(meter.host.load_start, per_rank, per_rank[0].get("host")),
                "env": applied_env,
                "versions": provenance.versions(), "provenance": provenance.record(env.device),
                "device": str(env.device), "allocator_check": allocator.check_took(cfg.allocator, env.device),
                "notes": {**meter.notes, **profile_notes(loop.profiler, strategy, env),
                          **{f"env.{k}": v["reason"] for k, v in applied_env.items() if "reason" in v}},
                "sweep": resolved.get("sweep") or {},
            })
            tracker.finish(summary)
            print_summary(summary)
        clean = True
        return summary if env.is_main else None
    except Exception as e:   # its own error, noted before the peers see the connection close (failures.py)
        if not isinstance(e, RunStopped):
            failures_dir = run_dir / FAILURES_DIR
            failures_dir.mkdir(parents=True, exist_ok=True)
            (failures_dir / f"rank{env.rank}.txt").write_text(f"{type(e).__name__}: {e}"[:2000])
        raise
    finally:
        distributed.teardown(clean)
