"""What a person sees in the terminal: a progress bar while training, a summary table at the end."""
from __future__ import annotations

import sys
from typing import Dict, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ablate import units

console = Console(stderr=True)


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


SUMMARY_ROWS = ("loss", "tokens_per_s", "step_time_s", "tflops_per_device", "mfu", "hfu", "peak_flops_source",
                "data_wait_frac", "mem_peak_bytes", "mem_reserved_bytes", "fragmentation", "gpu_util",
                "comm_bytes_per_step", "comm_calls_per_step", "nonfinite_steps", "scaler_skipped_steps")


def print_summary(summary: Dict[str, object]) -> None:
    table = Table(title=f"ablate run: {summary.get('run_name', '')}", show_header=True)
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("note", overflow="fold", max_width=60)
    notes, invalid = summary.get("notes", {}), summary.get("invalid") or {}
    for key in SUMMARY_ROWS:
        value = "[red]invalid" if key in invalid else units.fmt(key, summary.get(key))
        table.add_row(key, value, notes.get(key, ""))
    console.print(table)
    if len(summary.get("hosts") or []) > 1:
        console.print("ranks: " + ", ".join(f"{host} {ranks}" for host, ranks in summary["ranks_by_host"].items()))
    console.print(f"run dir: {summary.get('run_dir')}")
