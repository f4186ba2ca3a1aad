"""conf/launcher -> where the ranks run: in this process, as local processes, or as a Slurm job.

launcher=local with nproc_per_node > 1 starts the ranks itself through torch's elastic launcher API
(what torchrun uses): each rank gets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR, and when one rank fails
the agent stops the others at once and the failing rank's error is shown. The same entrypoint also
runs under an external `torchrun` or `srun` (distributed.py reads their variables).
"""
from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Dict, Optional

import yaml

from ablate import allocator, nccl
from ablate.config import AblateConfig


def apply_environment(cfg: AblateConfig) -> Dict[str, object]:
    """The allocator and NCCL variables, set before any CUDA call or process group; ranks inherit them."""
    return {"allocator": allocator.apply(cfg.allocator), "nccl": nccl.apply(cfg.nccl)}


def _write_config(run_dir: Path, resolved: Dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    plain = {k: v for k, v in resolved.items() if k != "hydra"}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(plain, sort_keys=False))


def _already_a_rank() -> bool:
    """Started by torchrun, srun (several tasks) or our own launcher: train here, spawn nothing."""
    return "RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) > 1


def launch(cfg: AblateConfig, resolved: Dict, run_dir: Path, choices: Dict[str, str]) -> Optional[Dict]:
    from ablate import train

    _write_config(run_dir, resolved)
    applied = apply_environment(cfg)   # in the submitting process too: the sbatch script exports it
    if cfg.launcher.name == "slurm" and not _already_a_rank():
        from ablate import slurm

        return slurm.submit(cfg, resolved, run_dir, choices, applied)
    if cfg.launcher.nproc_per_node > 1 and not _already_a_rank():
        return spawn_local_ranks(cfg, run_dir, resolved, choices, applied)
    return train.run(cfg, run_dir, resolved, choices, applied)


def _rank_entry(cfg, run_dir, resolved, choices, applied):
    from torch.distributed.elastic.multiprocessing.errors import record

    from ablate import train

    return record(train.run)(cfg, run_dir, resolved, choices, applied)


def spawn_local_ranks(cfg: AblateConfig, run_dir: Path, resolved: Dict, choices: Dict[str, str],
                      applied: Dict) -> Optional[Dict]:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    n = cfg.launcher.nproc_per_node
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=n, run_id=f"ablate-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                          monitor_interval=0.5, start_method="spawn")
    try:
        results = elastic_launch(config, _rank_entry)(cfg, run_dir, resolved, choices, applied)
    except ChildFailedError as e:
        for rank, failure in _root_cause_first(e.failures):
            print(f"ablate: rank {rank} failed (exit code {failure.exitcode}): {_message(failure)}", file=sys.stderr)
        raise SystemExit(1) from None
    return results.get(0)


CONSEQUENCES = ("Connection closed by peer", "Connection reset", "remote worker crash", "SIGTERM", "Signals.")


def _message(failure) -> str:
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", message)
    return str(message).strip().splitlines()[-1] if str(message).strip() else f"exit code {failure.exitcode}"


def _root_cause_first(failures):
    """Earliest first (timestamps are whole seconds), and among equals the rank whose error is not just
    the consequence of a peer going away."""
    return sorted(failures.items(), key=lambda kv: (kv[1].timestamp, any(c in _message(kv[1]) for c in CONSEQUENCES), kv[0]))
