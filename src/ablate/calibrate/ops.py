"""The per-op figures `python -m ablate.calibrate` measures (docs/prediction.md, "Calibrate"):

- op_us: each distinct op of the run's forward and backward (predict/kernels.py's record: its name, its tensors'
  dtypes, shapes and strides, at the run's micro-batch) replayed alone on tensors of those shapes, the median of
  timed calls: what that op costs this machine, the way vTrain and Calculon cost a step from one device's operators;
- autograd_us: what an op of a training step costs beyond the op itself (autograd's node, the backward engine's
  dispatch): a chain of small ops under autograd, forward and backward, per op, less the same op called bare;
- optimizer_tensor_us: the run's optimizer's step and the gradient clipping, per parameter tensor, over many small
  tensors (their bytes are the memory bandwidth's: this is what each tensor adds beyond them);
- optimizer_us: the run's optimizer step as a rank runs it (clipping, the step, the gradients let go) over
  parameters of the rank's own sizes, keyed by its signature (predict.optimizer_signature);
- overlap: the share of a collective's time that compute running beside it hides here: two processes, each an
  all-reduce issued asynchronously then a matmul loop, against the two run one after the other (gloo runs its
  collectives on the ranks' own cores: a CPU has no idle unit to hide them on).
On a CPU with several ranks a node, op_us, autograd_us and optimizer_tensor_us are timed in as many processes at
once as the run has ranks here, each with a rank's threads (so that they share the cores, their hyperthreads and
their caches as the ranks will), and averaged over them. Each is one kernel's or one loop's; nothing is fitted to
a training step.
"""
from __future__ import annotations

import functools
import math
import os
import statistics
import time
from typing import Callable, Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._pytree import tree_map

from ablate import optim
from ablate.predict.collectives import free_port
from ablate.predict.kernels import OpRecorder, TensorSpec, records_of


def timed(fn: Callable[[], object], device: torch.device, least_s: float = 0.3) -> float:
    """The median seconds of one call: warmed once, then repeated until `least_s` has passed (at least 5 calls)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    samples: List[float] = []
    started = time.perf_counter()
    while time.perf_counter() - started < least_s or len(samples) < 5:
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def materialized(spec, device: torch.device):
    """A tensor of the spec's shape, strides and dtype (random floats, zero indices: a valid index for any table)
    on `device`; a recorded device argument becomes `device`."""
    if isinstance(spec, torch.device):
        return device
    if not isinstance(spec, TensorSpec):
        return spec
    extent = 1 + sum((n - 1) * s for n, s in zip(spec.shape, spec.stride)) if all(spec.shape) else 0
    if spec.dtype.is_floating_point or spec.dtype.is_complex:
        base = torch.randn(extent, device=device).to(spec.dtype)
    else:
        base = torch.zeros(extent, dtype=spec.dtype, device=device)
    return base.as_strided(spec.shape, spec.stride)


def op_seconds(cfg, batch: int, device: torch.device, least_s: float = 1.0) -> Dict[str, float]:
    """{signature: seconds} for every op of `batch` sequences' forward and backward of the run `cfg` asks for
    that replays on this machine (one that does not, say an op whose arguments need values a random tensor lacks,
    is left to its class's rate). The ops run one after another in the order the step first runs them, round after
    round (at least 5, and `least_s`), each timed in place: its inputs as warm in the caches as the ops before it
    leave them, not as one op repeated alone leaves them; the median of its rounds."""
    specs: Dict[str, tuple] = {}
    for _, rec in records_of(cfg, batch):
        specs.update(rec.specs)
    calls: Dict[str, Callable[[], object]] = {}
    for signature, (func, args, kwargs) in specs.items():
        try:
            a, k = tree_map(lambda s: materialized(s, device), (args, kwargs))
            func(*a, **k)
            calls[signature] = functools.partial(func, *a, **k)
        except Exception:   # (any op's own error on made-up values: priced by its class instead)
            continue
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    samples: Dict[str, List[float]] = {s: [] for s in calls}
    started, rounds = time.perf_counter(), 0
    while time.perf_counter() - started < least_s or rounds < 5:
        for signature, call in calls.items():
            t0 = time.perf_counter()
            call()
            sync()
            samples[signature].append(time.perf_counter() - t0)
        rounds += 1
    return {s: statistics.median(v) for s, v in samples.items()}


def autograd_seconds(device: torch.device, length: int = 64) -> float:
    """A training step's op beyond the op: a chain of `length` multiplications of a small tensor under autograd,
    forward and backward, per recorded op, less one multiplication called bare."""
    x = torch.ones(16, device=device, requires_grad=True)

    def chain():
        y = x
        for _ in range(length):
            y = y * 1.0001
        y.sum().backward()

    with OpRecorder() as rec:
        chain()
    ops = sum(rec.ops.values())
    bare = torch.ones(16, device=device)
    per_op = timed(chain, device) / ops
    return per_op - timed(lambda: [bare * 1.0001 for _ in range(length)], device) / length


OVERLAP_CALLS = 40


def optimizer_tensor_seconds(cfg, device: torch.device, tensors: int = 64) -> float:
    """The run's optimizer (conf/optim) and torch's gradient clipping over `tensors` parameters of 16 elements,
    per tensor."""
    params = [torch.nn.Parameter(torch.ones(4, 4, device=device)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer = optim.build(params, cfg.optim)

    def step():
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    return timed(step, device) / tensors


def optimizer_step_seconds(cfg, device: torch.device, numels: List[int]) -> float:
    """The run's optimizer step as a rank runs it (gradient clipping, the step, the gradients let go) over
    parameters of the rank's own sizes (its shard of each tensor)."""
    params = [torch.nn.Parameter(torch.randn(n, device=device)) for n in numels]
    grads = [torch.randn_like(p) for p in params]
    optimizer = optim.build(params, cfg.optim)

    def step():
        for p, g in zip(params, grads):
            p.grad = g
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return timed(step, device)


def _overlap_rank(rank: int, port: int, threads: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        buf, a = torch.ones(1 << 20), torch.randn(256, 256)
        work = lambda: [a @ a for _ in range(40)]   # noqa: E731
        comm = lambda: dist.all_reduce(buf)           # noqa: E731

        def together():
            handle = dist.all_reduce(buf, async_op=True)
            work()
            handle.wait()

        calls = (work, comm, together)
        samples: List[List[float]] = [[], [], []]
        for i in range(OVERLAP_CALLS + 1):   # as many on each rank (a collective each): a count, not a time;
            for fn, timed_s in zip(calls, samples):   # interleaved, so that a slow spell slows all three
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                if i:   # the first round warms
                    timed_s.append(time.perf_counter() - t0)
        figures = [statistics.median(s) for s in samples]
        if rank == 0:
            out.put(figures)
    finally:
        dist.destroy_process_group()


def overlap_share(threads: int) -> float:
    """(work alone + collective alone - both at once) / the shorter of the two, with two gloo processes here:
    1 where the collective hides wholly behind the work, 0 where the two take turns."""
    port = free_port()
    out = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_overlap_rank, args=(port, threads, out), nprocs=2, start_method="spawn")
    work, comm, both = out.get()
    return (work + comm - both) / min(work, comm)


def per_op(cfg, device: torch.device, shard: Tuple[str, List[int]]) -> Dict[str, object]:
    """This process's op_us, autograd_us, optimizer_tensor_us and optimizer_us (microseconds); `shard`: the rank's
    optimizer step's signature and its parameters' sizes."""
    ops = op_seconds(cfg, micro_batch(cfg), device)
    return {"op_us": {k: v * 1e6 for k, v in sorted(ops.items())},
            "autograd_us": autograd_seconds(device) * 1e6,
            "optimizer_tensor_us": optimizer_tensor_seconds(cfg, device) * 1e6,
            "optimizer_us": {shard[0]: optimizer_step_seconds(cfg, device, shard[1]) * 1e6}}


def _per_op_rank(rank: int, cfg, threads: int, shard, start, out) -> None:
    torch.set_num_threads(threads)
    records_of(cfg, micro_batch(cfg))   # recorded before the start: the timing runs all at once
    start.wait()
    out.put(per_op(cfg, torch.device("cpu"), shard))


def per_op_together(cfg, procs: int, threads: int, shard: Tuple[str, List[int]]) -> Dict[str, object]:
    """per_op in `procs` processes at once (spawned, `threads` each), the mean of each figure over them."""
    context = mp.get_context("spawn")
    out, start = context.SimpleQueue(), context.Barrier(procs)
    mp.start_processes(_per_op_rank, args=(cfg, threads, shard, start, out), nprocs=procs, start_method="spawn")
    each = [out.get() for _ in range(procs)]
    common = set.intersection(*(set(e["op_us"]) for e in each))
    return {"op_us": {k: statistics.mean(e["op_us"][k] for e in each) for k in sorted(common)},
            **{k: statistics.mean(e[k] for e in each) for k in ("autograd_us", "optimizer_tensor_us")},
            "optimizer_us": {shard[0]: statistics.mean(e["optimizer_us"][shard[0]] for e in each)}}


def micro_batch(cfg) -> int:
    """The sequences of one forward and backward on a rank (a pipeline's micro-batch under pp)."""
    return max(1, math.floor(cfg.train.batch_size / cfg.parallel.microbatches))
