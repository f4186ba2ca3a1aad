"""Figures of your own (metrics/collectors.py), in process (~0 s); end to end: the user's sweep in
test_your_training.py carries tests/user/mycollectors.py's collector to every row, summary and the report's CSV."""
import pytest
import torch

from ablate.config import ConfigError
from ablate.metrics.collectors import Collected, StepEvent


class Steps:
    def __init__(self, name="seen"):
        self.name, self.n = name, 0

    def on_step(self, event):
        self.n += 1
        return {self.name: float(event.step)} if event.step % 2 == 0 else {}

    def summary(self):
        return {f"{self.name}_total": self.n}


def event(step):
    return StepEvent(step, torch.tensor(1.0), 0, torch.nn.Linear(1, 1), None, 0, 1)


def collected(*collectors):
    c = Collected([])
    c.collectors = list(collectors)
    return c


def test_a_row_takes_each_figures_latest_value_and_the_summary_names_what_was_collected():
    c = collected(Steps())
    for step in (1, 2, 3):
        c.on_step(event(step))
    row = {"step": 3, "loss": 1.0}
    c.into_row(row)
    assert row["seen"] == 2.0                        # step 3 gave nothing: step 2's value
    summary = {"loss": 1.0}
    c.into_summary(summary, c.totals())
    assert summary["seen_total"] == 3 and summary["collected"] == ["seen_total"]


@pytest.mark.parametrize("collectors, where, says", [
    ([Steps("loss")], "row", "'loss' in a metrics.jsonl row is a figure ablate records itself"),
    ([Steps(), Steps()], "row", "returned 'seen': 2.0: another collector gives it too"),
])
def test_a_name_taken_is_refused_in_one_line(collectors, where, says):
    c = collected(*collectors)
    with pytest.raises(ConfigError, match=says):
        c.on_step(event(2))
        c.into_row({"step": 2, "loss": 1.0})


def test_a_figure_that_is_not_a_number_is_refused():
    class Text(Steps):
        def on_step(self, event):
            return {"what": "fast"}

    with pytest.raises(ConfigError, match=r"Text.on_step\(\) returned 'what': 'fast': a figure is a name"):
        collected(Text()).on_step(event(1))


def test_the_docs_show_the_collector_the_tests_run():
    import re

    from conftest import REPO, USER_DIR

    doc = (REPO / "docs" / "collectors.md").read_text()
    assert re.search(r"```python\n(.*?)```", doc, re.S).group(1) == (USER_DIR / "mycollectors.py").read_text()


def test_each_built_in_figure_is_one_collectors_and_hooks_cost_only_where_used():
    """ablate's own figures (metrics/meter.py): a key two collectors give is refused as a bug; the meter calls a
    hook per step only on the collectors that do something there (~0 s)."""
    from ablate.metrics.collectors import BuiltIn, Span
    from ablate.metrics.comm import Comm
    from ablate.metrics.health import Health
    from ablate.metrics.memory import Memory
    from ablate.metrics.meter import Meter
    from ablate.metrics.throughput import Throughput

    class Tokens(BuiltIn):
        def summary(self, span):
            return {"tokens_per_s": 1.0}

    meter = Meter.__new__(Meter)
    meter.calls = {"summary": [Tokens().summary, Tokens().summary]}
    with pytest.raises(RuntimeError, match="tokens_per_s"):
        meter._gather("summary", Span(1.0, 1))
    class Speed(BuiltIn):
        def logged(self):
            return {"tokens_per_s": 1.0}

        def interval(self, span):
            return {"tokens_per_s": 2.0}

    meter.calls = {"logged": [Speed().logged], "interval": [Speed().interval], "mark": []}
    meter.measuring, meter.device, meter.window = True, torch.device("cpu"), {"time": 0.0, "steps": 1}
    meter._t0, meter._steps0 = 0.0, 0
    with pytest.raises(RuntimeError, match=r"interval gives \['tokens_per_s'\]"):   # a row's two kinds, too
        meter.log_point(1)
    assert Health.overrides("on_micro") and not Throughput.overrides("on_micro") and not Comm.overrides("on_micro")
    assert not Memory.overrides("step_ends") and not Memory.overrides("step_begins")
