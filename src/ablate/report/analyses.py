"""The analyses a report makes of the runs beside the sweeps' checks, each declared once here: what it finds among
the runs, and how each view shows it - report.md's section (with its picture), the console's lines, its CSV, its
W&B workspace section. Every view (output.py, cli.py, wandb_view.py) iterates ANALYSES, and a sweep group's section
iterates GROUP_SECTIONS: a new analysis is a module of its own and one entry here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional

from ablate.report import effects, predicted, waterfall
from ablate.report import runs as R


@dataclass(frozen=True)
class Analysis:
    """One analysis: `find` gives its items among the runs (the report's `found[key]`); each item has a section in
    report.md (given the picture `draw` made of it in the report's folder, or None) and lines on the console; all
    of them one CSV; each a W&B workspace section where it has one."""
    key: str
    find: Callable[[List[R.Run]], List[Any]]
    draw: Callable[[Path, Any], Optional[str]]
    section: Callable[[Any, Optional[str]], List[str]]
    console: Callable[[Any], List[str]]
    csv: str
    write_csv: Callable[[Path, List[Any]], None]
    wandb_section: Optional[Callable[[Any], Any]] = None


ANALYSES = (
    # factorial sweeps (`design: factorial`) and an ad-hoc -m grid: main effects and interactions
    Analysis("factorials", effects.find, effects.draw, effects.section, effects.console, "effects.csv",
             effects.write_csv, effects.wandb_section),
    # the week-4 stack (`design: stack`): each step's change, as a waterfall
    Analysis("stacks", waterfall.find, waterfall.draw, waterfall.section, waterfall.console, "waterfall.csv",
             waterfall.write_csv),
)

# what a sweep group's section shows after its arms' table, in this order: each a function of the group giving
# report.md's lines (none when it has nothing to say)
GROUP_SECTIONS: tuple = (
    predicted.section,   # each arm's step predicted before the run beside its measured steps
)
