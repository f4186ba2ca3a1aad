"""The rank environment (torchrun / our local launcher / srun / submitit), process-group init, clean exit.

`rank_env()` is the one reader of the variables a launcher gives its ranks (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK) and of Slurm's (SLURM_*); every other module asks it.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

import torch
import torch.distributed as dist

from ablate.config import ConfigError


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


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
                   submitit="SUBMITIT_EXECUTOR" in environ, elastic="TORCHELASTIC_RUN_ID" in environ)


def _export_slurm_env() -> None:
    """Inside a Slurm step with several tasks: RANK, WORLD_SIZE, MASTER_ADDR... from Slurm's variables."""
    if "RANK" in os.environ or rank_env().slurm_tasks <= 1:
        return
    from submitit.helpers import TorchDistributedEnvironment

    # submitit finds Slurm by this variable, which only its own sbatch scripts export: a plain `srun python
    # -m ablate` (or an sbatch script of the user's) is a Slurm job all the same
    os.environ.setdefault("SUBMITIT_EXECUTOR", "slurm")
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def device_type(choice: str) -> str:
    """train.device (auto | cpu | cuda) on this machine: "cuda" or "cpu", or a one-line refusal."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device=cuda: no CUDA device is visible here; valid choices: auto, cpu")
    return "cuda" if choice != "cpu" and torch.cuda.is_available() else "cpu"


def check_ranks_fit_gpus(local_ranks: int, gpus: int) -> None:
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): say so before it does."""
    if local_ranks > gpus:
        raise ConfigError(f"launcher.nproc_per_node={local_ranks}: this machine has {gpus} GPU(s) and NCCL runs one "
                          f"rank per GPU; use launcher.nproc_per_node<={gpus}, or train.device=cpu (gloo)")


def pick_device(choice: str, local_rank: int) -> torch.device:
    if device_type(choice) == "cuda":
        check_ranks_fit_gpus(rank_env().local_world_size, torch.cuda.device_count())
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def share_cpu_threads() -> None:
    """Ranks on one machine split its cores (as torchrun's OMP_NUM_THREADS=1 default intends): with each
    rank running as many threads as there are cores, spinning threads collide and step times swing 4x."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // rank_env().local_world_size))


# what a world of one sets for itself (and takes back at teardown): the variables every launcher gives
# its ranks. DeepSpeed asserts LOCAL_RANK even for one process (deepspeed/runtime/engine.py,
# _do_args_sanity_check), and gloo's env:// rendezvous reads MASTER_ADDR/PORT.
_SET_FOR_ONE: List[str] = []


def _be_a_world_of_one() -> None:
    values = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    for key, value in values.items():
        if key not in os.environ:
            os.environ[key] = value
            _SET_FOR_ONE.append(key)


def setup(device_choice: str, need_group: bool = False) -> DistEnv:
    """Join the job's process group: always with several ranks, and with one when the strategy needs
    a group anyway (ddp/fsdp2/zero on a single process, which then gets a launcher's variables)."""
    _export_slurm_env()
    ranks = rank_env()
    rank, world, local_rank = ranks.rank, ranks.world_size, ranks.local_rank
    device = pick_device(device_choice, local_rank)
    if device.type == "cpu" and world > 1:
        share_cpu_threads()
    if world == 1 and need_group:
        _be_a_world_of_one()
    if (world > 1 or need_group) and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world,
                                device_id=device if device.type == "cuda" else None)
    return DistEnv(rank, world, local_rank, device)


def teardown(clean: bool = True) -> None:
    """Barrier first: without it gloo aborts at exit about one run in seven. After an error there is
    no barrier (the other ranks may never reach it): the process leaves, and the launcher stops them."""
    if dist.is_available() and dist.is_initialized():
        if clean:
            dist.barrier()
            dist.destroy_process_group()
    while _SET_FOR_ONE:    # a run inside a longer-lived process (tests, a caller) leaves no rank behind
        os.environ.pop(_SET_FOR_ONE.pop(), None)


def place(env: DistEnv) -> Dict[str, object]:
    """Where this rank runs: its host, the node's index in the job (Slurm's SLURM_NODEID, torchrun's
    GROUP_RANK) and its rank on that node."""
    return {"rank": env.rank, "host": socket.gethostname(), "node_rank": rank_env().node_rank,
            "local_rank": env.local_rank}


def slurm_job(environ: Mapping[str, str] = os.environ) -> Optional[Dict[str, object]]:
    """summary.json's `slurm`: the job, the job step and the nodes this run ran in (None outside Slurm)."""
    if "SLURM_JOB_ID" not in environ:
        return None
    return {"job_id": environ["SLURM_JOB_ID"], "step_id": environ.get("SLURM_STEP_ID"),
            "nodelist": environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")}


def layout(places: List[Dict[str, object]]) -> Dict[str, object]:
    """summary.json's `hosts` (one per node, in node order) and the rank layout: which ranks ran where."""
    by_host: Dict[str, List[int]] = {}
    for p in sorted(places, key=lambda p: (p["node_rank"], p["local_rank"])):
        by_host.setdefault(str(p["host"]), []).append(int(p["rank"]))
    return {"hosts": list(by_host), "nodes": len(by_host), "ranks_by_host": by_host}
