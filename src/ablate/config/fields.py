"""A group's fields: numbers with their declared ranges (`num`, checked by `check_ranges` first in every
group's `__post_init__`) and one-of-these choices (`choice`)."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from ablate.config.errors import ConfigError


def choice(key: str, value: Any, valid) -> None:
    if value not in valid:
        raise ConfigError(f"{key}={value}: not a valid choice; valid choices: {', '.join(map(str, valid))}")


@dataclass(frozen=True)
class Range:
    """A number's allowed values: [low, high] with either end open; None when unbounded."""
    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, v: float) -> bool:
        if not math.isfinite(v):
            return False
        above = self.low is None or (v > self.low if self.low_open else v >= self.low)
        below = self.high is None or (v < self.high if self.high_open else v <= self.high)
        return above and below

    def __str__(self) -> str:
        parts = [f"{'>' if self.low_open else '>='} {self.low:g}" if self.low is not None else "",
                 f"{'<' if self.high_open else '<='} {self.high:g}" if self.high is not None else ""]
        return " and ".join(p for p in parts if p)


def num(default, low=None, high=None, *, low_open=False, high_open=False, null: str = ""):
    """A numeric field with its range (checked by `check_ranges`); `null` says what None means, if allowed."""
    return field(default=default, metadata={"range": Range(low, high, low_open, high_open), "null": null})


def check_ranges(node, group: str) -> None:
    """Every numeric field of a group against its declared range, before anything computes with it."""
    for f in fields(node):
        rng, value = f.metadata.get("range"), getattr(node, f.name)
        if rng is None or value is None or isinstance(value, bool):
            continue
        if not rng.holds(float(value)):
            null = f"; or null ({f.metadata['null']})" if f.metadata.get("null") else ""
            finite = "" if math.isfinite(float(value)) else "a finite number "
            raise ConfigError(f"{group}.{f.name}={value}: out of range; allowed: {finite}{rng}{null}")


def user_object(key: str, dotted: str):
    """A `_target_` (model._target_, optim._target_) imported as Hydra's instantiate would, from the user's path
    (the working directory, PYTHONPATH); one line naming the key and the cause when it cannot be."""
    # imported here: the readers of run dirs (report/) import config/ without Hydra
    from hydra.utils import get_object

    said = logging.getLogger("hydra.utils")   # get_object logs the failure itself: the one line below says it
    was, said.disabled = said.disabled, True
    try:
        return get_object(dotted)
    except Exception as e:
        cause = e.__cause__ or e
        why = f"{type(cause).__name__}: {str(cause).splitlines()[0]}" if str(cause) else type(cause).__name__
        raise ConfigError(f"{key}={dotted}: cannot import it ({why}); is its module on PYTHONPATH?") from None
    finally:
        said.disabled = was
