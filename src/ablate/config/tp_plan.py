"""A user's `tp_plan` (model file), decoded once: {module path pattern: a split}, each value a style name or a
mapping that says more. parallel/tp_plan.py finds the modules each pattern names (and refuses what cannot be
split); parallel/tp.py turns each split into torch's ParallelStyle.

A split is torch's (torch.distributed.tensor.parallel), named as transformers' `tp_plan` names them:
- `colwise`: a Linear's output features (an Embedding's columns) split over the tp ranks (Megatron-LM's column
  split). `fused: N` for a projection that stacks N parts along its outputs (a [Q|K|V] qkv: 3; a [gate|up]
  MLP: 2): each rank keeps its 1/tp of every part, not 1/tp of the stacked rows.
- `rowwise`: a Linear's input features (an Embedding's vocabulary rows) split; outputs summed over the ranks.
- `sequence_parallel`: a module (a norm) that runs on the ranks' shards of the sequence (Korthikanti et al. 2022).
Layouts between them (`input:`, `output:`): `replicate` (whole on every rank), `split` (features split: what a
colwise layer gives a rowwise one), `sequence` (sequence split: what sequence_parallel modules take and give).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ablate.config.errors import ConfigError

# style -> (its valid inputs, its valid outputs); the first of each is the default (an Embedding's rowwise split
# takes token ids whole: `replicate`, whatever is written first)
STYLES: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    "colwise": (("replicate", "sequence"), ("split", "replicate")),
    "rowwise": (("split", "replicate"), ("replicate", "sequence")),
    "sequence_parallel": (("sequence",), ("sequence",)),
}
KEYS = ("style", "input", "output", "fused")


@dataclass(frozen=True)
class Split:
    style: str
    input: Optional[str] = None    # None: the style's default for the module it meets (parallel/tp_plan.py)
    output: Optional[str] = None
    fused: int = 1                 # colwise: parts stacked along the outputs, each split on its own

    def record(self) -> Dict[str, Any]:
        out = {"style": self.style, "input": self.input, "output": self.output}
        return {**out, "fused": self.fused} if self.fused > 1 else out


def decode_split(pattern: str, value: Any) -> Split:
    """One entry of `tp_plan`: `colwise` or {style: colwise, fused: 3, input: sequence, ...}; one line if not."""
    key = f"model.tp_plan.{pattern}"
    node = {"style": value} if isinstance(value, str) else value
    if not isinstance(node, dict):
        raise ConfigError(f"{key}={value}: give a style ({', '.join(STYLES)}) or a mapping of {', '.join(KEYS)}")
    unknown = sorted(set(node) - set(KEYS))
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}: no such key; valid keys: {', '.join(KEYS)}")
    style = node.get("style")
    if style not in STYLES:
        raise ConfigError(f"{key}={style}: not a valid choice; valid choices: {', '.join(STYLES)}")
    inputs, outputs = STYLES[style]
    for side, valid in (("input", inputs), ("output", outputs)):
        if node.get(side) is not None and node[side] not in valid:
            raise ConfigError(f"{key}.{side}={node[side]}: not a valid choice for {style}; valid choices: "
                              f"{', '.join(valid)}")
    fused = node.get("fused", 1)
    if not isinstance(fused, int) or isinstance(fused, bool) or fused < 1 or (fused > 1 and style != "colwise"):
        raise ConfigError(f"{key}.fused={fused}: the number of parts a colwise projection stacks (an integer >= 1; "
                          "a [Q|K|V] projection: 3); valid on colwise splits only")
    return Split(style, node.get("input"), node.get("output"), fused)


def decode_plan(node: Optional[Dict[str, Any]]) -> Optional[Dict[str, Split]]:
    if not node:
        return None
    return {str(pattern): decode_split(str(pattern), value) for pattern, value in node.items()}
