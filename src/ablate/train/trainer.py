"""A rank's run, assembled: config -> ranks -> model/precision/strategy/data built once -> resume -> the loop
(loop.py) -> figures at log steps -> summary. Runs on every rank; rank 0 writes the run directory.
"""
from __future__ import annotations

import functools
import sys
import traceback
from pathlib import Path
from typing import Dict, Optional

import torch

from ablate import allocator, parallel
from ablate import precision as precision_group
from ablate.config import AblateConfig, ConfigError, RunStopped
from ablate.config.schedules import expected_of
from ablate.console import StepProgress, library_output_to_log, print_summary, route_library_logs
from ablate.dataloader import DeviceFeeder, build_loader
from ablate.logger import Tracker
from ablate.metrics import bubble, counting, host, steady, step_memory
from ablate.metrics.collectors import CollectorFailed
from ablate.metrics.comm import EXCHANGE_NOTE, EXCHANGED, exchanges_averaged
from ablate.metrics.meter import Meter
from ablate.metrics.profile import NOT_PROFILED
from ablate.model import build as build_model
from ablate.model import count_params, stages
from ablate.model.contract import vocab_size_of
from ablate.model.facts import declared_vocab, flop_model, measure
from ablate.model.flags import split_flags
from ablate.model.peak import plan_peak
from ablate.parallel.comm_model import expected_comm
from ablate.parallel.mesh import Layout, build_mesh
from ablate.predict import for_run, here
from ablate.train import checkpoint, distributed, provenance, ranks, resumable, signals
from ablate.train.loop import Diverged, Loop

FAILURES_DIR = ".failures"   # <run dir>/.failures/rank{N}.txt: each failing rank's own error, as it happened


def check_runnable(cfg: AblateConfig, device: torch.device) -> None:
    """A precision or strategy this device cannot run: one ConfigError line, before any work."""
    precision_group.check_hardware(cfg.precision, device)
    parallel.check(cfg, device.type == "cuda")


def layout_of(cfg: AblateConfig, env: distributed.DistEnv) -> Layout:
    """The layout asked for, on the ranks this process really joined (a launcher of our own agrees; torchrun or
    srun typed by hand may not)."""
    layout = parallel.layout_of(cfg)
    if layout.world != env.world_size:
        raise ConfigError(f"launcher.nodes x nproc_per_node = {layout.world} rank(s), but this process was started "
                          f"as one of {env.world_size}: give the launcher node the world it runs in")
    return layout


def build(cfg: AblateConfig, env: distributed.DistEnv, layout: Layout, mesh):
    """The model under the contract, its facts (summary.json's params, blocks, FLOPs' source) and the strategy."""
    torch.manual_seed(cfg.train.seed)           # same initial weights on every rank (TP splits the same tensors)
    model = build_model(cfg.model, env.device)
    facts = {"params": count_params(model.net, non_embedding=False), "params_non_embedding": count_params(model.net),
             "blocks": model.blocks.record(), "vocab_size": vocab_size_of(model.net) or declared_vocab(cfg.model),
             "flops": flop_model(cfg.model, cfg.train.seq_len, model.net, model,
                                 precision_group.numerics(cfg.precision.name).compute_dtype)}
    blocks = list(model.blocks.modules)
    facts["modeled"] = modeled(cfg, layout, [p.numel() for p in model.parameters()], facts["params"],
                               split_flags(cfg.model, layout.tp, model))   # before the split: as planned
    if env.is_main:   # the planned peak (fake tensors: once per process, the launcher's checks measured it)
        facts["modeled"]["peak_bytes_measured"] = planned_peak(cfg, layout)
    cut = None
    if layout.pp > 1:   # where the blocks sit in the forward, read before any layer is split (model/stages.py)
        cut = functools.partial(stages.split, plan=stages.outline(model, cfg.model.name), cfg=cfg,
                                pp_rank=layout.pp_rank(env.rank))
    strategy = parallel.build(cfg, model, env.device, layout, mesh, cut)
    return facts, strategy, blocks


def modeled(cfg: AblateConfig, layout: Layout, numels, n_params: int, split=None) -> Dict[str, object]:
    """summary.json's `modeled`: what the plan (state bytes per rank) and the comm model (bytes per step on each
    mesh dim) predict for this run's figures, keyed as the report reads them (a sweep's "expected here")."""
    comm = {f"comm_bytes_by_dim.{d}": v for d, v in expected_comm(cfg, layout, n_params).items()}
    # a pipeline's rank holds its stages' share (ablate.plan plans it per stage; not here, from the whole model)
    state = parallel.plan_bytes(numels, cfg, layout, split).total if layout.pp == 1 else None
    # a pipeline's bubble, as its schedule expects it (config/schedules.py)
    bubble = {"pp_bubble": expected_of(cfg.parallel)} if layout.pp > 1 else {}
    return {"state_bytes_total": state, **comm, **bubble}


def planned_peak(cfg: AblateConfig, layout: Layout) -> Optional[float]:
    """The plan's peak tensor bytes per rank (model/peak.py), as a run's step tracker measures them; None for a
    model whose activations cannot be measured on fake tensors."""
    try:
        plan = plan_peak(cfg, measure(cfg), layout, gpu=False)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):   # a probe never stops a run that can train
        return None
    return plan.tensors if plan else None


def note_failure(run_dir: Path, rank: int, e: Exception) -> None:
    """.failures/rank{N}.txt (an error), stopped-rank{N}.txt (a stop on purpose, in its own words: no room,
    non-finite training) or signalled-rank{N}.txt (a signal's stop, which the launcher says); a rank killed
    outright leaves none (failures.silent_ranks); a disk too full for the note goes without."""
    if isinstance(e, RunStopped) and e.exit_code >= 128:   # a signal's stop (the launcher says it): noted as one,
        name, text = f"signalled-rank{rank}.txt", str(e)   # so that a rank that left no note at all stands out
    else:
        name, text = (f"stopped-rank{rank}.txt", str(e)) if isinstance(e, RunStopped) else \
            (f"rank{rank}.txt", f"{type(e).__name__}: {e}".replace("\n", " "))
        if not isinstance(e, RunStopped) or e.__cause__ is not None:   # an error (a collector's too): its traceback
            text = f"{text}\n\n{''.join(traceback.format_exception(e))}"
    try:
        (run_dir / FAILURES_DIR).mkdir(parents=True, exist_ok=True)
        (run_dir / FAILURES_DIR / name).write_text(text[:200_000])
    except OSError:
        pass


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


def resume(cfg: AblateConfig, run_dir: Path, resolved: Dict, strategy, env, layout: Layout) -> Dict[str, object]:
    """{step, wandb_id, totals, changed} from the checkpoint to continue, or a fresh start."""
    path = resume_point(cfg, run_dir)
    if path is None:
        return {"step": 0, "wandb_id": None, "totals": None, "changed": {}}
    meta = checkpoint.read_meta(checkpoint.newest_whole(path))
    changed = resumable.check_resumable(meta.get("config"), resolved, meta["step"], env.world_size,
                                         meta.get("world_size"), (meta.get("mesh"), layout.record()))
    meta = checkpoint.load(path, strategy, env)
    strategy.apply_hyperparameters(cfg.optim)     # lr & co as this run asks, not as the checkpoint had them
    return {"step": meta["step"], "wandb_id": meta.get("wandb_id"), "totals": meta.get("totals"),
            "changed": changed, "from": str(meta["path"])}


def train_loop(loop: Loop, start_step: int, run_dir: Path, env) -> Optional[RunStopped]:
    """The steps, and what ends them: a stop whose figures are still summarised (returned, said after the
    summary), a preemption (checkpointed: requeued under Slurm, else one line), an error (the tracker closed)."""
    meter, tracker, progress = loop.meter, loop.tracker, loop.progress
    try:
        loop.run(start_step)
    except (Diverged, CollectorFailed) as e:   # its figures so far are still summarised, then its one line
        meter.close_interval()
        return e
    except checkpoint.Preempted as stop:
        tracker.close(exit_code=0)
        progress.close()
        distributed.teardown(clean=True)
        loop.preemption.hand_over(env.is_main)     # under Slurm: requeued, does not return
        if loop.preemption.launcher_gone(settle_s=5):   # the launcher that would say it is gone: rank 0 does
            if env.is_main:
                print(f"ablate: {signals.stopped(stop.signum, run_dir, signals.ORPHANED)}", file=sys.stderr,
                      flush=True)
        raise RunStopped(signals.stopped(stop.signum, run_dir), exit_code=128 + stop.signum) from None
    except BaseException:
        tracker.close(exit_code=1)
        raise
    finally:
        progress.close()
        meter.close()
        loop.profiler.close()
        loop.preemption.restore()
        loop.continued.restore()
    return None


def free_step_before_joining(cfg: AblateConfig, run_dir: Path):
    """This rank's step with free collectives (predict/here.py: the run's prediction on a CPU), timed before the
    rank joins the run's group: (its step and collectives, None) or (None, why not); (None, None) on a GPU, whose
    prediction is the GPU model's (predict.for_run). A config this device cannot run says so first."""
    launched = ranks.rank_env()
    rank = launched.rank
    try:
        device = torch.device(distributed.device_type(cfg.train.device))
        check_runnable(cfg, device)
        if device.type == "cuda":
            return None, None
        together = run_dir / f".free_steps.{launched.launch_id}" if parallel.layout_of(cfg).world > 1 else None
        return here.before_joining(cfg, rank, together)
    except Exception as e:
        note_failure(run_dir, rank, e)
        raise


def rank_record(env, summary: Dict[str, object], strategy, loop: Loop) -> Dict[str, object]:
    """What each rank tells rank 0 (summary.json's per_rank; its long steps and gaps read for stalls, then
    dropped)."""
    meter = loop.meter
    return {**distributed.place(env), "state_bytes": strategy.measured_state,
            **{k: summary[k] for k in ("comm_exposed_s", "tokens_per_s_per_device", "step_time_s", "step_time_p90_s",
                                       "compute_before_comm_s", "mem_peak_bytes", "comm_bytes_per_step",
                                       "comm_bytes_by_dim", "peak_bytes_measured")},
            **({"pp_bubble": summary["pp_bubble"]} if "pp_bubble" in summary else {}),
            "slowest_before_comm": meter.slowest_before_comm(), "long_steps": meter.long_steps(),
            "long_gaps": meter.long_gaps(), "continued_at": loop.continued.at, **meter.host.rank_figures()}


def run_record(cfg: AblateConfig, run_dir: Path, choices, resolved, applied_env, resumed, facts, strategy,
               layout: Layout, per_rank, summary, loop: Loop) -> Dict[str, object]:
    """Rank 0's part of summary.json beside the meter's figures: the run, its facts, every rank's, and notes."""
    env, start_step = loop.env, resumed["step"]
    predicted = for_run(cfg, layout, facts, loop.meter.throughput, loop.meter.notes, loop.predicted_here)
    if predicted:   # the report's "expected here" for throughput (a check's `expected: modeled`)
        facts["modeled"]["tokens_per_s"] = predicted["tokens_per_s"]
    return {
        "run_name": run_dir.name, "run_dir": str(run_dir), "choices": choices, "steps": cfg.train.steps,
        "resumed_from_step": start_step,
        "resume": {k: resumed[k] for k in ("from", "changed") if k in resumed} if start_step else None,
        **facts, "numerics": strategy.numerics, "mesh": layout.record(), "optimizer": strategy.optimizer_record,
        "state_bytes": strategy.measured_state, "per_rank": per_rank, **distributed.layout(per_rank),
        "slurm": ranks.slurm_job(),
        **step_memory.peak_figures(per_rank, facts["modeled"].get("peak_bytes_measured")),
        "straggler": steady.straggler(per_rank, cfg.metrics.straggler_factor,
                                      layout.pp_rank if layout.pp > 1 else None),
        **bubble.pipeline_figures(per_rank),
        "predicted": predicted, "comm_bytes_by_dim": exchanges_averaged(summary["comm_bytes_by_dim"], per_rank),
        # (drops the ranks' long_steps and long_gaps)
        "stalls": steady.held_up_by(summary["stalls"], per_rank, summary["step_time_s"],
                                    steady.checkpointed(cfg.train.checkpoint_every, cfg.train.steps)),
        "host_load": host.summarize(loop.meter.host.load_start, per_rank, per_rank[0].get("host")),
        "env": applied_env,
        "versions": provenance.versions(), "provenance": provenance.record(env.device),
        "device": str(env.device), "allocator_check": allocator.check_took(cfg.allocator, env.device),
        "notes": {**loop.meter.notes, **profile_notes(loop.profiler, strategy, env),
                  **{f"comm_bytes_by_dim.{d}": EXCHANGE_NOTE for d in EXCHANGED if layout.size(d) > 1},
                  **{f"env.{k}": v["reason"] for k, v in applied_env.items() if "reason" in v}},
        "sweep": resolved.get("sweep") or {},
    }


def run(cfg: AblateConfig, run_dir: Path, resolved: Dict, choices: Dict[str, str],
        applied_env: Dict[str, object]) -> Optional[Dict[str, object]]:
    """Train on this rank; rank 0 returns the summary (other ranks return None)."""
    route_library_logs(run_dir, ranks.rank_env().rank)   # (before the free step: its libraries' lines go there too)
    free = free_step_before_joining(cfg, run_dir)
    env = distributed.setup(cfg.train.device, need_group=parallel.choice(cfg.parallel.name).needs_group)
    clean = False
    try:
        check_runnable(cfg, env.device)
        layout = layout_of(cfg, env)
        mesh = build_mesh(layout, env.device.type)
        predicted = here.after_joining(cfg, env.rank, *free, lambda o: counting.all_gather_object(o, env)) \
            if env.device.type == "cpu" else None
        with library_output_to_log(run_dir):     # DeepSpeed's op builds and messages, compiler lines
            facts, strategy, blocks = build(cfg, env, layout, mesh)
        resumed = resume(cfg, run_dir, resolved, strategy, env, layout)
        start_step = resumed["step"]
        if env.is_main:
            checkpoint.truncate_metrics(run_dir, start_step)
        # a tensor-parallel group reads one data-parallel rank's batches
        loader = build_loader(cfg.train, cfg.dataloader, cfg.data, facts["vocab_size"], layout.dp_rank(env.rank),
                              layout.dp, start_step * cfg.train.grad_accum, env.device)
        feeder = DeviceFeeder(loader, cfg.dataloader, env.device)
        meter = Meter(cfg, env, feeder, strategy, facts.pop("flops"), layout, resumed["totals"])
        tracker = Tracker(cfg.logger, run_dir, resolved, choices, env.is_main, resumed["wandb_id"])
        progress = StepProgress(cfg.train.steps, start_step, env.is_main)
        loop = Loop(cfg, env, strategy, feeder, meter, tracker, progress, run_dir, resolved, blocks)
        loop.saved_step, loop.predicted_here = start_step or None, predicted
        stopped = train_loop(loop, start_step, run_dir, env)
        summary = {**meter.summary(), **loop.profiler.figures(), "profile": loop.profiler.record(),
                   "activation_bytes": loop.activation_bytes, **loop.memory_record()}
        collected = loop.collected.totals()
        stopped = stopped or loop.collected.failure()   # a collector's summary() that raised: said after the summary
        per_rank = counting.all_gather_object(rank_record(env, summary, strategy, loop), env)
        strategy.close()
        if env.is_main:
            summary.update(run_record(cfg, run_dir, choices, resolved, applied_env, resumed, facts, strategy, layout,
                                      per_rank, summary, loop))
            loop.collected.into_summary(summary, collected)
            tracker.finish(summary, exit_code=1 if stopped else 0)
            print_summary(summary)
        if isinstance(stopped, Diverged):   # (decided alike on every rank): none leaves before rank 0 wrote the
            distributed.barrier()           # summary, or the launcher would stop rank 0 as it writes it
        if stopped is not None:
            raise stopped
        clean = True
        return summary if env.is_main else None
    except Exception as e:   # its own error, noted before the peers see the connection close (failures.py)
        note_failure(run_dir, env.rank, e)
        raise
    finally:
        distributed.teardown(clean)
