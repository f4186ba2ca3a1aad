"""`python -m ablate.calibrate [--out FILE] [--config-dir DIR] OVERRIDES`: measure, on the machine at hand, every
figure of the step-time model it can (docs/prediction.md, "Calibrate"), and write them as a hardware file
(conf/hardware's keys, each figure's provenance in `provenance`) that `ablate.plan --hardware FILE` reads:

- matmul_tflops: torch.mm at the model's feed-forward shape (a micro-batch's tokens x dim x ffn_hidden; a user's
  model: 1024^3), per dtype column the device runs (a CPU: fp32 and bf16), the median of timed repeats;
- attention_tflops: SDPA forward and backward at the model's heads, head size and sequence, causal, in
  FlashAttention's FLOP convention (predict/kernels.py);
- memory_gbytes_per_s: a large elementwise add (two reads, one write);
- launch_us: one op on one-element tensors (a CPU's dispatch; a GPU's, synchronised at the end);
- collective_gbytes_per_s, collective_latency_us: the lockstep probe (predict/collectives.py) among the local
  processes a run would have (launcher.nproc_per_node), in the groups its layout makes, per kind: nccl-tests' bus
  bandwidth at the run's mean call (the comm model's bytes over its calls) in the group that carries the most
  bytes, the intercept of the line fitted to small calls the latency (several group sizes: a base and a hop per
  ring step through the smallest and the largest);
- op_us, autograd_us, optimizer_tensor_us, optimizer_us, overlap (calibrate/ops.py): each op of the run's forward
  and backward replayed at its shapes; what autograd adds to an op; the optimizer and clipping per parameter
  tensor; the run's optimizer step at the rank's sizes; the share of a collective that compute beside it hides;
- strategy_unit_us (calibrate/strategy.py): the strategy's own bookkeeping per unit, on the model's structure
  shrunk to nothing;
- framework_unit_us (calibrate/strategy.py): what a unit's forward and backward cost beyond its ops (module calls,
  the loop), the shrunk model's step alone less what the file's per-op figures price it at;
- peak_tflops: the measured matmul rates (on a CPU there is no datasheet: MFU against what this machine does).
Nothing is fitted to training: each figure is one kernel's or one loop's, timed alone.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import psutil
import torch
import yaml

from ablate import hardware, usable_cores
from ablate.calibrate.ops import micro_batch, overlap_share, per_op, per_op_together, timed
from ablate.calibrate.strategy import alone_seconds, framework_unit_seconds, shrinkable, unit_seconds
from ablate.compose import config_of
from ablate.config import ConfigError, ModelConfig, exit_code_of
from ablate.metrics.host import cpu_model
from ablate.model.facts import measure
from ablate.parallel import layout_of
from ablate.parallel.comm_model import expected_comm
from ablate.predict import OPTIMIZER_BYTES, collectives, flops_of, step_of
from ablate.predict.network import BUS_FACTOR

COLUMNS = {"fp32": torch.float32, "bf16": torch.bfloat16}
BUS = {k: BUS_FACTOR[k] for k in ("all_gather", "reduce_scatter", "all_reduce")}


def shapes(cfg) -> Dict[str, int]:
    m, t = cfg.model, cfg.train
    if isinstance(m, ModelConfig):
        return {"tokens": t.batch_size * t.seq_len, "dim": m.dim, "ffn": m.ffn_hidden, "batch": t.batch_size,
                "heads": m.n_heads, "head_dim": m.dim // m.n_heads, "seq": t.seq_len}
    return {"tokens": 1024, "dim": 1024, "ffn": 1024, "batch": t.batch_size, "heads": 8, "head_dim": 64,
            "seq": t.seq_len}


def matmul_rate(s: Dict[str, int], dtype, device) -> float:
    a = torch.randn(s["tokens"], s["dim"], dtype=dtype, device=device)
    b = torch.randn(s["dim"], s["ffn"], dtype=dtype, device=device)
    return 2.0 * s["tokens"] * s["dim"] * s["ffn"] / timed(lambda: a @ b, device)


def attention_rate(s: Dict[str, int], dtype, device) -> float:
    q = torch.randn(s["batch"], s["heads"], s["seq"], s["head_dim"], dtype=dtype, device=device, requires_grad=True)
    grad = torch.randn_like(q)

    def step():
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).backward(grad)

    forward = 4.0 * s["batch"] * s["heads"] * s["seq"] ** 2 * s["head_dim"] * 0.5
    return forward * 3.5 / timed(step, device)   # forward + backward (2.5x), FlashAttention's convention


def memory_rate(device) -> float:
    n = 1 << 24   # 64 MB a float32 operand: past any cache
    a, b = torch.randn(n, device=device), torch.randn(n, device=device)
    out = torch.empty_like(a)
    return 3.0 * 4 * n / timed(lambda: torch.add(a, b, out=out), device)


def launch_seconds(device) -> float:
    a = torch.ones(1, device=device)
    return timed(lambda: [a.add(1.0) for _ in range(100)], device) / 100


def collective_figures(entry: Dict, group: int, call_bytes: float) -> Dict[str, Dict[str, float]]:
    """{kind: busbw bytes/s} at the run's size of call and {base: latency s} from the lockstep probe's (`entry`)
    least-work segment, in groups of `group` ranks; and {work s: base latency s} from each of its segments
    (`after`): a call costs more the longer the compute before it. The bus bandwidth is nccl-tests' at that size
    (bus factor x bytes / the call's time less its latency): past the caches a byte costs more."""
    least = entry["costs"][0]
    busbw = {}
    for kind, factor in BUS.items():
        latency, per_byte = collectives.small_line(least[kind])
        beyond_latency = collectives.by_size(least[kind], call_bytes) - latency
        if per_byte and beyond_latency > 0:
            busbw[kind] = factor(group) * call_bytes / beyond_latency
    after = {segment["work_s"]: statistics.median(collectives.small_line(segment[kind])[0] for kind in BUS)
             for segment in entry["costs"]}
    return {"busbw": busbw, "latency": {"base": after[least["work_s"]]}, "after": after}


def planned(cfg) -> Tuple[object, List[int]]:
    """The run's step as the plan models it (predict.step_of: its calls, its optimizer's signature) and the sizes of
    the parameters a rank's optimizer steps: each tensor's share of the rank's elements (FSDP and ZeRO shard every
    tensor, tp splits the model)."""
    facts = measure(cfg)
    layout = layout_of(cfg)
    n_params = sum(facts.numels)
    step = step_of(cfg, layout, flops_of(cfg.model, cfg.train.seq_len), expected_comm(cfg, layout, n_params),
                   facts.blocks.get("count") or 0, n_params, by_signature=True)
    on_rank = step.optimizer_bytes / OPTIMIZER_BYTES.get(cfg.optim.name, OPTIMIZER_BYTES["adamw"])
    tensors = round(step.param_tensors) or len(facts.numels)
    numels = [n * on_rank / n_params for n in facts.numels] if tensors == len(facts.numels) else \
        [on_rank / tensors] * tensors
    return step, [max(1, round(n)) for n in numels]


def call_bytes(step) -> float:
    """The run's mean bytes a collective call (the comm model's bytes over its calls, every dim): the size its bus
    bandwidth is read at."""
    priced = [(nbytes, step.calls.get(dim, 0.0)) for dim, nbytes in step.comm_bytes.items()
              if nbytes and step.calls.get(dim)]
    return sum(b for b, _ in priced) / sum(c for _, c in priced) if priced else float(collectives.SMALL[-1])


def ring_latency(probes: Dict[int, Dict], call_bytes: float) -> Tuple[float, Dict[float, float]]:
    """(seconds a ring step adds to a call, {work s: base latency s}) from the probes of a layout's group sizes: NCCL's
    ring model (predict/network.py's latency_s: a base plus a hop per ring step) through the smallest and the
    largest group's least-work latencies; one group size: no hop, its own figures."""
    low, high = min(probes), max(probes)
    after = collective_figures(probes[low], low, call_bytes)["after"]
    if high == low:
        return 0.0, after
    least = min(after)
    hop = (collective_figures(probes[high], high, call_bytes)["latency"]["base"] - after[least]) / (high - low)
    return hop, {work: seconds - (low - 1) * hop for work, seconds in after.items()}


def groups_of(step, procs: int) -> Tuple[List[int], int]:
    """The group sizes a run's collectives use (its dims of more than one rank; none: the `procs` local processes in
    one) and the one that carries the most of its bytes (its bus bandwidth is read there)."""
    sizes = {dim: step.sizes[dim] for dim in step.comm_bytes if step.sizes.get(dim, 1) > 1}
    if not sizes:
        return [procs], procs
    main = max(sizes, key=lambda dim: step.comm_bytes[dim] or 0.0)
    return sorted(set(sizes.values())), sizes[main]


def collective_entries(step, procs: int, stamp: str) -> Tuple[Dict[str, object], Dict[str, str]]:
    """The collective figures of the hardware file and their provenance: the lockstep probe among the run's `procs`
    local processes in the groups its layout makes (cached per host, as the runs' own predictions read it)."""
    size = call_bytes(step)
    groups, main = groups_of(step, procs)
    probes = collectives.table(procs, groups)
    figures = collective_figures(probes[main], main, size)
    hop, after = ring_latency(probes, size)
    out = {"collective_gbytes_per_s": {k: v / 1e9 for k, v in figures["busbw"].items()},
           "collective_latency_us": {"base": after[min(after)] * 1e6, "hop_nvlink": hop * 1e6, "hop_network": 0.0},
           "collective_latency_after_us": {round(w * 1e6, 1): s * 1e6 for w, s in after.items()}}
    groups_text = " and ".join(str(g) for g in groups)
    provenance = {
        "collective_latency_after_us": f"{stamp}): the lockstep probe's base latency (the median of its kinds' "
                                       f"lines) after each of its amounts of work (us), groups of {groups_text} "
                                       f"among {procs} processes (several sizes: a ring step's hop through the "
                                       "smallest and the largest)",
        "collective_gbytes_per_s": f"{stamp}): the lockstep probe, {procs} gloo processes in groups of {main} (the "
                                   f"layout's most bytes), per kind at the run's mean call ({size / 2**20:.2f} MB): "
                                   "bus factor x bytes / (its time less the fitted latency)"}
    return out, provenance


def stamp_of(device: torch.device) -> str:
    """A figure's provenance, up to how it was measured: this host, its part, torch, now."""
    part = cpu_model() if device.type == "cpu" else torch.cuda.get_device_name(device)
    return (f"measured here ({socket.gethostname()}, {part}, torch {torch.__version__}, "
            f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}")


def measured(cfg, device: torch.device, procs: int, argv: List[str], without: Optional[float]) -> Dict[str, object]:
    """Every figure this machine gives, with its provenance; `without`: the shrunk model's step alone
    (calibrate/strategy.py's alone_seconds; None where it has none)."""
    s = shapes(cfg)
    stamp = stamp_of(device)
    matmul = {c: matmul_rate(s, d, device) / 1e12 for c, d in COLUMNS.items()}
    attention = {c: attention_rate(s, d, device) / 1e12 for c, d in COLUMNS.items()}
    together = procs > 1 and device.type == "cpu"   # timed as the ranks will run them: all at once
    step, numels = planned(cfg)
    shard = (step.optimizer_signature, numels)
    out: Dict[str, object] = {
        "matmul_tflops": matmul, "attention_tflops": attention,
        "memory_gbytes_per_s": memory_rate(device) / 1e9, "launch_us": launch_seconds(device) * 1e6,
        **(per_op_together(cfg, procs, torch.get_num_threads(), shard) if together else per_op(cfg, device, shard))}
    at_once = f", in {procs} processes at once (the mean)" if together else ""
    provenance = {"matmul_tflops": f"{stamp}): torch.mm {s['tokens']} x {s['dim']} x {s['ffn']}, median",
                  "attention_tflops": f"{stamp}): SDPA causal forward + backward, batch {s['batch']}, {s['heads']} "
                                      f"heads of {s['head_dim']}, {s['seq']} tokens",
                  "memory_gbytes_per_s": f"{stamp}): torch.add of two 64 MB float32 tensors",
                  "launch_us": f"{stamp}): one add on a one-element tensor",
                  "autograd_us": f"{stamp}): 64 multiplications under autograd, forward and backward, per op, "
                                 f"less one called bare{at_once}",
                  "optimizer_tensor_us": f"{stamp}): the run's optimizer and gradient clipping over 64 "
                                         f"parameters of 16 elements, per parameter{at_once}",
                  "optimizer_us": f"{stamp}): the run's optimizer step (clipping, step, gradients let go) over a "
                                  f"rank's {len(numels)} parameters of its own sizes, median{at_once}",
                  "op_us": f"{stamp}): each op of {micro_batch(cfg)} sequence(s)' forward and backward of this "
                           f"model, replayed at its shapes in the step's order, median{at_once}"}
    unit = unit_seconds(argv, cfg, without) if without is not None else None
    if unit is not None:
        out["strategy_unit_us"] = {unit[0]: unit[1] * 1e6}
        provenance["strategy_unit_us"] = (f"{stamp}): the step of this model's blocks at a few elements a matrix "
                                          "with the strategy on a gloo group, less the calls the network model "
                                          "prices, less it on one rank alone, per unit (blocks + 1)")
    if procs > 1 and device.type == "cpu":
        figures, sources = collective_entries(step, procs, stamp)
        out.update(figures)
        provenance.update(sources)
        out["overlap"] = overlap_share(max(1, usable_cores() // procs))
        provenance["overlap"] = (f"{stamp}): 2 gloo processes, a 4 MB all-reduce issued asynchronously beside a "
                                 "matmul loop, against the two one after the other (above 1: the host was busy; "
                                 "the model hides at most what a schedule lets it)")
    out["provenance"] = provenance
    return out


def hardware_file(figures: Dict[str, object], device: torch.device, threads: int) -> Dict[str, object]:
    cpu = device.type == "cpu"
    name = f"calibrated-{socket.gethostname()}"
    memory = psutil.virtual_memory().total if cpu else torch.cuda.get_device_properties(device).total_memory
    busbw = figures.get("collective_gbytes_per_s") or {}
    return {"name": name, "device_names": ["CPU" if cpu else torch.cuda.get_device_name(device)],
            "memory_gib": round(memory / 2**30, 2), "peak_tflops": dict(figures["matmul_tflops"]),
            "nvlink_gbytes_per_s": 2 * busbw["all_gather"] if busbw.get("all_gather") else None,
            "network_gbits_per_s": None, **figures,
            "provenance": {**figures["provenance"], "peak_tflops": "the measured matmul rates (no datasheet)",
                           "threads": f"{threads} per process"}}


def with_framework(node: Dict[str, object], seconds: float, stamp: str) -> None:
    """The file's framework_unit_us and its provenance (calibrate/strategy.py's framework_unit_seconds)."""
    node["framework_unit_us"] = seconds * 1e6
    node["provenance"]["framework_unit_us"] = (f"{stamp}): the step of this model's blocks at a few elements a matrix "
                                               "on one rank alone, less what this file's per-op figures price it at, "
                                               "per unit (blocks + 1) and forward-backward")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m ablate.calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="calibrated.yaml", help="the hardware file to write (default: %(default)s)")
    ap.add_argument("--config-dir", action="append", default=[], help="your config directory (as python -m ablate)")
    ap.add_argument("overrides", nargs="*", help="the run to calibrate for (its model's shapes, its processes)")
    return ap


def main(argv: List[str] = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    folder = Path(args.out).resolve().parent
    if not (folder.is_dir() and os.access(folder, os.W_OK)):   # said before a minute of measuring, not after
        print(f"ablate.calibrate: error: --out {args.out}: {folder} is not a folder this user can write to",
              file=sys.stderr)
        return 2
    try:
        argv = [*(f"--config-dir={d}" for d in args.config_dir), *args.overrides]
        cfg = config_of(argv)[1]
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        procs = cfg.launcher.nproc_per_node
        threads = max(1, usable_cores() // procs)
        torch.set_num_threads(threads)
        without = alone_seconds(argv, cfg) if device.type == "cpu" and shrinkable(cfg) else None
        node = hardware_file(measured(cfg, device, procs, argv, without), device, threads)
        Path(args.out).write_text(yaml.safe_dump(node, sort_keys=False))
        if without is not None:   # priced by the figures just written
            with_framework(node, framework_unit_seconds(argv, cfg, without, hardware.load(Path(args.out))),
                           stamp_of(device))
            Path(args.out).write_text(yaml.safe_dump(node, sort_keys=False))
    except ConfigError as e:
        return exit_code_of(e)
    except OSError as e:
        print(f"--out {args.out}: cannot be written ({e.strerror})", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: matmul {node['matmul_tflops']}, attention {node['attention_tflops']} TFLOP/s, "
          f"memory {node['memory_gbytes_per_s']:.1f} GB/s, launch {node['launch_us']:.1f} us; "
          f"python -m ablate.plan --hardware {args.out} ... predicts with them")
    return 0
