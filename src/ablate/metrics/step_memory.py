"""The peak a run holds: the most tensor memory live at once on this rank during one full optimizer step (every
micro-step's forward and backward, the gradient reduction, the optimizer's step), summary.json's
`peak_bytes_measured`, set beside the plan's `peak_bytes_planned` (ablate.plan) and their ratio.

How, per device:
- CUDA: the caching allocator's own peaks over the step (`torch.cuda.max_memory_allocated`, and the reserved
  memory beside it: `peak_reserved_bytes_measured`).
- CPU: torch's memory tracker (torch.distributed._tools.mem_tracker.MemTracker, a dispatch mode) follows every
  storage an op creates, resizes or frees during the step, on top of what exists when it starts (the model's
  parameters, buffers and gradients, the optimizer's state: counted from their storages); its peak, and the parts
  it holds then (parameters, gradients, optimizer state, activations, backward's temporaries). What it cannot
  see: memory outside torch's tensors (the Python runtime, the communication library's own buffers, the
  allocator's cache), which a CPU run has no allocator to report; the CUDA figures include the cache as
  `reserved`.
The tracked step is the run's last warm-up step, or its second if that is later (the optimizer's state exists
from the first step's end); a tracked step after warm-up is left out of the steady figures (`excluded_steps`:
the tracker costs time per op), unless it would leave none: then no step is tracked (NOT_TRACKED).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

PARTS = {"Parameter": "params", "Buffer": "buffers", "Gradient": "grads", "Optstate": "optimizer",
         "Activation": "activations", "Temp": "backward_temporaries", "Other": "other"}


NOT_TRACKED = ("no step tracked: the run has no step after its first that is a warm-up step or leaves a measured "
               "step beside it (train.warmup_steps >= 2, or more train.steps)")


def tracked_step(start_step: int, first_measured: int, steps: int) -> Optional[int]:
    """The step whose peak is measured (see above), None when there is none to spare."""
    step = max(start_step + 2, first_measured - 1)
    if step < first_measured:
        return step
    return step if step < steps else None


def tolerant_tracker():
    """torch's MemTracker, whose per-module bookkeeping (module hooks) never stops a training step: a model it
    cannot follow (a root module called twice in a micro-step, say) leaves no peak and says why (`failed`)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class Tolerant(MemTracker):
        failed: Optional[str] = None

        def _guarded(self, hook, *args) -> None:
            if self.failed is None:
                try:
                    hook(*args)
                except Exception as e:   # its bookkeeping, not the model's: the step goes on
                    self.failed = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"

        def _pre_fw_hook(self, *args):
            self._guarded(super()._pre_fw_hook, *args)

        def _post_fw_hook(self, *args):
            self._guarded(super()._post_fw_hook, *args)

        def _pre_bw_hook(self, *args):
            self._guarded(super()._pre_bw_hook, *args)

        def _post_bw_hook(self, *args):
            self._guarded(super()._post_bw_hook, *args)

    return Tolerant()


class StepMemory:
    """`with StepMemory(device, model, optimizer) as m: <one optimizer step>`; then `m.record()`."""

    def __init__(self, device: torch.device, model: torch.nn.Module, optimizer=None):
        self.device, self.model, self.optimizer = device, model, optimizer
        self.peak: Optional[int] = None
        self.reserved: Optional[int] = None
        self.parts: Dict[str, int] = {}
        self.why: Optional[str] = None   # why no peak was measured, if so
        self._tracker = None

    def __enter__(self) -> "StepMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        self._tracker = tolerant_tracker()
        external = [self.model] + ([self.optimizer] if isinstance(self.optimizer, torch.optim.Optimizer) else [])
        self._tracker.track_external(*external)
        self._tracker.track_external(*[p.grad for p in self.model.parameters() if p.grad is not None])
        self._tracker.__enter__()
        return self

    def micro_step(self) -> None:
        """Before each micro-step's forward: the tracker's per-module figures are per call (it refuses a module
        run twice); its peak is the step's."""
        if self._tracker is not None:
            self._tracker.reset_mod_stats()

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = int(torch.cuda.max_memory_allocated(self.device))
            self.reserved = int(torch.cuda.max_memory_reserved(self.device))
            return
        self._tracker.__exit__(*exc)
        if self._tracker.failed:
            self.why = f"not measured: torch's memory tracker could not follow this model ({self._tracker.failed})"
            self._tracker = None
            return
        snapshot = self._tracker.get_tracker_snapshot("peak")
        at_peak = next(iter(snapshot.values()), {})
        self.peak = int(at_peak.get("Total", 0))
        self.parts = {PARTS.get(str(getattr(k, "value", k)), str(k)): int(v) for k, v in at_peak.items()
                      if k != "Total" and v}
        self._tracker = None

    @staticmethod
    def absent() -> Dict[str, object]:
        return {"peak_bytes_measured": None, "peak_reserved_bytes_measured": None, "peak_parts_measured": None}

    def record(self) -> Dict[str, object]:
        return {"peak_bytes_measured": self.peak, "peak_reserved_bytes_measured": self.reserved,
                "peak_parts_measured": self.parts or None}


def peak_figures(per_rank, planned: Optional[float]) -> Dict[str, object]:
    """summary.json's peak: the most loaded rank's measured (metrics/step_memory.py), the plan's, their ratio."""
    measured = max((r["peak_bytes_measured"] for r in per_rank if r.get("peak_bytes_measured")), default=None)
    return {"peak_bytes_measured": measured, "peak_bytes_planned": planned,
            "peak_ratio": measured / planned if measured and planned else None}
