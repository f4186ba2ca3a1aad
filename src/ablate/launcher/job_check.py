"""launcher=slurm: the job checked before it queues, as a local run is, in the environment it will have.

Before the sbatch script is written or submitted (dry run or not), each a one-line refusal (exit 2):
- the layout: every divisibility (tp, pp and the model's blocks, batch and micro-batches) and the strategy on the
  devices the job asks for (parallel.check, model/stages.py);
- the model built on the meta device (model/facts.py), importing the user's modules as the script will (its
  PYTHONPATH holds the directories they came from: script.py), and the data checked against it;
- the planned peak per GPU (model/peak.py) against `launcher.hardware`'s memory: over it, the overshoot and the
  best single change that fits (predict/fitting.py), unless `launcher.allow_unfit=true`. Without
  launcher.hardware no GPU is guessed: the dry run's lines say the peak went unchecked;
- the job's Python: this interpreter, or, where `launcher.python` or `launcher.setup` name another, the script's
  own environment lines run here in its directory, then that Python builds the model (probe.py). A torch built
  without CUDA while the job asks for GPUs: a dry run says so beside the script's path; a submission is refused.
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from ablate import data, hardware, parallel
from ablate.config import AblateConfig, ConfigError
from ablate.launcher import script
from ablate.model import stages
from ablate.model.facts import measure
from ablate.model.peak import plan_peak
from ablate.predict.fitting import best_change
from ablate.units import fmt

PROBE_TIMEOUT_S = 180   # the script's setup lines and a torch import on a login node


@dataclass(frozen=True)
class Interpreter:
    """The job's Python, as asked: its path, torch version and CUDA build (None: a CPU-only torch); `unchecked`:
    why it could not be asked here (its setup lines failed on this host)."""
    python: str
    torch: Optional[str] = None
    cuda: Optional[str] = None
    unchecked: Optional[str] = None


def check(cfg: AblateConfig) -> None:
    """Everything the job would fail on after its queue wait, refused in one line now."""
    gpus = cfg.launcher.gpus_per_node > 0
    parallel.check(cfg, has_cuda=gpus)
    stages.check(cfg)
    facts = measure(cfg)
    data.check(cfg.data, cfg.train.seq_len, facts.vocab_size, cfg.train.batch_size)
    check_fits(cfg, facts)
    job = interpreter(cfg)
    if gpus and job.torch and not job.cuda and not cfg.launcher.dry_run:
        raise ConfigError(no_cuda(cfg, job))


def notes(cfg: AblateConfig) -> List[str]:
    """What a dry run says beside its script's path: what was left unchecked, and a Python that cannot use GPUs."""
    if cfg.launcher.gpus_per_node == 0:
        return []
    job, out = interpreter(cfg), []
    if job.unchecked:
        out.append(f"the job's Python was not checked here: {job.unchecked}")
    elif not job.cuda:
        out.append(no_cuda(cfg, job))
    if not cfg.launcher.hardware:
        out.append(f"its planned peak was not checked against a GPU: give launcher.hardware=NAME "
                   f"({', '.join(hardware.choices())}, or a file)")
    return out


def no_cuda(cfg: AblateConfig, job: Interpreter) -> str:
    gpus = cfg.launcher.gpus_per_node
    return (f"the job's Python ({job.python}) has torch {job.torch} built without CUDA, and the job asks for {gpus} "
            f"GPU{'s' if gpus > 1 else ''} per node; point the script at a CUDA build with launcher.python=PATH (or "
            "launcher.setup lines that activate one)")


def check_fits(cfg: AblateConfig, facts) -> None:
    """The planned peak per GPU against launcher.hardware's memory (nothing to check without it)."""
    lc = cfg.launcher
    if not lc.hardware:
        return
    hw = hardware.named(lc.hardware, "launcher.hardware=")
    peak = plan_peak(cfg, facts, parallel.layout_of(cfg))
    if peak is None or peak.bytes <= hw.memory_bytes or lc.allow_unfit:
        return
    best = best_change(cfg, hw)
    fix = (f"what would fit: {best['override']} (planned peak {fmt('bytes', best['peak_bytes'])}"
           + (f", {fmt('tokens_per_s', best['tokens_per_s'])} predicted" if best["tokens_per_s"] else "") + ")") \
        if best else "no single change of tp, pp, checkpointing or bf16 all-gathers fits (more nodes, a smaller batch)"
    raise ConfigError(f"launcher.hardware={hw.name}: the planned peak per GPU is {fmt('bytes', peak.bytes)}, "
                      f"{fmt('bytes', peak.bytes - hw.memory_bytes)} over its {fmt('bytes', hw.memory_bytes)} "
                      f"(ablate.plan); {fix}; or launcher.allow_unfit=true to submit it anyway")


_ASKED: Dict[str, Interpreter] = {}   # the job's Python, asked once per environment in a process (a -m grid's points)


def interpreter(cfg: AblateConfig) -> Interpreter:
    """This interpreter when the script runs it (no launcher.python, no setup lines); else the one the script's own
    environment lines give, asked in a shell here (refused in one line when it cannot build the model)."""
    lc = cfg.launcher
    if not lc.python and not lc.setup:
        import torch

        return Interpreter(sys.executable, torch.__version__, torch.version.cuda)
    lines = script.environment(cfg)
    key = repr((lines, lc.python, os.getcwd(), cfg.model))
    if key not in _ASKED:
        _ASKED[key] = ask(cfg, lines)
    return _ASKED[key]


READY = "ablate-probe: setup done"


def ask(cfg: AblateConfig, lines: List[str]) -> Interpreter:
    python = cfg.launcher.python or "python"
    shell = "\n".join(["set -e", *lines, f"echo '{READY}'", f"exec {python} -m ablate.launcher.probe"])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}   # the script sets its own
    try:
        done = subprocess.run(["bash", "-c", shell], input=pickle.dumps(cfg.model), capture_output=True,
                              cwd=Path.cwd(), env=env, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Interpreter(python, unchecked=f"its environment lines did not finish in {PROBE_TIMEOUT_S} s")
    out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    said = (err.strip().splitlines() or ["no output"])[-1]
    if READY not in out:
        return Interpreter(python, unchecked=f"launcher.setup failed on this host ({said})")
    answer = next((json.loads(ln) for ln in reversed(out.splitlines()) if ln.startswith("{")), None)
    if answer is None:
        raise ConfigError(f"the job's Python ({python}) cannot run ablate: {said}; point the script at an environment "
                          "with ablate and torch installed (launcher.python=PATH or launcher.setup)")
    if answer.get("error"):
        raise ConfigError(f"in the job's environment ({answer['python']}): {answer['error']}")
    return Interpreter(answer["python"], answer.get("torch"), answer.get("cuda"))
