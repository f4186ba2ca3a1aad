"""conf/logger -> where figures go: metrics.jsonl and summary.json always, W&B when chosen.

Only rank 0 writes. W&B runs offline (files under <run dir>/wandb) when there are no credentials;
a W&B failure never fails the run: it is noted and the local files carry on.
"""
from __future__ import annotations

import json
import netrc
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional
from urllib.parse import urlparse

from ablate.config import LoggerConfig, record

# logger=<name> -> whether it writes to W&B besides the local files: the one place the choice is decoded
REGISTRY = {"wandb": True, "none": False}


def uses_wandb(cfg: LoggerConfig) -> bool:
    return REGISTRY[cfg.name]


def _has_wandb_credentials() -> bool:
    """Logged in the way the installed wandb knows it: an API key in the environment, or a netrc entry for
    the host wandb is set to talk to (its base_url: WANDB_BASE_URL or its settings, not always api.wandb.ai)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        import wandb

        host = urlparse(wandb.Settings().base_url).hostname or "api.wandb.ai"
    except Exception:
        host = "api.wandb.ai"
    try:
        return netrc.netrc().authenticators(host) is not None
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


def _knob_value(config: Dict, dotted: str):
    node = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _level(config: Dict, knob: str):
    """A factor's level: a config group's chosen `name`, else the dotted key's value."""
    node = _knob_value(config, knob)
    return node.get("name") if isinstance(node, dict) else node


def run_identity(config: Dict, run_dir: Path) -> Dict[str, object]:
    """W&B display name, extra tags and group: from the knob's value for a sweep's run (`c3_no_sync
    parallel.no_sync=true r1`, tags arm:treatment, repeat:1); from the run dir (Hydra's override_dirname)
    otherwise (Hydra's override_dirname in a multirun; __main__ sets a multirun's group)."""
    sweep = config.get("sweep") or {}
    if sweep.get("knob"):
        value = _knob_value(config, sweep["knob"])
        treatment = sweep.get("treatment")   # one arm, or several (sweeps/layouts.yaml)
        arm = ("baseline" if value == sweep.get("baseline") else "treatment"
               if value in (treatment if isinstance(treatment, list) else [treatment]) else str(value))
        repeat = sweep.get("repeat")
        name = f"{sweep['name']} {sweep['knob']}={value}" + (f" r{repeat}" if repeat is not None else "")
        tags = [f"sweep:{sweep['name']}", f"arm:{arm}"] + ([f"repeat:{repeat}"] if repeat is not None else [])
        return {"name": name, "tags": tags, "group": sweep["name"]}
    if sweep.get("design") == "stack":   # a stack: its arm names the step
        repeat = sweep.get("repeat")
        return {"name": f"{sweep['name']} {sweep.get('arm')}" + (f" r{repeat}" if repeat is not None else ""),
                "tags": [f"sweep:{sweep['name']}", f"arm:{sweep.get('arm')}"]
                + ([f"repeat:{repeat}"] if repeat is not None else []), "group": sweep["name"]}
    if sweep.get("factors"):   # a factorial sweep: the run's level of every factor
        repeat = sweep.get("repeat")
        levels = " ".join(f"{k}={_level(config, k)}" for k in sweep["factors"])
        return {"name": f"{sweep['name']} {levels}" + (f" r{repeat}" if repeat is not None else ""),
                "tags": [f"sweep:{sweep['name']}"] + ([f"repeat:{repeat}"] if repeat is not None else []),
                "group": sweep["name"]}
    return {"name": run_dir.name, "tags": [], "group": None}


# summary.json figures kept by key (the layout's, the optimizer's): W&B's summary gets them as <key>/<sub>/...
NESTED_FIGURES = ("mesh", "comm_bytes_by_dim", "optimizer", "predicted")


def flattened(node: Dict, prefix: str) -> Dict[str, object]:
    out: Dict[str, object] = {}
    for k, v in node.items():
        if isinstance(v, dict):
            out.update(flattened(v, f"{prefix}{k}/"))
        elif isinstance(v, (int, float, str)) or v is None:
            out[f"{prefix}{k}"] = v
    return out

class Tracker:
    def __init__(self, cfg: LoggerConfig, run_dir: Path, resolved_config: Dict, choices: Dict[str, str],
                 is_main: bool, wandb_id: Optional[str] = None):
        self.cfg, self.run_dir, self.enabled = cfg, run_dir, is_main
        self.notes: Dict[str, str] = {}
        self.wandb = None
        self.group: Optional[str] = None
        self.mode: Optional[str] = None
        if not is_main:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(run_dir / "metrics.jsonl", "a")
        if uses_wandb(cfg):
            self._start_wandb(resolved_config, choices, wandb_id)

    def _start_wandb(self, config: Dict, choices: Dict[str, str], wandb_id: Optional[str]) -> None:
        mode = wandb_mode(self.cfg)
        ident = run_identity(config, self.run_dir)
        self.group = self.cfg.group or ident["group"]
        kwargs = dict(project=self.cfg.project, entity=self.cfg.entity, group=self.group, job_type=self.cfg.job_type,
                      name=ident["name"], tags=tags_from_choices(choices) + ident["tags"] + list(self.cfg.tags),
                      config=config, dir=str(self.run_dir), id=wandb_id, resume="allow" if wandb_id else None)
        try:
            self.wandb = self._init(kwargs, mode)
        except Exception as e:
            if mode != "online":   # W&B must never take the run down: the local files still hold everything
                self._disable(e)
                return
            first = (str(e).strip().splitlines() or [""])[0][:160]
            print(f"ablate: warning: W&B online did not start within {self.cfg.init_timeout_s:.0f} s "
                  f"({type(e).__name__}: {first}); logging offline: `wandb sync {self.run_dir}/wandb` later",
                  file=sys.stderr)
            self.notes["wandb"] = "online W&B did not start; logged offline (sync later)"
            try:
                self.wandb = self._init(kwargs, "offline")
            except Exception as again:
                self._disable(again)

    def _init(self, kwargs: Dict, mode: str):
        import wandb

        run = wandb.init(**kwargs, mode=mode, settings=wandb.Settings(
            console="off", quiet=True, silent=True, x_disable_stats=True, init_timeout=self.cfg.init_timeout_s))
        run.define_metric("step")
        run.define_metric("*", step_metric="step")
        self.mode = mode
        return run

    def _disable(self, e: Exception) -> None:
        self.notes["wandb"] = f"W&B disabled for this run: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        print(f"ablate: warning: {self.notes['wandb']}", file=sys.stderr)
        self.wandb = None

    @property
    def wandb_id(self) -> Optional[str]:
        return self.wandb.id if self.wandb is not None else None

    def log(self, row: Dict[str, object]) -> None:
        if not self.enabled:
            return
        clean = {k: record.jsonable(v) for k, v in row.items()}
        self.jsonl.write(json.dumps(clean) + "\n")
        self.jsonl.flush()
        if self.wandb is not None:
            self._guarded("log", lambda: self.wandb.log({k: v for k, v in row.items() if isinstance(v, (int, float))}))

    def add_file(self, path: Path, kind: str) -> None:
        """A file of the run (a profiler trace) as a W&B artifact, when W&B is on."""
        if self.wandb is None or not Path(path).exists():
            return

        def upload():
            import wandb

            artifact = wandb.Artifact(f"{kind}-{self.wandb.id}-{Path(path).name.split('.')[0]}", type=kind)
            artifact.add_file(str(path))
            self.wandb.log_artifact(artifact)

        self._guarded(f"{kind} artifact", upload)

    def _guarded(self, what: str, call) -> None:
        """W&B is best-effort: a failing call (its helper process gone, say) disables it with one warning;
        the local files carry on."""
        try:
            call()
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else ""
            self.notes["wandb"] = f"W&B stopped at {what}: {type(e).__name__}: {first}"
            print(f"ablate: warning: {self.notes['wandb']}; local files carry on", file=sys.stderr)
            self.wandb = None
            self._teardown_quietly()

    @staticmethod
    def _teardown_quietly() -> None:
        """Free W&B's service connection now: its own exit hook would print a traceback about the lost
        helper process (wandb unregisters that hook before it tries to reach the helper)."""
        try:
            import wandb

            wandb.teardown(exit_code=1)
        except Exception:
            pass

    def finish(self, summary: Dict[str, object], kind: str = "run", exit_code: int = 0) -> None:
        if not self.enabled:
            return
        summary.setdefault("notes", {}).update(self.notes)
        if self.wandb is not None:
            summary["wandb"] = {"id": self.wandb.id, "mode": self.mode, "group": self.group,
                                "name": self.wandb.name, "dir": str(Path(self.wandb.dir).parent),
                                "url": self.wandb.url if self.mode == "online" else None}
            flat = {k: v for k, v in summary.items() if isinstance(v, (int, float, str)) or v is None}
            for key in NESTED_FIGURES:
                flat.update(flattened(summary.get(key) or {}, f"{key}/"))
            self._guarded("summary", lambda: self.wandb.summary.update(flat))
        record.write(self.run_dir, summary, kind)
        self.close(exit_code)

    def close(self, exit_code: int = 0) -> None:
        if self.enabled and not self.jsonl.closed:
            try:
                self.jsonl.close()
            except OSError:   # a full disk: the rows that could not be written were said (train/loop.py)
                pass
        if self.wandb is not None:
            self._guarded("finish", lambda: self.wandb.finish(exit_code=exit_code))
            self.wandb = None
