"""A pipeline's schedules (parallel.pp_schedule) and the bubble each is expected to leave: the fraction of a step a
stage's rank idles, with p stages' ranks, m micro-batches, v stages per rank, equal stages and a backward twice a
forward. Torch-free: the plan, the run's record (metrics/bubble.py) and the report read it.

- gpipe and 1f1b: (p - 1) / (m + p - 1) (GPipe: Huang et al. 2019; 1F1B = PipeDream-Flush: Narayanan et al.
  2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", section 2.2.1);
- interleaved_1f1b: (p - 1) / (v m + p - 1) (the same paper, section 2.2.2: the bubble shrinks by v);
- zero_bubble: (p - 1) / (3 v m + p - 1): the backward split into input and weight gradients lets the weight
  halves fill the bubble; Qi et al. 2023, "Zero Bubble Pipeline Parallelism", give ZB-H1's bubble as about a third
  of 1F1B's when forward, input-backward and weight-backward take alike (torch's InterleavedZeroBubble is their
  interleaved variant; the figure is that approximation).
"""
from __future__ import annotations

# parallel.pp_schedule -> torch.distributed.pipelining's class, and whether it drives several stages per rank
TORCH_CLASS = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B",
               "zero_bubble": "ScheduleInterleavedZeroBubble"}
MULTI_STAGE = ("interleaved_1f1b", "zero_bubble")
SOURCES = {"gpipe": "Huang et al. 2019 (GPipe)", "1f1b": "Narayanan et al. 2021, section 2.2.1",
           "interleaved_1f1b": "Narayanan et al. 2021, section 2.2.2",
           "zero_bubble": "Qi et al. 2023 (ZB-H1: a third of 1F1B's)"}


def expected(schedule: str, p: int, m: int, v: int = 1) -> float:
    """The fraction of a step a stage's rank idles under `schedule` (the formulas above)."""
    if p <= 1:
        return 0.0
    work = {"gpipe": m, "1f1b": m, "interleaved_1f1b": v * m, "zero_bubble": 3 * v * m}[schedule]
    return (p - 1) / (work + p - 1)


def expected_of(parallel) -> float:
    """The bubble a `parallel` node's pipeline is expected to leave (0 without one): the run's record, the plan's
    prediction and the report's "expected here" read it here."""
    return expected(parallel.pp_schedule, parallel.pp, parallel.microbatches, parallel.pp_stages_per_rank)


def in_flight(parallel, rank: int) -> float:
    """Micro-batches whose activations pp rank `rank` holds at once, counted through all its v stages: GPipe runs
    every forward first (m); 1F1B's rank r runs p - r forwards before its first backward (Narayanan et al. 2021,
    2.2.1); the interleaved schedules' warm-up is torch's (`_get_warmup_ops`: (v - 1) x the micro-batches of a
    round + 2 per hop from the last rank), each a forward through one of its v stages."""
    schedule, p, m, v = parallel.pp_schedule, parallel.pp, parallel.microbatches, parallel.pp_stages_per_rank
    if schedule == "gpipe":
        return float(m)
    if schedule not in MULTI_STAGE:
        return float(min(m, p - rank))
    per_round = m // max(1, m // p)
    warmup = min((v - 1) * per_round + 2 * (p - 1 - rank), m * v)
    return min(warmup + 1, m * v) / v
