"""hydra/launcher=ablate_fresh (ablate's default for -m): every job of a multirun in a fresh process.

PyTorch reads the allocator settings once per process, and the allocator/NCCL groups set process
environment variables: jobs run one after another in one process (Hydra's basic launcher) would carry the
first job's allocator, CUDA cache and environment into the next. Here each job is `python -m ablate
<its overrides> hydra.mode=RUN hydra.run.dir=<its sweep subdir>`, so every arm starts clean. The parent
validated the whole grid first; the first failing job stops the sweep with its own one-line error. The same
command again finishes an interrupted grid: a job that finished is kept, one that was stopped continues from its
checkpoint (train.resume), the others run.
With launcher=slurm each job only prepares its run dir and what it would submit; the sweep then goes to
Slurm as one job array (ablate/launcher/array.py).
(No `from __future__ import annotations` here: Hydra loads plugins without registering the module, and
dataclasses with string annotations look the module up.)
"""

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from ablate.config import RunStopped, exit_code_of, record
from ablate.launcher import group

log = logging.getLogger(__name__)


@dataclass
class FreshProcessLauncherConf:
    _target_: str = "hydra_plugins.ablate_launcher.fresh_process.FreshProcessLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="ablate_fresh", node=FreshProcessLauncherConf,
                             provider="ablate")


class FreshProcessLauncher(Launcher):
    def __init__(self) -> None:
        super().__init__()
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info(f"Launching {len(job_overrides)} jobs, each in a fresh process")
        runs: List[JobReturn] = []
        array_points: List[Path] = []
        for idx, overrides in enumerate(job_overrides, initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = sweep_config.hydra.job.num = idx
            run_dir = Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir)
            earlier = earlier_call(run_dir)
            if earlier == "finished":   # the same command again: what finished is kept, never run twice
                log.info(f"\t#{idx} finished in an earlier call: kept ({run_dir})")
                status, value = job_result(0, run_dir, sweep_config)
                runs.append(JobReturn(overrides=list(overrides), cfg=sweep_config, hydra_cfg=sweep_config,
                                      working_dir=str(run_dir), task_name=str(sweep_config.hydra.job.name),
                                      status=status, _return_value=value))
                continue
            # the directory quoted: Hydra's override_dirname holds '=' and ','
            command = [sys.executable, "-m", "ablate", *config_dirs(self.config), *overrides, "hydra.mode=RUN",
                       f"hydra.run.dir='{run_dir}'", *call_group(sweep_config),
                       *([f"train.resume='{run_dir}'"] if earlier == "stopped" else [])]
            env = {**os.environ, "ABLATE_PREFLIGHT_DONE": "1"}
            if sweep_config.launcher.name == "slurm":   # this point becomes a task of the sweep's job array
                array_points.append(Path(str(sweep_config.hydra.sweep.dir)) / ".slurm_array" / f"{idx}.pkl")
                env["ABLATE_SLURM_ARRAY"] = str(array_points[-1])
            code = run_job(command, env, run_dir)
            basic = str(self.config.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper")
            if code != 0 and basic:   # the job printed its own error line; stop as Hydra's basic launcher does
                raise SystemExit(code)
            status, value = job_result(code, run_dir, sweep_config)
            runs.append(JobReturn(overrides=list(overrides), cfg=sweep_config, hydra_cfg=sweep_config,
                                  working_dir=str(run_dir), task_name=str(sweep_config.hydra.job.name),
                                  status=status, _return_value=value))
        if array_points:
            submit_array(array_points, Path(str(self.config.hydra.sweep.dir)))
        return runs


def earlier_call(run_dir: Path) -> Optional[str]:
    """What an earlier call of the same grid left in this job's folder: "finished" (its summary.json), "stopped"
    (a checkpoint to continue from: Ctrl-C, SIGTERM), or nothing (None); a run stopped before its first
    checkpoint is set aside as <dir>.incomplete-N (kept for a look; the report skips it) and runs again."""
    from ablate.train import guards

    if record.exists(run_dir):
        return "finished"
    if any((run_dir / d / "meta.pt").is_file() for d in ("checkpoint", "checkpoint.prev")):
        return "stopped"
    if guards.holds_a_run(run_dir):
        aside = next(run_dir.with_name(f"{run_dir.name}.incomplete-{k}") for k in range(1, 1000)
                     if not run_dir.with_name(f"{run_dir.name}.incomplete-{k}").exists())
        os.replace(run_dir, aside)
        log.info(f"\t{run_dir.name}: stopped before its first checkpoint in an earlier call; set aside as {aside.name}")
    return None


def run_job(command: List[str], env, run_dir: Path) -> int:
    """One job in its own process group (ablate/launcher/group.py): Ctrl-C or SIGTERM to this parent is passed
    on, the job checkpoints and ends, and the call stops in one line (exit 128 + the signal), never killing
    the job mid-checkpoint (subprocess.call would) nor leaving it orphaned."""
    group.raise_on_sigterm()
    then = (f"the jobs finished so far are kept, and the same command finishes the grid (this job continues with "
            f"train.resume={run_dir})")
    try:
        return group.run(command, env, then=then, on_terminal=True).returncode
    except (RunStopped, KeyboardInterrupt, group.Interrupted) as e:   # (the last two: between jobs)
        stop = e if isinstance(e, RunStopped) else group.stopped_between(e, then)
        raise SystemExit(exit_code_of(stop, "ablate")) from None


def job_result(code: int, run_dir: Path, cfg: DictConfig):
    """(status, return value) of a finished job: its objective (`metrics.objective`, a summary.json figure),
    which a Hydra sweeper such as hydra-optuna-sweeper optimises; a failed or refused job is FAILED with its
    reason (the sweeper records the trial as failed and goes on)."""
    key = cfg.metrics.get("objective", "tokens_per_s")
    if code != 0:
        return JobStatus.FAILED, RuntimeError(f"the job exited {code} (its error line is above; {run_dir})")
    value = record.load(run_dir).figure(key) if record.exists(run_dir) else None   # none: a Slurm point prepared
    return JobStatus.COMPLETED, float(value) if value is not None else None


def config_dirs(cfg: DictConfig) -> List[str]:
    """The command line's `--config-dir`, for each job: Hydra keeps it as a config source, not an override."""
    out: List[str] = []
    for source in cfg.hydra.runtime.config_sources:
        if source.provider == "command-line" and source.schema == "file":
            out += ["--config-dir", str(source.path)]
    return out


def call_group(cfg: DictConfig) -> List[str]:
    """One W&B group per call (unless logger.group is given): `<sweep name>-<sweep folder>` for a sweeps/
    file, `multirun-<sweep folder>` for an ad-hoc grid; the sweep's name stays a tag (logger.py)."""
    if cfg.logger.get("group") is not None:
        return []
    prefix = (cfg.get("sweep") or {}).get("name") or "multirun"
    return [f"logger.group='{prefix}-{Path(str(cfg.hydra.sweep.dir)).name}'"]


def submit_array(points: List[Path], sweep_dir: Path) -> None:
    """The sweep's points as one Slurm job array; this plugin is an edge of the -m command: ablate's error
    becomes its line and exit code here."""
    from ablate.config import AblateError, exit_code_of
    from ablate.launcher import array as slurm_array

    try:
        slurm_array.submit(points, sweep_dir)
    except AblateError as e:
        raise SystemExit(exit_code_of(e)) from None
