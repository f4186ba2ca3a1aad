"""This machine's step, predicted before the run (`ablate.plan --hardware here`, bench/predict_here.py): a CPU run's
time from two measurements taken here, neither of them the run.

On a CPU a small model's step is mostly per-op dispatch, Python and the strategy's own bookkeeping (FSDP2's
copy-in/out, DTensor's sharding rules), which a FLOP count does not see; so the compute comes from executing the
rank's own step with the collectives free, the way torch's FakeProcessGroup simulates one rank of a world:
- compute: each rank's step (its model, strategy, mesh and batch; the run's threads per rank), timed with a fake
  process group, as many of them at once as the run has ranks here (so they share the cores as the ranks will);
  the slowest rank's median step (at least 12 steps and a second of them);
- communication: each collective that step asked for, as the run's own counter sees it (metrics/comm.py: kind,
  bytes, the mesh dim of its group; DTensor's too) costs what the lockstep probe measured for that kind and size,
  with as many processes here and groups as large, after as much work as came before it in the free step
  (collectives.py: cached per host);
- exposed: all of it (gloo runs a collective on the rank's cores; on 2 cores there is no idle core to hide it);
- step = compute + the collectives' cost.
The free step reads its batches from the run's own loader (conf/dataloader, conf/data). Left out: pipelines
(their schedule owns the step: not predicted), the loop's own per-step work (ablate's meter, ~1% of a step),
DeepSpeed's engines (not run on a fake group).
"""
from __future__ import annotations

import gc
import logging
import socket
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ablate import parallel, usable_cores
from ablate.dataloader import DeviceFeeder, build_loader
from ablate.metrics.host import HostLoad
from ablate.metrics.host import summarize as host_summary
from ablate.model import build as build_model
from ablate.model.contract import vocab_size_of
from ablate.model.facts import declared_vocab
from ablate.parallel.mesh import build_mesh
from ablate.predict import collectives, global_tokens
from ablate.predict.together import Together


# the collective a counted function is (metrics/comm.py wraps torch.distributed's and the functional ones): its
# kind for the probe; a broadcast costs as an all-reduce of its bytes
def kind_of(called: str) -> str:
    if "reduce_scatter" in called:
        return "reduce_scatter"
    if "gather" in called:
        return "all_gather"
    return "all_reduce"


NOT_FREE = ("zero1", "zero2", "zero3")   # DeepSpeed's engines talk to their own groups: no fake step of theirs
# steps timed: at least 12 and at least a second of them (a 8 ms step timed 12 times read 7.7 and 8.7 ms for two
# identical arms), at most 200
TIMED_STEPS, TIMED_S, MAX_STEPS, WARM_STEPS = 12, 1.0, 200, 3


@dataclass(frozen=True)
class Call:
    """One collective a rank's step makes: its kind, its payload (an all-gather's output, a reduce-scatter's
    input: metrics/comm.py's convention), its group's size and mesh dim, and the compute before it since the step
    began or the collective before it (`after_s`: a collective's cost grows with it, collectives.py)."""
    kind: str
    nbytes: int
    group: int
    dim: str
    after_s: float = 0.0


def threads_per_rank(ranks_here: int) -> int:
    """The run's own rule (train/ranks.py): the host's cores shared by the ranks on it."""
    return max(1, usable_cores() // max(1, ranks_here))


def free_step(cfg, rank: int, together: Optional[Path] = None,
              real: bool = False) -> Tuple[float, List[Call], Dict[str, object]]:
    """Rank `rank`'s optimizer step of the run `cfg` (an AblateConfig) asks for, with a fake process group: its
    median time (TIMED_STEPS and TIMED_S, after WARM_STEPS), the collectives one step makes, and the host's CPU
    over the timed steps (metrics/host.py: other processes' share says a busy host). `together`: the
    FileStore where the ranks' free steps meet (together.py), for more than one rank. `real`: a gloo group
    instead (the collectives run; DeepSpeed's engines and pipelines' schedules, which a fake group cannot run;
    TIMED_STEPS steps on every rank, in lockstep)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    layout = parallel.layout_of(cfg)
    threads = torch.get_num_threads()   # (one rank runs in the caller's process: its threads are given back)
    torch.set_num_threads(threads_per_rank(cfg.launcher.nproc_per_node))
    if layout.world > 1 or parallel.choice(cfg.parallel.name).needs_group:
        store = dist.FileStore(f"{together}.store", layout.world) if real else FakeStore()
        dist.init_process_group("gloo" if real else "fake", store=store, rank=rank, world_size=layout.world)
    strategy, meet = None, Together(together, layout.world) if together and not real else None
    try:
        strategy, step = rank_step(cfg, rank, layout)
        seconds, on_host = timed(step, meet, lockstep=real)
        return seconds, calls_of(step, strategy, layout), on_host
    finally:
        if meet:
            meet.leave()
        if strategy is not None:
            strategy.close()   # its collective counter: a run's own is installed next
        torch.set_num_threads(threads)
        if dist.is_initialized():
            dist.destroy_process_group()


def rank_step(cfg, rank: int, layout):
    """(the strategy, one optimizer step of this rank): its model, strategy and mesh on the fake group joined, its
    batches from the run's own loader (conf/dataloader, conf/data: they cost what they cost the run)."""
    mesh = build_mesh(layout, "cpu")
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, "cpu")
    vocab = vocab_size_of(model.net) or declared_vocab(cfg.model)
    strategy = parallel.build(cfg, model, torch.device("cpu"), layout, mesh)
    feeder = DeviceFeeder(build_loader(cfg.train, cfg.dataloader, cfg.data, vocab, layout.dp_rank(rank), layout.dp,
                                       0, torch.device("cpu")), cfg.dataloader, torch.device("cpu"))

    def step():
        if strategy.pipeline is not None:   # the schedule owns the forwards and backwards (train/loop.py)
            x, y = next(feeder)
            with strategy.autocast():
                strategy.pipeline.step(x, y)
            strategy.step()
            return
        for micro in range(cfg.train.grad_accum):
            x, y = next(feeder)
            with strategy.micro_step(last=micro == cfg.train.grad_accum - 1):
                with strategy.autocast():
                    loss = strategy.model(x, y)
                strategy.backward(loss / cfg.train.grad_accum)
        strategy.step()
    return strategy, step


def timed(step, meet: Optional[Together], lockstep: bool = False) -> Tuple[float, Dict[str, object]]:
    """The step's median time and the host's CPU over the timed steps; with other ranks (`meet`), timed once every
    rank has built its step, and stepped on untimed until the slowest is timed (the cores as busy as the run's
    ranks will keep them); `lockstep` (a real group: as many collectives on every rank): TIMED_STEPS steps."""
    if meet:
        meet.arrive()
    for _ in range(WARM_STEPS):
        step()
    times, load = [], HostLoad()
    load.start()
    while len(times) < MAX_STEPS and (len(times) < TIMED_STEPS or sum(times) < TIMED_S and not lockstep):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    on_host = {**load.rank_figures(), "host": socket.gethostname()}
    if meet:
        done = meet.timed()
        while meet.waiting(done):
            step()
    return statistics.median(times), on_host


def calls_of(step, strategy, layout) -> List[Call]:
    """The collectives one step makes, as the run's own counter sees them (metrics/counting.py: DTensor's too),
    each with the compute before it."""
    strategy.comm.log = []
    started = time.perf_counter()
    step()
    sizes, at = layout.record(), [started] + [entry[3] for entry in strategy.comm.log]
    return [Call(kind_of(called), nbytes, sizes.get(dim, layout.world), dim, after_s=at[i + 1] - at[i])
            for i, (called, nbytes, dim, _) in enumerate(strategy.comm.log)]


def _rank(rank: int, cfg, together: Path, out, real: bool = False,
          prepare: Optional[Callable[[int], None]] = None) -> None:
    if prepare is not None:   # the rank's environment, as its caller's launcher would set it
        prepare(rank)
    # torch's advice to the model's author (DTensor's sequential all-reduces under fsdp2 x tp, FSDP2's view outputs),
    # once per process: a run keeps it in its log; the console of a prediction is no place for it
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.")   # (DeepSpeed's older calls)
    out.put((rank, *free_step(cfg, rank, together, real)))


def free_steps(cfg, ranks: int, real: bool = False, prepare: Optional[Callable[[int], None]] = None
               ) -> List[Tuple[int, float, List[Call], Dict[str, object]]]:
    """Every rank's free step, all at once in processes of their own (spawned: a clean torch in each); `real`: on
    a gloo group (free_step), each process `prepare`d with its rank first."""
    if ranks == 1 and not real:
        return [(0, *free_step(cfg, 0))]
    out = mp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="ablate-free-steps-") as meet:
        mp.start_processes(_rank, args=(cfg, Path(meet) / "together", out, real, prepare), nprocs=ranks,
                           start_method="spawn")
        return sorted(out.get() for _ in range(ranks))


def refusal(cfg) -> Optional[str]:
    """Why this machine predicts no step of the run `cfg` asks for (None: it does)."""
    if cfg.launcher.nodes > 1:
        return "not predicted here: several nodes (this machine is one)"
    if cfg.parallel.pp > 1:
        return "not predicted here: pipelines (the schedule owns the step; no free step of it yet)"
    if cfg.parallel.name in NOT_FREE:
        return f"not predicted here: parallel={cfg.parallel.name} (DeepSpeed's engine does not run on a fake group)"
    if cfg.train.device == "cuda":
        return "not predicted here: a GPU run (its prediction is the GPU model's, docs/prediction.md)"
    return None


def groups_of(calls: List[Call]) -> List[int]:
    """The group sizes a step's collectives use (a group of one moves nothing: DDP on one process)."""
    return sorted({c.group for c in calls if c.group > 1})


def combine(cfg, seconds_by_rank: List[float], calls: List[Call], table, hosts: List[Dict]) -> Dict[str, object]:
    """The prediction from the ranks' free steps and rank 0's collectives, each costed by the probe's `table`
    after the compute before it (a fake collective takes no time); `hosts`: each rank's reading of the host's CPU
    over its timed steps (a prediction timed on a busy host is marked so, as a run is)."""
    ranks = len(seconds_by_rank)
    compute = max(seconds_by_rank)
    comm: Dict[str, float] = {}
    calls_by_dim: Dict[str, int] = {}
    for c in (c for c in calls if c.group > 1):
        comm[c.dim] = comm.get(c.dim, 0.0) + collectives.cost(table, c.kind, c.nbytes, c.group, c.after_s)
        calls_by_dim[c.dim] = calls_by_dim.get(c.dim, 0) + 1
    total = compute + sum(comm.values())
    tokens = global_tokens(cfg, parallel.layout_of(cfg))
    return {"step_time_s": total, "tokens_per_s": tokens / total, "mfu": None, "compute_s": compute,
            "compute_s_by_rank": list(seconds_by_rank), "bubble_s": 0.0, "comm_s": comm,
            "exposed_comm_s": comm, "calls": calls_by_dim,
            "probes": {str(g): f"{e['how']}; measured {e['measured_at']}" for g, e in sorted(table.items())},
            "host_load": {k: v for k, v in host_summary(None, hosts, hosts[0]["host"]).items()
                          if k in ("other_cpu_frac", "busy", "reason")},
            "rate_source": f"here: each rank's step timed with free collectives ({ranks} at once, "
                           f"{threads_per_rank(ranks)} thread(s) each) + the lockstep probe of gloo's collectives"}


def predict(cfg, cache: Optional[str] = None) -> Dict[str, object]:
    """The plan's `predicted` for the run `cfg` (an AblateConfig) on this machine: step_time_s, tokens_per_s,
    compute_s, comm_s and exposed_comm_s per mesh dim, calls per dim, and how (`rate_source`)."""
    why = refusal(cfg)
    if why:
        return {"step_time_s": None, "why": why}
    ranks = cfg.launcher.nproc_per_node
    steps = free_steps(cfg, ranks)
    calls = steps[0][2]
    return combine(cfg, [step[1] for step in steps], calls, collectives.table(ranks, groups_of(calls), cache),
                   [step[3] for step in steps])


# In a run (metrics.predict): each rank's free step before it joins the run's group (all ranks at once, as they
# start together), then rank 0 combines them with the probe's table (probed by the run's own ranks when this host
# has none): the run's summary.json `predicted`, made before its first step
OFF = "not predicted: metrics.predict=false (`python -m ablate.plan --hardware here` with the run's overrides)"


def not_predicted(cfg) -> Optional[str]:
    """Why a run predicts no step of its own (the knob off, or one this machine cannot predict); None: it does. The
    config alone decides, so every rank decides alike, before joining and after."""
    return OFF if not cfg.metrics.predict else refusal(cfg)


def before_joining(cfg, rank: int, together: Optional[Path]) -> Tuple[Optional[Tuple[float, List[Call], Dict]],
                                                                      Optional[str]]:
    """This rank's free step, or None and why not (metrics.predict off; a run this model cannot predict; a model
    whose step fails on a fake group: a prediction never stops a run that can train)."""
    why = not_predicted(cfg)
    if why:
        return None, why
    try:
        free = free_step(cfg, rank, together)
    except (RuntimeError, NotImplementedError, TypeError, ValueError, AssertionError) as e:
        return None, f"not predicted: the step with free collectives failed ({type(e).__name__}: {e})"[:300]
    finally:
        gc.collect()   # the free step's model and batches are gone before the run builds its own
    return free, None


def after_joining(cfg, rank: int, free, why: Optional[str], all_gather) -> Optional[Dict[str, object]]:
    """Rank 0's prediction from every rank's free step (`all_gather`: the run's object gather, which every rank
    calls where the run predicts: the config alone decides it), or why there is none; the other ranks' None."""
    if not_predicted(cfg):
        return {"step_time_s": None, "why": why}
    gathered = all_gather((free[0], free[2], why) if free else (None, None, why))
    failed = [w for seconds, _, w in gathered if seconds is None]
    if failed:
        return {"step_time_s": None, "why": failed[0]} if rank == 0 else None
    table = collectives.table_in_run(len(gathered), groups_of(free[1]), rank)
    return combine(cfg, [seconds for seconds, _, _ in gathered], free[1], table, [h for _, h, _ in gathered]) \
        if rank == 0 else None
