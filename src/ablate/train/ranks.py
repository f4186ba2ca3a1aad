"""The rank environment (torchrun / our local launcher / srun / submitit): where this process sits in a job.

`rank_env()` is the one reader of the variables a launcher gives its ranks (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK) and of Slurm's (SLURM_*); every other module asks it. No torch here: the
command line asks it while composing (which rank owns the run dir) and must stay cheap.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

from ablate import usable_cores


@dataclass(frozen=True)
class RankEnv:
    """This process's place in a job, as the process environment says it."""
    rank: int                   # RANK, or SLURM_PROCID in a Slurm step of several tasks; else 0
    world_size: int
    local_rank: int
    local_world_size: int       # LOCAL_WORLD_SIZE, or SLURM_NTASKS_PER_NODE
    node_rank: int              # SLURM_NODEID, or torchrun's GROUP_RANK
    launched: bool              # started as one rank of several (torchrun, srun, our launcher): train here
    slurm_tasks: int            # SLURM_NTASKS (1 outside a Slurm step)
    slurm_job: Optional[str]    # SLURM_JOB_ID inside a Slurm job (a requeued job resumes its own checkpoint)
    slurm_step: Optional[str]   # SLURM_STEP_ID inside a job step (srun): a task of the job, train here
    submitit: bool              # started by submitit's sbatch script
    elastic: bool               # TORCHELASTIC_RUN_ID: a rank started by torch elastic (our local launcher, torchrun)
    launch_id: str = ""         # one launch's, shared by its ranks: elastic's run id, Slurm's job.step, the port

    @property
    def in_slurm(self) -> bool:
        return self.submitit or self.slurm_job is not None


def rank_env(environ: Mapping[str, str] = os.environ) -> RankEnv:
    """The rank environment, read now (a Slurm step's variables become RANK... once `setup` exported them)."""
    slurm_tasks = int(environ.get("SLURM_NTASKS", "1"))
    launched = "RANK" in environ or slurm_tasks > 1
    rank = environ.get("RANK") or (environ.get("SLURM_PROCID") if launched else None) or 0
    local_rank = int(environ.get("LOCAL_RANK", 0))
    return RankEnv(rank=int(rank), world_size=int(environ.get("WORLD_SIZE", 1)), local_rank=local_rank,
                   local_world_size=int(environ.get("LOCAL_WORLD_SIZE") or environ.get("SLURM_NTASKS_PER_NODE")
                                        or local_rank + 1),
                   node_rank=int(environ.get("SLURM_NODEID") or environ.get("GROUP_RANK") or 0),
                   launched=launched, slurm_tasks=slurm_tasks, slurm_job=environ.get("SLURM_JOB_ID"),
                   slurm_step=environ.get("SLURM_STEP_ID"),
                   submitit="SUBMITIT_EXECUTOR" in environ, elastic="TORCHELASTIC_RUN_ID" in environ,
                   launch_id=environ.get("TORCHELASTIC_RUN_ID") or (f"{environ['SLURM_JOB_ID']}."
                                                                    f"{environ.get('SLURM_STEP_ID', '')}"
                                                                    if "SLURM_JOB_ID" in environ else "")
                   or environ.get("MASTER_PORT", ""))


# what torch elastic's agent sets for each rank it starts (LocalElasticAgent._start_workers, start_processes)
ELASTIC_AGENT_VARS = {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
                      "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS"}


def given_by_elastic_agent(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The variables torch elastic's agent gave this rank (os.environ by default): its place in the job and its
    rendezvous."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k in ELASTIC_AGENT_VARS or k.startswith("TORCHELASTIC_")}


def cpu_threads_per_rank(environ: Mapping[str, str] = os.environ) -> int:
    """The CPU threads one rank may run, the cores it has to itself: a user's OMP_NUM_THREADS stands; else the
    CPUs Slurm allotted this task (SLURM_CPUS_PER_TASK; under task/none nothing binds the task to them, so
    the affinity mask still shows every core of the host), or this process's cores, shared by the ranks our
    launcher forked from it. Measured: two ranks of 2 threads on 2 cores, 45 CPU-s and 32 s for the same 40
    steps that one thread each does in 16 CPU-s and 21 s (OpenMP threads spin-wait on a taken core)."""
    given = environ.get("OMP_NUM_THREADS", "").split(",")[0]
    if given.isdigit() and int(given) > 0:
        return int(given)
    allotted = environ.get("SLURM_CPUS_PER_TASK", "")
    cores = int(allotted) if allotted.isdigit() and int(allotted) > 0 else usable_cores()
    env = rank_env(environ)
    sharing = env.local_world_size if env.elastic or not env.slurm_step else 1   # an srun task is one rank
    return max(1, cores // max(1, sharing))


def export_slurm_env() -> None:
    """Inside a Slurm step with several tasks: RANK, WORLD_SIZE, MASTER_ADDR... from Slurm's variables."""
    if "RANK" in os.environ or rank_env().slurm_tasks <= 1:
        return
    from submitit.helpers import TorchDistributedEnvironment

    # submitit finds Slurm by this variable, which only its own sbatch scripts export: a plain `srun python
    # -m ablate` (or an sbatch script of the user's) is a Slurm job all the same
    os.environ.setdefault("SUBMITIT_EXECUTOR", "slurm")
    if os.environ.get("SLURM_JOB_ID", "").isdigit():
        os.environ.setdefault("MASTER_PORT", str(slurm_master_port(os.environ["SLURM_JOB_ID"])))
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)   # (its MASTER_PORT is ours)


# Rank 0's rendezvous port in a Slurm job: below Linux's default ephemeral range (32768-60999,
# /proc/sys/net/ipv4/ip_local_port_range), where the kernel never gives a port to another process's outgoing
# connection. submitit's own pick (20000-60000, seeded by the job id) lands in that range 7 times in 10; on a
# node busy with connections it found its port taken (EADDRINUSE, 2026-12-03) and the job's other rank then
# waited for the store until the time limit. Every task of a job computes the same port; jobs that share a
# node have different ids, so consecutive ids get different ports. A MASTER_PORT the user set stands.
SLURM_PORTS = range(20000, 32768)


def slurm_master_port(job_id: str) -> int:
    return SLURM_PORTS[int(job_id) % len(SLURM_PORTS)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# what a world of one sets for itself (and takes back at teardown): the variables every launcher gives
# its ranks. DeepSpeed asserts LOCAL_RANK even for one process (deepspeed/runtime/engine.py,
# _do_args_sanity_check), and gloo's env:// rendezvous reads MASTER_ADDR/PORT.
_SET_FOR_ONE: List[str] = []


def be_a_world_of_one() -> None:
    values = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for key, value in values.items():
        if key not in os.environ:
            os.environ[key] = value
            _SET_FOR_ONE.append(key)


def local_rank_is(rank: int) -> None:
    """A process ablate starts as rank `rank` of a group on this host (calibrate's gloo steps): the variable
    DeepSpeed asserts, as a launcher sets it."""
    os.environ["LOCAL_RANK"] = str(rank)


def forget_world_of_one() -> None:
    """A run inside a longer-lived process (tests, a caller) leaves no rank variable behind."""
    while _SET_FOR_ONE:
        os.environ.pop(_SET_FOR_ONE.pop(), None)


def slurm_job(environ: Mapping[str, str] = os.environ) -> Optional[Dict[str, object]]:
    """summary.json's `slurm`: the job, the job step and the nodes this run ran in (None outside Slurm)."""
    if "SLURM_JOB_ID" not in environ:
        return None
    return {"job_id": environ["SLURM_JOB_ID"], "step_id": environ.get("SLURM_STEP_ID"),
            "nodelist": environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")}
