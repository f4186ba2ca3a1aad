"""A figure of your own: metrics.collectors=[{_target_: mycollectors.LossDrop, every: 2}]."""


class LossDrop:
    """How far the loss has fallen since the first step, and over the whole run."""

    figures = ("loss_drop", "loss_drop_total")   # optional: what it gives, so ablate.tune may aim at them

    def __init__(self, every: int = 1):
        self.every, self.first, self.last = every, None, None

    def on_step(self, event):            # after every optimizer step (ablate.metrics.collectors.StepEvent)
        if event.step % self.every:
            return {}
        loss = event.loss.item()         # a host sync: hence `every`
        self.first = loss if self.first is None else self.first
        self.last = loss
        return {"loss_drop": self.first - loss}    # -> metrics.jsonl and W&B

    def summary(self):                   # once, at the end -> summary.json, W&B, ablate.report's CSV
        return {"loss_drop_total": None if self.first is None else self.first - self.last}
