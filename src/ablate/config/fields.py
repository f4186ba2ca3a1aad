"""A group's fields: numbers with their declared ranges (`num`, checked by `check_ranges` first in every
group's `__post_init__`) and one-of-these choices (`choice`)."""
from __future__ import annotations

import importlib
import logging
import math
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Optional, get_args, get_type_hints

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


def no_such_key(full_key: str, schema) -> ConfigError:
    """A key the schema does not know (`train.lrr=1`, `+train.lrr=1`), with the keys it does know there."""
    group = full_key.rpartition(".")[0]
    valid = ", ".join(f.name for f in fields(schema))
    return ConfigError(f"{full_key}: no such key in '{group or 'the config'}'; valid keys: {valid}")


_KINDS = {bool: "a boolean", int: "an integer", float: "a number"}


def wrong_kind(node_type, key: str, full_key: str, value) -> Optional[ConfigError]:
    """A value OmegaConf could not convert to its field's type (`train.steps=abc`), said as the field's kind
    and its range, as an out-of-range value is; None for a field that is no number or boolean of a group."""
    if not is_dataclass(node_type) or key not in {f.name for f in fields(node_type)}:
        return None
    kinds = [t for t in get_args(get_type_hints(node_type)[key]) or [get_type_hints(node_type)[key]]
             if t is not type(None)]
    if len(kinds) != 1 or kinds[0] not in _KINDS:
        return None
    meta = next(f.metadata for f in fields(node_type) if f.name == key)
    allowed = "; valid choices: true, false" if kinds[0] is bool else \
        f"; allowed: {meta['range']}" if str(meta.get("range") or "") else ""
    null = f"; or null ({meta['null']})" if meta.get("null") else ""
    return ConfigError(f"{full_key}={value}: not {_KINDS[kinds[0]]}{allowed}{null}")


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


def import_root(dotted: str) -> Optional[Path]:
    """The directory on the import path that a `_target_`'s top-level module was imported from (importing it), so
    that another process can import it the same way; None for an installed one (site-packages, the standard
    library) or one without a file."""
    top = dotted.split(".")[0]
    try:
        module = sys.modules.get(top) or importlib.import_module(top)
    except ImportError:
        return None
    where = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", [])), None)
    if not where:
        return None
    path = Path(where).resolve()
    root = path.parent.parent if path.name == "__init__.py" else path.parent   # (a package's dir, or a module's)
    installed = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    if "site-packages" in path.parts or "dist-packages" in path.parts or any(p in path.parents for p in installed):
        return None
    return root
