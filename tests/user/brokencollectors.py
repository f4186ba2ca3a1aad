"""Collectors with bugs, for the fault tests (tests/test_faults.py): a user's error, named in one line."""


class Raises:
    """A collector with a bug: raises at step `at` (on_step), or in summary() when `at` is 0."""

    figures = ("raised_at",)

    def __init__(self, at: int = 3):
        self.at = at

    def on_step(self, event):
        if self.at and event.step >= self.at:
            raise ValueError(f"a bug in my collector at step {event.step}")
        return {"raised_at": None}

    def summary(self):
        if not self.at:
            raise KeyError("the totals I forgot")
        return {}
