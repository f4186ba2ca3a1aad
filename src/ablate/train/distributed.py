"""The process group (gloo / NCCL) of the ranks ranks.py describes: device, init, clean exit, placement."""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Dict, List

import torch
import torch.distributed as dist

from ablate.config import ConfigError
from ablate.train.ranks import (
    be_a_world_of_one,
    cpu_threads_per_rank,
    export_slurm_env,
    forget_world_of_one,
    rank_env,
)


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


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


def share_cpu_threads() -> None:
    """Ranks on one machine split its cores (as torchrun's OMP_NUM_THREADS=1 default intends), and a Slurm task
    keeps to the CPUs it was given (ranks.cpu_threads_per_rank): each rank running as many threads as the host
    has cores, spinning threads collide and step times swing 4x. Set here even when the user gave
    OMP_NUM_THREADS: a forked rank's OpenMP read the fork server's at its start."""
    torch.set_num_threads(cpu_threads_per_rank())


def setup(device_choice: str, need_group: bool = False) -> DistEnv:
    """Join the job's process group: always with several ranks, and with one when the strategy needs
    a group anyway (ddp/fsdp2/zero on a single process, which then gets a launcher's variables)."""
    export_slurm_env()
    ranks = rank_env()
    rank, world, local_rank = ranks.rank, ranks.world_size, ranks.local_rank
    device = pick_device(device_choice, local_rank)
    if device.type == "cpu" and (world > 1 or ranks.slurm_step is not None):
        share_cpu_threads()
    if world == 1 and need_group:
        be_a_world_of_one()
    if (world > 1 or need_group) and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world,
                                device_id=device if device.type == "cuda" else None)
    return DistEnv(rank, world, local_rank, device)


def barrier() -> None:
    """Every rank of the run's group waits here (nothing to wait for on one)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def teardown(clean: bool = True) -> None:
    """Barrier first: without it gloo aborts at exit about one run in seven. After an error there is
    no barrier (the other ranks may never reach it): the process leaves, and the launcher stops them."""
    if dist.is_available() and dist.is_initialized():
        if clean:
            dist.barrier()
            dist.destroy_process_group()
    forget_world_of_one()


def place(env: DistEnv) -> Dict[str, object]:
    """Where this rank runs: its host, the node's index in the job (Slurm's SLURM_NODEID, torchrun's
    GROUP_RANK) and its rank on that node."""
    return {"rank": env.rank, "host": socket.gethostname(), "node_rank": rank_env().node_rank,
            "local_rank": env.local_rank}


def layout(places: List[Dict[str, object]]) -> Dict[str, object]:
    """summary.json's `hosts` (one per node, in node order) and the rank layout: which ranks ran where."""
    by_host: Dict[str, List[int]] = {}
    for p in sorted(places, key=lambda p: (p["node_rank"], p["local_rank"])):
        by_host.setdefault(str(p["host"]), []).append(int(p["rank"]))
    return {"hosts": list(by_host), "nodes": len(by_host), "ranks_by_host": by_host}
