"""The mesh's dims, declared once, outermost first (parallel/mesh.py builds the device mesh from them; a summary's
`mesh`, the report's layout column, the plan's title and the comm model's keys read them here). Torch-free: the
report reads it."""
from __future__ import annotations

from typing import Dict

DIMS = ("pp", "dp_replicate", "dp_shard", "tp")
DIMS_NAMED = " x ".join(DIMS)   # "pp x dp_replicate x dp_shard x tp": what a label's numbers are


def label(mesh: Dict[str, int]) -> str:
    """A mesh record (summary.json's `mesh`) as its sizes in DIMS' order: "1x2x2x1" (a record written before a dim
    existed has it at 1)."""
    return "x".join(str(mesh.get(d, 1)) for d in DIMS)


def described(mesh: Dict[str, int]) -> str:
    """A mesh record in words: "pp 1 x dp_replicate 2 x dp_shard 2 x tp 1"."""
    return " x ".join(f"{d} {mesh.get(d, 1)}" for d in DIMS)


def in_use(mesh: Dict[str, int]) -> str:
    """The dims a run splits over, in words: "dp_shard 4", "dp_shard 2 x tp 2"; "one rank" when none."""
    used = [f"{d} {mesh[d]}" for d in DIMS if mesh.get(d, 1) > 1]
    return " x ".join(used) or "one rank"
