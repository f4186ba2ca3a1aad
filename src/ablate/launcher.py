"""conf/launcher -> where the ranks run: in this process, as local processes, or as a Slurm job."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

import yaml

from ablate import allocator, nccl
from ablate.config import AblateConfig


def apply_environment(cfg: AblateConfig) -> Dict[str, object]:
    """The allocator and NCCL variables, set before any CUDA call or process group; ranks inherit them."""
    return {"allocator": allocator.apply(cfg.allocator), "nccl": nccl.apply(cfg.nccl)}


def launch(cfg: AblateConfig, resolved: Dict, run_dir: Path, choices: Dict[str, str]) -> Optional[Dict]:
    from ablate import train

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({k: v for k, v in resolved.items() if k != "hydra"},
                                                        sort_keys=False))
    applied = apply_environment(cfg)
    return train.run(cfg, run_dir, resolved, choices, applied)
