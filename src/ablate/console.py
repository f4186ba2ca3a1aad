"""What a person sees in the terminal: a progress bar while training, a summary table at the end, and
ablate's own lines; libraries' chatter (DeepSpeed's FutureWarnings and op builds, compiler lines, the
profiler's USDT lines) goes to the run's log file, `<run dir>/ablate.log`, instead."""
from __future__ import annotations

import logging
import os
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ablate import units
from ablate.config.dims import in_use

console = Console(stderr=True)
LOG_FILE = "ablate.log"          # Hydra's job log (hydra.job.name=ablate) and every rank's library output
OWN_FILES = str(Path(__file__).resolve().parent)


class _OwnWarningsOnly(logging.Filter):
    """The terminal keeps warnings raised from ablate's own files (a GPU with no datasheet peak, say)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != "py.warnings" or OWN_FILES in record.getMessage()


# loggers torch gives a stderr handler of its own (torch._logging), which would bypass the run's log
TORCH_LOGGERS = ("torch", "torch.distributed", "torch.distributed.tensor", "torch._dynamo", "torch._inductor")


def route_library_logs(run_dir: Path, rank: int) -> None:
    """Python warnings and library loggers of this process into the run's log (every rank appends to it,
    lines marked with the rank); the terminal keeps ablate's own warnings."""
    logging.captureWarnings(True)
    warnings.simplefilter("once", FutureWarning)        # torch's deprecations fire at every collective
    warnings.simplefilter("once", DeprecationWarning)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)          # Hydra's console handler: libraries' INFO lines
    for name in TORCH_LOGGERS:   # torch's own stderr handlers (DTensor's redistribution warnings, once per rank)
        torch_logger = logging.getLogger(name)
        for handler in list(torch_logger.handlers):
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                torch_logger.removeHandler(handler)
        torch_logger.propagate = True            # into the run's log through the root logger
    path = str((run_dir / LOG_FILE).resolve())
    for handler in list(root.handlers):   # an earlier run of this process (tests, a caller) logs elsewhere
        if getattr(handler, "ablate_run_log", False) or getattr(handler, "baseFilename", None) == path:
            root.removeHandler(handler)
            handler.close()
    handler = logging.FileHandler(path)
    handler.ablate_run_log = True
    handler.setFormatter(logging.Formatter(f"[%(asctime)s][rank {rank}][%(name)s][%(levelname)s] %(message)s"))
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    own = logging.StreamHandler(sys.stderr)
    own.addFilter(_OwnWarningsOnly())
    own.setLevel(logging.WARNING)
    own.setFormatter(logging.Formatter("ablate: warning: %(message)s"))
    warnings_logger = logging.getLogger("py.warnings")
    warnings_logger.handlers = [own]          # not duplicated when a second run starts in this process
    warnings_logger.propagate = True          # and into the log file through the root logger


@contextmanager
def library_output_to_log(run_dir: Path) -> Iterator[None]:
    """What libraries write straight to the process's stdout/stderr (file descriptors 1 and 2: C++ and
    subprocesses included) goes to the run's log while this block runs."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    try:
        with open(run_dir / LOG_FILE, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        os.close(saved[0])
        os.close(saved[1])


class StepProgress:
    """A bar on a terminal; one line per log step when output goes to a file (CI, Slurm logs)."""

    def __init__(self, total: int, start: int, enabled: bool):
        self.enabled, self.total = enabled, total
        self.bar: Optional[Progress] = None
        if enabled and console.is_terminal:
            self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.description}"), TimeRemainingColumn(), console=console)
            self.task = self.bar.add_task("", total=total, completed=start)
            self.bar.start()

    def advance(self, step: int, row: Optional[Dict[str, object]] = None) -> None:
        if not self.enabled:
            return
        text = ""
        if row is not None:
            text = f"loss {row['loss']:.4f}"
            if row.get("tokens_per_s"):
                text += f"  {row['tokens_per_s']:,.0f} tok/s"
            if row.get("mfu") is not None:
                text += f"  MFU {units.fmt('mfu', row['mfu'])}"
        if self.bar is not None:
            self.bar.update(self.task, completed=step, description=text or None)
        elif row is not None:
            print(f"step {step}/{self.total}  {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


SUMMARY_ROWS = units.in_view("console")   # the registry of figures (units.py) says which, and how each reads


def straggler_line(s: Dict[str, object]) -> str:
    what = "work before its first collective" if s["by"] == "compute_before_comm_s" else "step time"
    return (f"straggler: rank {s['rank']} on {s['host']}, {what} x{s['slowdown']:.2f} the other ranks' "
            f"({s['seconds'] * 1e3:.1f} ms vs {s['others_s'] * 1e3:.1f} ms)")


def bubble_note(summary: Dict[str, object]) -> str:
    """The expected bubble, and whether the schedule's own cost per action dominates the measured one."""
    p = summary["pipeline"]
    note = f"expected {units.fmt('pp_bubble', summary['pp_bubble_expected'])} ({p['schedule']})"
    work, overhead = p.get("action_s"), p.get("overhead_s_per_action")
    if work and overhead and overhead > work / 2:   # (the schedule's cost per action is half its work or more)
        note += (f"; the schedule's own cost per action ({overhead * 1e3:.2f} ms beyond the expected wait, against "
                 f"{work * 1e3:.2f} ms of work) dominates it: stages this small measure the schedule, not the bubble")
    return note


def mesh_line(summary: Dict[str, object]) -> str:
    """The layout the run trained on, and a strategy whose mesh makes it another one at this size."""
    mesh, strategy = summary["mesh"], (summary.get("choices") or {}).get("parallel", "")
    same = " (hsdp with one shard group: the same layout as fsdp2 at this size)" \
        if strategy == "hsdp" and mesh.get("dp_replicate", 1) == 1 else ""
    return f"mesh: {in_use(mesh)}{f', parallel={strategy}' if strategy else ''}{same}"


def print_summary(summary: Dict[str, object]) -> None:
    table = Table(title="ablate run", show_header=True)
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("note", overflow="fold", max_width=60)
    notes, invalid = summary.get("notes", {}), summary.get("invalid") or {}
    for key in SUMMARY_ROWS:
        if key not in summary and key.startswith("pp_"):   # a pipeline's figures, on a pipelined run's table only
            continue
        value = "[red]invalid" if key in invalid else units.fmt(key, summary.get(key))
        label = f"{key} ({summary['mfu_convention']})" if key == "mfu" and summary.get("mfu_convention") else key
        note = bubble_note(summary) if key == "pp_bubble" else notes.get(key, "")
        predicted = (summary.get("predicted") or {}).get(key) if key in ("step_time_s", "tokens_per_s") else None
        if predicted:   # summary.json's `predicted`, made before the first step (docs/prediction.md)
            note = "; ".join(n for n in (f"predicted {units.fmt(key, predicted)} before the run", note) if n)
        table.add_row(label, value, note)
    console.print(table)
    if summary.get("mesh"):
        console.print(mesh_line(summary), soft_wrap=True)
    if len(summary.get("hosts") or []) > 1:
        console.print("ranks: " + ", ".join(f"{host} {ranks}" for host, ranks in summary["ranks_by_host"].items()))
    if summary.get("straggler"):
        console.print(straggler_line(summary["straggler"]), soft_wrap=True)
    console.print(f"run dir: {summary.get('run_dir')}", soft_wrap=True)
    w = summary.get("wandb") or {}
    if w.get("url"):
        console.print(f"W&B: {w['url']}", soft_wrap=True)
    elif w.get("dir"):
        console.print(f"W&B ({w.get('mode')}): {w['dir']}; upload with `wandb sync {w['dir']}`", soft_wrap=True)
