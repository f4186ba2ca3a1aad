"""conf/logger -> where figures go: metrics.jsonl and summary.json always, W&B when chosen.

Only rank 0 writes. W&B runs offline (files under <run dir>/wandb) when there are no credentials;
a W&B failure never fails the run: it is noted and the local files carry on.
"""
from __future__ import annotations

import json
import math
import netrc
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional

from ablate.config import LoggerConfig


def _has_wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode(cfg: LoggerConfig) -> str:
    if cfg.mode != "auto":
        return cfg.mode
    return os.environ.get("WANDB_MODE") or ("online" if _has_wandb_credentials() else "offline")


def tags_from_choices(choices: Dict[str, str]) -> List[str]:
    """`precision:bf16`, `parallel:zero3`, ...: W&B filters and groups by these."""
    return [f"{group}:{choice}" for group, choice in sorted(choices.items())
            if choice and not group.startswith("hydra") and "/" not in group]


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    return value


def dump_json(path: Path, data) -> None:
    """Write atomically: a crash mid-write never leaves half a file behind."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


class Tracker:
    def __init__(self, cfg: LoggerConfig, run_dir: Path, resolved_config: Dict, choices: Dict[str, str],
                 is_main: bool, wandb_id: Optional[str] = None):
        self.cfg, self.run_dir, self.enabled = cfg, run_dir, is_main
        self.notes: Dict[str, str] = {}
        self.wandb = None
        if not is_main:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(run_dir / "metrics.jsonl", "a")
        if cfg.name == "wandb":
            self._start_wandb(resolved_config, choices, wandb_id)

    def _start_wandb(self, config: Dict, choices: Dict[str, str], wandb_id: Optional[str]) -> None:
        mode = wandb_mode(self.cfg)
        try:
            import wandb

            self.wandb = wandb.init(
                project=self.cfg.project, entity=self.cfg.entity, group=self.cfg.group, job_type=self.cfg.job_type,
                tags=tags_from_choices(choices) + list(self.cfg.tags), config=config, dir=str(self.run_dir),
                mode=mode, id=wandb_id, resume="allow" if wandb_id else None,
                settings=wandb.Settings(console="off", quiet=True, x_disable_stats=True))
            self.wandb.define_metric("step")
            self.wandb.define_metric("*", step_metric="step")
        except Exception as e:   # W&B must never take the run down: the local files still hold everything
            self.notes["wandb"] = f"W&B disabled for this run: {type(e).__name__}: {e}"
            print(f"ablate: warning: {self.notes['wandb']}", file=sys.stderr)
            self.wandb = None

    @property
    def wandb_id(self) -> Optional[str]:
        return self.wandb.id if self.wandb is not None else None

    def log(self, row: Dict[str, object]) -> None:
        if not self.enabled:
            return
        clean = {k: _jsonable(v) for k, v in row.items()}
        self.jsonl.write(json.dumps(clean) + "\n")
        self.jsonl.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if isinstance(v, (int, float))})

    def finish(self, summary: Dict[str, object]) -> None:
        if not self.enabled:
            return
        summary.setdefault("notes", {}).update(self.notes)
        if self.wandb is not None:
            summary["wandb"] = {"id": self.wandb.id, "mode": wandb_mode(self.cfg),
                                "dir": str(Path(self.wandb.dir).parent), "url": self.wandb.url}
            flat = {k: v for k, v in summary.items() if isinstance(v, (int, float, str)) or v is None}
            self.wandb.summary.update(flat)
        dump_json(self.run_dir / "summary.json", {k: _jsonable(v) for k, v in summary.items()})
        self.close()

    def close(self, exit_code: int = 0) -> None:
        if self.enabled and not self.jsonl.closed:
            self.jsonl.close()
        if self.wandb is not None:
            self.wandb.finish(exit_code=exit_code)
            self.wandb = None
