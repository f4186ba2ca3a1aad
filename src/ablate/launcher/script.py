"""The dry run's sbatch script (`launcher=slurm launcher.dry_run=true`): one a user can submit as written.

`sbatch <run dir>/sbatch.sh` runs the same command inside the allocation: every task is one rank
(`srun python -m ablate <the same overrides>`: a task inside a Slurm job step trains where it is,
launcher/slurm_launch.py). What it carries:
- logs in <run dir>/slurm/, made when the script is written (Slurm does not create an --output folder);
- `--requeue`, `--open-mode=append` and `--signal=USR2@<launcher.signal_delay_s>`: the loop checkpoints on
  the warning and the job is requeued; a requeued attempt (SLURM_RESTART_COUNT > 0) resumes from the run
  dir's checkpoint (train.resume);
- `launcher.setup` lines first (e.g. `source /path/.venv/bin/activate`), then the `python` they put on the
  PATH; without them, the environment the script was written from is put first on the PATH (its bin folder);
- `launcher.python` (a path), when given, is the interpreter every task runs;
- from any directory, by whoever submits it: `--chdir` is the directory it was written from, every path the
  command names is absolute (config dirs, data, resume: config/command_line.py absolute_paths), and
  PYTHONPATH holds the directories the user's modules (model, optimizer, collectors) were imported from, then
  the writer's PYTHONPATH, each said in a comment (the same whichever directory it is written from);
- the allocator/NCCL variables as `export` lines, as submitit's own script has them.
"""
from __future__ import annotations

import os
import shlex
import socket
import sys
from pathlib import Path
from typing import Dict, List

from ablate.config import AblateConfig, LauncherConfig
from ablate.config.command_line import absolute_paths
from ablate.config.fields import import_root

# keys of the submitting command that the script sets itself
OWN_KEYS = ("launcher.dry_run", "launcher.wait", "hydra.run.dir", "train.resume")


def directives(cfg: AblateConfig, run_dir: Path, warn_batch_shell: bool = False) -> List[str]:
    """The job's request. The time-limit warning goes to every task (each rank checkpoints), or with
    `warn_batch_shell` to the batch script alone (a sweep's driver, which passes it on: sweeps/allocation.py)."""
    lc = cfg.launcher
    out = {"job-name": f"ablate-{run_dir.name}", "nodes": lc.nodes, "ntasks-per-node": lc.nproc_per_node,
           "cpus-per-task": lc.cpus_per_task, "time": lc.timeout_min,
           "output": run_dir / "slurm" / "%j.out", "error": run_dir / "slurm" / "%j.err",
           "signal": f"{'B:' if warn_batch_shell else ''}USR2@{lc.signal_delay_s}", "open-mode": "append"}
    if lc.gpus_per_node:
        out["gpus-per-node"] = lc.gpus_per_node
    if lc.mem_gb:
        out["mem"] = f"{lc.mem_gb}G"
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(lc, key):
            out[key] = getattr(lc, key)
    out.update({k.replace("_", "-"): v for k, v in lc.additional_parameters.items()})
    return [f"#SBATCH --{k}={v}" for k, v in out.items()] + ["#SBATCH --requeue"]


def command(overrides: List[str], run_dir: Path, python: str = "python") -> str:
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in OWN_KEYS]
    args = [*kept, "launcher.dry_run=false", "launcher.wait=false", f"hydra.run.dir={run_dir}"]
    return f"srun --unbuffered {shlex.quote(python)} -u -m ablate " + " ".join(shlex.quote(a) for a in args) \
        + " $RESUME"


STEP_GRACE_S = 30   # a job step past its timeout: from SIGTERM (srun stops its tasks) to SIGKILL


def job_step(lc: LauncherConfig, name: str) -> List[str]:
    """`srun` for one run of a sweep inside the sweep's allocation: its own nodes and one task per rank
    (each task trains where it is: launcher/slurm_launch.py); one failing task ends the step."""
    gpus = [f"--gpus-per-node={lc.gpus_per_node}"] if lc.gpus_per_node else []
    return ["srun", f"--job-name={name}", f"--nodes={lc.nodes}", f"--ntasks-per-node={lc.nproc_per_node}",
            f"--cpus-per-task={lc.cpus_per_task}", *gpus, "--kill-on-bad-exit=1", "--unbuffered"]


def sweep_text(cfg: AblateConfig, root: Path, driver: List[str], prog: str = "ablate.sweeps",
               noun: str = "sweep") -> str:
    """A sweep's (or a tune's) one allocation (sweeps/allocation.py): the nodes of its largest run, the driver
    as the batch shell itself (exec: the time-limit warning reaches it), requeued on preemption."""
    root = root.resolve()
    lines = ["#!/bin/bash", f"# written by {prog}: one allocation for the {noun} in {root}; submit it as it is: "
             f"sbatch {root}/{noun}.sbatch",
             *directives(cfg, root, warn_batch_shell=True), "set -e", *cfg.launcher.setup,
             "exec " + " ".join(shlex.quote(a) for a in driver)]
    return "\n".join(lines) + "\n"


def text(cfg: AblateConfig, run_dir: Path, applied_env: Dict[str, Dict], overrides: List[str]) -> str:
    run_dir, here = run_dir.resolve(), Path.cwd()
    exports = [f"export {k}={shlex.quote(str(v))}" for record in applied_env.values()
               for k, v in record.get("env", {}).items()]
    lines = ["#!/bin/bash",
             f"# written by ablate (launcher.dry_run=true) in {here} on {socket.gethostname()}; submit it as it is, "
             f"from any directory: sbatch {run_dir}/sbatch.sh",
             *directives(cfg, run_dir), f"#SBATCH --chdir={here}", "set -e", *environment(cfg), *exports,
             "# a requeued attempt continues from this run's checkpoint",
             f'RESUME=""; [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ] && RESUME={shlex.quote(f"train.resume={run_dir}")}',
             command(absolute_paths(overrides, here), run_dir, cfg.launcher.python or "python")]
    return "\n".join(lines) + "\n"


def user_targets(cfg: AblateConfig) -> List[str]:
    """The `_target_`s of the user's own code a run imports: its model, its optimizer, its collectors."""
    model, optim = getattr(cfg.model, "target", None), getattr(cfg.optim, "target", None)
    optim = optim or getattr(cfg.optim, "_target_", None)
    collectors = [c.get("_target_") for c in cfg.metrics.collectors if isinstance(c, dict)]
    return [t for t in (model, optim, *collectors) if t]


def module_paths(cfg: AblateConfig) -> List[str]:
    """The job's PYTHONPATH: where the user's modules were imported from here, then the writer's PYTHONPATH."""
    roots = [str(root) for root in map(import_root, user_targets(cfg)) if root is not None]
    given = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return list(dict.fromkeys([*roots, *given]))


def environment(cfg: AblateConfig) -> List[str]:
    """The Python the command runs with and where it finds a user's modules: `launcher.python` when given (named in
    the command), else launcher.setup's lines, else the environment the script was written from; PYTHONPATH."""
    python = [] if cfg.launcher.python else \
        ["# the Python environment this script was written from (launcher.setup lines replace it)",
         f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:\"$PATH\""]
    paths = module_paths(cfg)
    modules = ["# your model, optimizer or collector modules: the directories they were imported from, and the "
               "writer's PYTHONPATH", f"export PYTHONPATH={shlex.quote(os.pathsep.join(paths))}"
               '${PYTHONPATH:+:$PYTHONPATH}'] if paths else []
    return [*cfg.launcher.setup, *(python if not cfg.launcher.setup else []), *modules]


def write(cfg: AblateConfig, run_dir: Path, applied_env: Dict[str, Dict], overrides: List[str]) -> Path:
    (run_dir / "slurm").mkdir(parents=True, exist_ok=True)   # Slurm does not create its --output folder
    path = run_dir / "sbatch.sh"
    path.write_text(text(cfg, run_dir, applied_env, overrides))
    return path
