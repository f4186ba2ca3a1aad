"""Rank discovery (torchrun / our local launcher / srun / submitit), process-group init, clean exit."""
from __future__ import annotations

import os
from dataclasses import dataclass

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


def _export_slurm_env() -> None:
    """Inside a Slurm step with several tasks: RANK, WORLD_SIZE, MASTER_ADDR... from Slurm's variables."""
    if "RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    from submitit.helpers import TorchDistributedEnvironment

    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device=cuda: no CUDA device is visible here; valid choices: auto, cpu")
    if choice in ("auto", "cuda") and torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def setup(device_choice: str) -> DistEnv:
    """Join the job's process group if this process is one of several ranks."""
    _export_slurm_env()
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = pick_device(device_choice, local_rank)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world,
                                device_id=device if device.type == "cuda" else None)
    return DistEnv(rank, world, local_rank, device)


def teardown() -> None:
    """Barrier first: without it gloo aborts at exit about one run in seven."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_gather_object(obj, env: DistEnv):
    if env.world_size == 1:
        return [obj]
    out = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out
