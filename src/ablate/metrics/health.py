"""The loss and whether training is healthy: the loss (averaged over ranks at log steps), the gradient norm, steps
with a NaN/inf loss or gradient norm, and the loss scaler's skipped steps. Kept on the device between log steps
(no host sync per step); the loop asks it, at log steps and before checkpoints, whether to stop (train/loop.py).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

from ablate.metrics.collectors import BuiltIn, Span
from ablate.metrics.counting import mean_across_ranks, most_across_ranks


class Health(BuiltIn):
    def __init__(self, env, strategy):
        super().__init__()
        self.env, self.strategy = env, strategy
        device = env.device
        self.loss_sum = torch.zeros((), device=device)
        self.loss_count = 0
        self.nonfinite = torch.zeros((), dtype=torch.int64, device=device)
        self._step_bad = torch.zeros((), dtype=torch.bool, device=device)      # this step had a NaN/inf
        self._consecutive = torch.zeros((), dtype=torch.int64, device=device)  # bad steps in a row
        self._last_loss_bad = torch.zeros((), dtype=torch.bool, device=device)  # the last step's loss was NaN/inf
        self.grad_norm: Optional[torch.Tensor] = None
        self.loss: Optional[float] = None   # the last logged loss (the summary's)

    def on_micro(self, loss: torch.Tensor) -> None:
        loss = loss.detach()
        bad = ~torch.isfinite(loss)
        self.nonfinite += bad.long()
        self._step_bad |= bad
        self.loss_sum += loss
        self.loss_count += 1

    def step_ends(self, grad_norm: Optional[torch.Tensor]) -> None:
        """`grad_norm` None: the engine did not measure one (then only the loss says a step was bad)."""
        self.grad_norm = grad_norm.detach() if grad_norm is not None else None
        bad = self._step_bad if grad_norm is None else self._step_bad | ~torch.isfinite(self.grad_norm)
        self._consecutive = torch.where(bad, self._consecutive + 1, torch.zeros_like(self._consecutive))
        self._last_loss_bad = self._step_bad   # the step's own loss: fp16's skipped steps keep finite weights
        self._step_bad = torch.zeros_like(self._step_bad)

    def last_loss_finite(self) -> bool:
        """The last step's loss was finite on this rank (a host sync): a checkpoint is good only then."""
        return not bool(self._last_loss_bad.item())

    def consecutive_nonfinite(self) -> int:
        """Steps in a row, up to the last, with a non-finite loss or gradient norm, the most of any rank's (a host
        sync and one collective): every rank stops at the same step, as one (a rank whose own loss stayed finite
        would otherwise go on into a collective its stopped peer never joins, and the run's summary be lost)."""
        return most_across_ranks(int(self._consecutive.item()), self.env)

    def logged(self) -> Dict[str, object]:
        loss = mean_across_ranks(self.loss_sum / max(self.loss_count, 1), self.env)
        self.loss_sum.zero_()
        self.loss_count = 0
        self.loss = loss.item()
        return {"loss": self.loss, "grad_norm": self.grad_norm.item() if self.grad_norm is not None else None,
                **self._counts()}

    def _counts(self) -> Dict[str, object]:
        return {"nonfinite_steps": int(self.nonfinite.item()), "scaler_skipped_steps": self.strategy.skipped_steps(),
                "loss_scale": self.strategy.loss_scale()}

    def summary(self, span: Span) -> Dict[str, object]:
        return {**self._counts(), "loss": self.loss}
