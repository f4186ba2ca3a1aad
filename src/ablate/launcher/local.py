"""launcher=local: the ranks on this machine, in this process or as processes of their own.

With nproc_per_node > 1 the ranks are started through torch's elastic launcher API (what torchrun uses):
each rank gets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR, and when one rank fails the agent stops the others
at once and the failing rank's error is raised (RunFailed) with its root cause. The ranks are forked by a
fork server (START_METHOD), so they know their launcher by pid (train/signals.py LAUNCHER_PID). Under an
external `torchrun` or `srun` (train/ranks.py reads their variables) each process trains where it is.
"""
from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import uuid
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from ablate import data
from ablate.config import AblateConfig, ConfigError, RunFailed, RunStopped
from ablate.launcher import failures
from ablate.model import stages
from ablate.model.facts import measure
from ablate.parallel import strategy_class
from ablate.train import memory_guard, signals
from ablate.train import trainer as train
from ablate.train.distributed import check_ranks_fit_gpus, device_type
from ablate.train.ranks import given_by_elastic_agent, rank_env


def check(cfg: AblateConfig) -> None:
    """What this machine cannot run (precision, strategy, memory), said before any rank starts."""
    if cfg.launcher.nodes > 1 and not rank_env().launched:   # (torchrun or srun typed by hand: its nodes are real)
        raise ConfigError(f"launcher.nodes={cfg.launcher.nodes} with launcher=local: this launcher runs one node; "
                          "use launcher=slurm (a job on several nodes), or set launcher.nodes=1")
    kind = device_type(cfg.train.device)
    if kind == "cuda":
        check_ranks_fit_gpus(cfg.launcher.nproc_per_node, torch.cuda.device_count())
    train.check_runnable(cfg, torch.device(kind))
    stages.check(cfg)        # a pipeline's cut of the model (its blocks in turn), on the meta device
    facts = measure(cfg)     # the model on fake tensors: its vocabulary, parameters and activations
    data.check(cfg.data, cfg.train.seq_len, facts.vocab_size, cfg.train.batch_size)
    memory_guard.check_memory(cfg, kind, facts)


def launch(cfg: AblateConfig, resolved: Dict, run_dir: Path, choices: Dict[str, str], applied: Dict):
    if cfg.launcher.nproc_per_node > 1 and not rank_env().launched:
        return spawn_local_ranks(cfg, run_dir, resolved, choices, applied)
    return train.run(cfg, run_dir, resolved, choices, applied)


# Ranks are forked by a server that imported torch and the trainer once (fork_server.py): a rank starts without
# the ~2-3 s of imports each spawned rank paid (x0.80 on three 2-rank runs at once on a 2-core host). The server
# is a clean, single-threaded process, safe where a fork of the launcher (threads, a rendezvous store) is not;
# Python 3.14's default start method on Linux.
START_METHOD = "forkserver"


def _adopt(launcher_env: Dict[str, str]) -> None:
    """A forked rank holds the server's environment, the launcher's when the server started (an earlier run of
    this process, perhaps): it runs in the launcher's as it is now, as a spawned rank would, plus its own."""
    own = given_by_elastic_agent()
    os.environ.clear()
    os.environ.update({**launcher_env, **own})


def _rank_entry(launcher_env, cfg, run_dir, resolved, choices, applied):
    """The top of a rank's process (an edge, like the entry points): a rank that checkpointed on a signal
    leaves with 128 + the signal, which the parent reads as "stopped", not "failed"."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)   # the fork server ignores it (launcher/fork_server.py)
    _adopt(launcher_env)
    try:
        return record(train.run)(cfg, run_dir, resolved, choices, applied)
    except RunStopped as e:
        if e.exit_code not in STOP_CODES:
            raise      # non-finite training: the parent shows this rank's own error
        sys.exit(e.exit_code)   # checkpointed on a signal: the parent says so once, for every rank


STOP_CODES = {128 + signal.SIGINT, 128 + signal.SIGTERM}   # a rank that checkpointed and stopped on a signal


def _quiet_elastic_logs() -> None:
    """torch elastic logs each failed rank's whole traceback and each signal it forwards; ablate says the root
    cause, or where a stopped run can continue, in one line instead (its modules set their own levels)."""
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")] + \
            ["torch.distributed.elastic", "torch.multiprocessing.spawn"]:   # ("Terminating process ... SIGTERM")
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
                          monitor_interval=0.5, start_method=START_METHOD)
    multiprocessing.get_context(START_METHOD).set_forkserver_preload(
        ["ablate.launcher.fork_server", *strategy_class(cfg.parallel.name).rank_imports])
    _quiet_elastic_logs()
    _quiet_resource_tracker()
    shutil.rmtree(run_dir / train.FAILURES_DIR, ignore_errors=True)   # an earlier attempt's notes say nothing now
    launcher_env = {**os.environ, signals.LAUNCHER_PID: str(os.getpid())}
    try:
        results, stopped_by = run_agent(config, _rank_entry, launcher_env, cfg, run_dir, resolved, choices,
                                           applied)
    except ChildFailedError as e:
        raise _failure(e, run_dir, n) from None
    if stopped_by:   # Ctrl-C or SIGTERM here: the agent passed it on and the ranks checkpointed
        raise RunStopped(signals.stopped(stopped_by, run_dir), exit_code=128 + stopped_by)
    return results.get(0)


def run_agent(config: LaunchConfig, entry, *args) -> Tuple[Optional[Dict], Optional[int]]:
    """torch's agent runs `entry(*args)` on each rank: their results, or the signal that stopped it.

    Stopped by one, the agent leaves its rendezvous open (to rejoin, were it elastic) and with it a keep-alive
    thread, a daemon that beats into the store every 5 s until the interpreter ends; one caught in C++ as it
    ends aborts the process ("terminate called without an active exception": exit -6 for 143). Out of the
    except block nothing holds the agent: collected, its timer's finalizer stops and joins that thread."""
    try:
        return elastic_launch(config, entry)(*args), None
    except SignalException as e:
        for sig in (signal.SIGINT, signal.SIGTERM):   # a late copy must not interrupt the exit's own clean-up
            signal.signal(sig, signal.SIG_IGN)
        stopped_by = e.sigval
    gc.collect()
    return None, stopped_by


def _failure(e: ChildFailedError, run_dir: Path, n: int) -> Exception:
    """What a failed rank's exit means: a stop the ranks alone were signalled to, a stop a rank chose (and
    said why), or a failure with its root cause."""
    codes = {f.exitcode for f in e.failures.values()}
    if codes <= STOP_CODES:      # the ranks alone were signalled (kill to their group): they stopped cleanly
        return RunStopped(signals.stopped(max(codes) - 128, run_dir), exit_code=max(codes))
    notes = run_dir / train.FAILURES_DIR
    stopped = failures.noted_stop(notes)
    if stopped:                  # a rank stopped the run on purpose, and said why in one line
        return RunStopped(failures.shown(stopped[1], notes / f"stopped-rank{stopped[0]}.txt", cut=False),
                          exit_code=1)
    (rank, failure), *others = failures.root_cause_first(e.failures)
    noted = failures.noted_root_cause(notes)
    silent = failures.silent_ranks(notes, n)
    if not noted and silent and failures.is_consequence(failures.own_error(failure)):
        return RunFailed(f"rank {silent[0]} ended without a word (killed: kill -9, the OOM killer?); rank {rank} "
                         "stopped too: its peer went away", exit_code=1)
    if noted and noted[0] != rank and failures.is_consequence(failures.own_error(failure)):
        said = failures.shown(noted[1], notes / f"rank{noted[0]}.txt")
        return RunFailed(f"rank {noted[0]} failed: {said} (rank {rank} stopped too: its peer went away)",
                         exit_code=1)
    also = f" (rank{'s' if len(others) > 1 else ''} {', '.join(str(r) for r, _ in others)} stopped too)" \
        if others else ""
    said = failures.shown(failures.own_error(failure), notes / f"rank{rank}.txt")
    return RunFailed(f"rank {rank} failed (exit code {failure.exitcode}): {said}{also}",
                     exit_code=failure.exitcode if failure.exitcode > 0 else 1)
