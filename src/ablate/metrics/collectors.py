"""Figures of your own: `metrics.collectors` lists collectors, each a `_target_` with its arguments, built on every
rank. The loop calls each one's `on_step(event)` after every optimizer step and `summary()` once at the end; what
they return reaches metrics.jsonl (each row it logs: each figure's latest value), summary.json (the totals,
top-level keys), W&B, and ablate.report's comparisons and CSV (each total, no claim: an effect with its interval),
with no edit to ablate. docs/collectors.md has the interface and an example.

A figure's name must not be one ablate records itself (one line names it); values are numbers or None. The
figures in summary.json are rank 0's: a collector that wants every rank's reduces them itself.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from ablate.config import ConfigError, RunStopped
from ablate.config.fields import user_object


@dataclass
class StepEvent:
    """What a collector sees after each optimizer step (nothing here syncs the device; `loss.item()` would)."""
    step: int
    loss: torch.Tensor          # the step's last micro-batch loss on this rank, detached, on the device
    tokens: int                 # tokens this rank has trained on so far in this attempt
    model: torch.nn.Module      # as trained (wrapped by DDP/FSDP/DeepSpeed where the layout wraps it)
    optimizer: Optional[Any]
    rank: int
    world_size: int


class Collector:
    """The interface (subclassing it is optional: the two methods are what is called)."""

    def on_step(self, event: StepEvent) -> Dict[str, Optional[float]]:
        return {}

    def summary(self) -> Dict[str, Optional[float]]:
        return {}


@dataclass
class Span:
    """The measured steps a figure covers: one interval between log steps, or the whole run."""
    seconds: float
    steps: int


class BuiltIn:
    """One of ablate's own figures, one concern each (metrics/meter.py lists them in `built_in`). Beside a user's
    collector it sees the measuring window the meter keeps (warm-up and traced steps are not measured). The meter
    calls, each a no-op here:
    - `on_micro(loss)` after each micro-batch; `step_begins(step)` as a measured step begins; `step_ends(grad_norm)`
      after every optimizer step (nothing here syncs the device);
    - `start()` when the measured steps start; `mark()` when an interval of measured steps starts;
      `interval(span)` when it ends, the device synchronised: its figures for the log row, added to `totals`;
    - `logged()` at every log step, measured or not: figures for the row;
    - `summary(span)` at the end: the run's figures from `totals`; `close()`.
    `totals` (numbers, lists, dicts) are kept in each checkpoint: a resumed run's figures cover every attempt."""

    def __init__(self):
        self.totals: Dict[str, Any] = {}

    def resume(self, totals: Dict[str, Any]) -> None:
        self.totals.update({k: v for k, v in totals.items() if k in self.totals})

    def on_micro(self, loss: torch.Tensor) -> None:
        pass

    def step_begins(self, step: int) -> None:
        pass

    def step_ends(self, grad_norm: Optional[torch.Tensor]) -> None:
        pass

    def start(self) -> None:
        pass

    def mark(self) -> None:
        pass

    def interval(self, span: Span) -> Dict[str, Any]:
        return {}

    def logged(self) -> Dict[str, Any]:
        return {}

    def summary(self, span: Span) -> Dict[str, Any]:
        return {}

    def close(self) -> None:
        pass

    @classmethod
    def overrides(cls, hook: str) -> bool:
        """This collector does something on `hook` (the meter calls only those: no empty call per step)."""
        return getattr(cls, hook) is not getattr(BuiltIn, hook)


def check(specs: List[Any]) -> List[tuple]:
    """`metrics.collectors` as (key, class, arguments), each importable and with the two methods: one line naming
    the entry when one is not (said before any rank starts)."""
    out = []
    for i, spec in enumerate(specs or []):
        key = f"metrics.collectors[{i}]"
        spec = dict(spec) if hasattr(spec, "items") else spec
        if not isinstance(spec, dict) or "_target_" not in spec:
            raise ConfigError(f"{key}={spec!r}: a collector is a mapping with a _target_ "
                              "(e.g. {_target_: mypkg.MyCollector, every: 10})")
        target = user_object(f"{key}._target_", spec.pop("_target_"))
        missing = [m for m in ("on_step", "summary") if not callable(getattr(target, m, None))]
        if missing:
            raise ConfigError(f"{key}: {target.__qualname__} has no {' or '.join(missing)}(): a collector needs "
                              "on_step(event) -> dict and summary() -> dict (ablate.metrics.collectors.Collector)")
        _check_arguments(key, target, spec)
        out.append((key, target, spec))
    return out


def _check_arguments(key: str, target, args: Dict[str, Any]) -> None:
    """The collector's constructor takes these arguments (said before any rank starts or any run dir is made)."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):   # a builtin or C callable: its own call says
        return
    try:
        signature.bind(**args)
    except TypeError as e:
        raise ConfigError(f"{key}: {target.__qualname__}({', '.join(f'{k}={v!r}' for k, v in args.items())}) "
                          f"fails: {e}") from None


class CollectorFailed(RunStopped):
    """A collector of the user's raised: the run stops in one line naming it (exit 1), its figures so far kept in
    summary.json (the failed collector's absent, a note says why); its traceback is in the rank's failure note."""

    def __init__(self, message: str, collector: Any = None):
        super().__init__(message, exit_code=1)
        self.collector = collector


def build(specs: List[Any]) -> List[Any]:
    """`metrics.collectors`, built (on every rank)."""
    out = []
    for key, target, args in check(specs):
        try:
            out.append(target(**args))
        except TypeError as e:
            raise ConfigError(f"{key}: {target.__qualname__}({', '.join(f'{k}={v!r}' for k, v in args.items())}) "
                              f"fails: {e}") from None
    return out


def figures(collectors: List[Any], call: str, *args) -> Dict[str, Optional[float]]:
    """Every collector's figures from `call` ("on_step" or "summary"), checked: names are strings, values numbers
    or None, and no two collectors give the same name."""
    out: Dict[str, Optional[float]] = {}
    for c in collectors:
        try:
            got = getattr(c, call)(*args) or {}
        except Exception as e:   # the user's code: named in one line, the run's figures kept (trainer.py)
            at = f" at step {args[0].step}" if args and hasattr(args[0], "step") else ""
            raise CollectorFailed(f"metrics.collectors: {type(c).__qualname__}.{call}() raised{at}: "
                                  f"{type(e).__name__}: {str(e)[:160]}", c) from e
        for name, value in dict(got).items():
            bad = not isinstance(name, str) or not (value is None or isinstance(value, (int, float)))
            if bad or name in out:
                why = "a figure is a name and a number or None" if bad else "another collector gives it too"
                raise ConfigError(f"metrics.collectors: {type(c).__qualname__}.{call}() returned {name!r}: "
                                  f"{value!r}: {why}")
            out[name] = value
    return out


def merge(into: Dict[str, object], collected: Dict[str, Optional[float]], where: str) -> None:
    """Collected figures into a row or the summary: a name ablate already records there is refused in one line."""
    taken = sorted(set(collected) & set(into))
    if taken:
        raise ConfigError(f"metrics.collectors: {', '.join(map(repr, taken))} in {where} is a figure ablate records "
                          "itself: give yours another name")
    into.update(collected)


class Collected:
    """The run's collectors: each figure's latest value, which the next log row takes."""

    def __init__(self, specs: List[Any]):
        self.collectors = build(specs)
        self.latest: Dict[str, Optional[float]] = {}
        self.names: List[str] = []
        self.failed: List[CollectorFailed] = []   # collectors that raised: asked nothing more, said at the end

    def on_step(self, event: StepEvent) -> None:
        if self.collectors:
            try:
                self.latest.update(figures(self.collectors, "on_step", event))   # a figure not given: its last value
            except CollectorFailed as e:
                self.failed.append(e)
                raise

    def into_row(self, row: Dict[str, object]) -> None:
        merge(row, self.latest, "a metrics.jsonl row")

    def totals(self) -> Dict[str, Optional[float]]:
        """Every collector's summary() (called on every rank: a collector may reduce across them); one that raised,
        now or before, gives nothing and is remembered (`failed`)."""
        out: Dict[str, Optional[float]] = {}
        for c in self.collectors:
            if any(f.collector is c for f in self.failed):
                continue
            try:
                got = figures([c], "summary")
            except CollectorFailed as e:
                self.failed.append(e)
                continue
            merge(out, got, "the collectors' totals")
        return out

    def into_summary(self, summary: Dict[str, object], totals: Dict[str, Optional[float]]) -> None:
        merge(summary, totals, "summary.json")
        summary["collected"] = sorted(totals)   # the report compares these (report/runs.py)
        for failure in self.failed:
            for name in getattr(failure.collector, "figures", ()):
                summary.setdefault(name, None)
            summary.setdefault("notes", {})[f"collectors.{type(failure.collector).__qualname__}"] = \
                f"{failure}; its figures are absent"

    def failure(self) -> Optional[CollectorFailed]:
        """The first collector that raised, to end the run with (after its summary.json is written)."""
        return self.failed[0] if self.failed else None
