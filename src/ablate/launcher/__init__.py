"""conf/launcher -> where the ranks run: in this process, as local processes, or as a Slurm job.

launcher=local with nproc_per_node > 1 starts the ranks itself through torch's elastic launcher API
(what torchrun uses): each rank gets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR, and when one rank fails
the agent stops the others at once and the failing rank's error is shown. The same entrypoint also
runs under an external `torchrun` or `srun` (train/distributed.py reads their variables).
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Dict, Optional

import torch
import yaml
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from ablate.config import AblateConfig
from ablate.launcher import array as slurm_array
from ablate.launcher import environment, failures, script, slurm
from ablate.train import checkpoint, guards, signals
from ablate.train import loop as train
from ablate.train.distributed import check_ranks_fit_gpus, device_type, rank_env


def _write_config(run_dir: Path, resolved: Dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    plain = {k: v for k, v in resolved.items() if k != "hydra"}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(plain, sort_keys=False))


def check_local(cfg: AblateConfig) -> None:
    """What this machine cannot run (precision, strategy, memory), said before any rank starts."""
    kind = device_type(cfg.train.device)
    if kind == "cuda":
        check_ranks_fit_gpus(cfg.launcher.nproc_per_node, torch.cuda.device_count())
    train.check_runnable(cfg, torch.device(kind))
    guards.check_memory(cfg, kind)


def check_slurm(cfg: AblateConfig) -> None:
    """Slurm nodes check their own hardware; here only the request and the cluster."""
    slurm.check(cfg.launcher)


def launch_local(cfg: AblateConfig, resolved: Dict, run_dir: Path, choices: Dict[str, str], applied: Dict):
    if cfg.launcher.nproc_per_node > 1 and not rank_env().launched:
        return spawn_local_ranks(cfg, run_dir, resolved, choices, applied)
    return train.run(cfg, run_dir, resolved, choices, applied)


def launch_slurm(cfg: AblateConfig, resolved: Dict, run_dir: Path, choices: Dict[str, str], applied: Dict):
    here = rank_env()
    if here.launched or here.slurm_step is not None:   # a task of a job step (srun, the dry run's script): train here
        return train.run(cfg, run_dir, resolved, choices, applied)
    array_file = os.environ.pop("ABLATE_SLURM_ARRAY", None)
    if array_file:   # one point of a sweep: the sweep's launcher submits all points as one job array
        return slurm_array.queue(Path(array_file), *slurm.prepare(cfg, resolved, run_dir, choices, applied))
    return slurm.submit(cfg, resolved, run_dir, choices, applied)


# launcher=<name> -> (pre-launch check, launch): the one place a launcher choice is decoded
REGISTRY = {"local": (check_local, launch_local), "slurm": (check_slurm, launch_slurm)}
# launcher=<name> -> a sweep's run as a job step of the sweep's one allocation (sweeps/allocation.py), or
# None: the run is a process of its own on this machine
JOB_STEP = {"local": None, "slurm": script.job_step}


def check(cfg: AblateConfig) -> None:
    REGISTRY[cfg.launcher.name][0](cfg)


def launch(cfg: AblateConfig, resolved: Dict, run_dir: Path, choices: Dict[str, str]) -> Optional[Dict]:
    """Write the run's config, apply the allocator/NCCL environment (in the submitting process too: the
    sbatch script exports it), then start the ranks where `launcher=` says. A directory that already holds
    a run, or that another live run writes into, is refused (train/guards.py)."""
    owner = rank_env().rank == 0     # several tasks of one job (srun, torchrun) share the directory: rank 0 owns it
    if owner:
        guards.check_fresh(run_dir, cfg.train.resume)
        guards.lock(run_dir)
    try:
        _write_config(run_dir, resolved)
        with environment.applied(cfg) as applied:
            return REGISTRY[cfg.launcher.name][1](cfg, resolved, run_dir, choices, applied)
    finally:
        guards.release(run_dir)


def _rank_entry(cfg, run_dir, resolved, choices, applied):
    try:
        return record(train.run)(cfg, run_dir, resolved, choices, applied)
    except checkpoint.RunStopped as e:
        if e.exit_code not in STOP_CODES:
            raise      # non-finite training: the parent shows this rank's own error
        sys.exit(e.exit_code)   # checkpointed on a signal: the parent says so once, for every rank


STOP_CODES = {128 + signal.SIGINT, 128 + signal.SIGTERM}   # a rank that checkpointed and stopped on a signal


def _quiet_elastic_logs() -> None:
    """torch elastic logs each failed rank's whole traceback and each signal it forwards; ablate says the root
    cause, or where a stopped run can continue, in one line instead (its modules set their own levels)."""
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")] + \
            ["torch.distributed.elastic"]:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _quiet_resource_tracker() -> None:
    """kill -9 of this process leaves Python's resource tracker (its child, started with this interpreter's
    -W options) to free the semaphores the launcher made: it frees them and warns in two lines that tell a
    user nothing; the ranks' own line says what happened (train/signals.py ORPHANED)."""
    option = "ignore::UserWarning:multiprocessing.resource_tracker"
    if option not in sys.warnoptions:
        sys.warnoptions.append(option)


def spawn_local_ranks(cfg: AblateConfig, run_dir: Path, resolved: Dict, choices: Dict[str, str],
                      applied: Dict) -> Optional[Dict]:
    n = cfg.launcher.nproc_per_node
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=n, run_id=f"ablate-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                          monitor_interval=0.5, start_method="spawn")
    _quiet_elastic_logs()
    _quiet_resource_tracker()
    try:
        results = elastic_launch(config, _rank_entry)(cfg, run_dir, resolved, choices, applied)
    except SignalException as e:   # Ctrl-C or SIGTERM here: the agent passed it on and the ranks checkpointed
        for sig in (signal.SIGINT, signal.SIGTERM):   # a late copy must not interrupt the exit's own clean-up
            signal.signal(sig, signal.SIG_IGN)
        print(f"ablate: {signals.stopped(e.sigval, run_dir)}", file=sys.stderr)
        raise SystemExit(128 + e.sigval) from None
    except ChildFailedError as e:
        codes = {f.exitcode for f in e.failures.values()}
        if codes <= STOP_CODES:      # the ranks alone were signalled (kill to their group): they stopped cleanly
            print(f"ablate: {signals.stopped(max(codes) - 128, run_dir)}", file=sys.stderr)
            raise SystemExit(max(codes)) from None
        (rank, failure), *others = failures.root_cause_first(e.failures)
        noted = failures.noted_root_cause(run_dir / train.FAILURES_DIR)
        if noted and noted[0] != rank and failures.is_consequence(failures.own_error(failure)):
            print(f"ablate: rank {noted[0]} failed: {noted[1]} (rank {rank} stopped too: its peer went away)",
                  file=sys.stderr)
            raise SystemExit(1) from None
        also = f" (rank{'s' if len(others) > 1 else ''} {', '.join(str(r) for r, _ in others)} stopped too)" \
            if others else ""
        print(f"ablate: rank {rank} failed (exit code {failure.exitcode}): {failures.own_error(failure)}{also}",
              file=sys.stderr)
        raise SystemExit(failure.exitcode if failure.exitcode > 0 else 1) from None
    return results.get(0)
