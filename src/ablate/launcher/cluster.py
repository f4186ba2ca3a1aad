"""launcher=slurm: what the cluster offers against what `launcher.*` asks, checked before submitting.

A request no node can hold is not an error to sbatch: the job pends forever (Reason=PartitionConfig,
PartitionNodeLimit) and nothing says why. So the partition is read from the controller first
(`scontrol show partition -o`: nodes, MaxNodes, MaxTime, state; `sinfo -N`: each node's CPUs, memory
and GPUs from its gres) and a request that cannot run is refused in one line that says what was asked,
what exists and which key to change. `launcher.check_cluster=false` skips this (e.g. when the submitting
host cannot query the controller).
"""
from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from ablate.config import ConfigError, LauncherConfig


@dataclass
class Node:
    name: str
    cpus: int
    mem_mb: int
    gpus: int


@dataclass
class Partition:
    name: str
    default: bool = False
    state: str = "UP"
    max_nodes: Optional[int] = None        # None: UNLIMITED
    max_time_min: Optional[int] = None     # None: UNLIMITED / INFINITE
    max_time_text: str = "UNLIMITED"
    nodes: List[Node] = field(default_factory=list)


def slurm_minutes(text: str) -> Optional[int]:
    """Slurm's time format ([D-]HH:MM:SS, MM:SS, MM) in whole minutes; None for UNLIMITED/INFINITE."""
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:   # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = (parts + [0, 0])[:3]
    else:      # MM, MM:SS, HH:MM:SS
        hours, minutes, seconds = ([0] + parts + [0])[:3] if len(parts) < 3 else parts
    return (int(days or 0) * 24 + hours) * 60 + minutes + (1 if seconds else 0)


def gpu_count(gres: str) -> int:
    """GPUs in a node's gres ("gpu:8", "gpu:h100:8(S:0-1)", "gpu:a100:4,gpu:v100:2"); 0 for "(null)"."""
    total = 0
    for item in gres.split(","):
        m = re.match(r"gpu(?::[^:(]+)?:(\d+)", item.strip())
        total += int(m.group(1)) if m else 0
    return total


def parse_partitions(text: str) -> Dict[str, Partition]:
    """`scontrol show partition -o`: one partition per line of Key=Value pairs."""
    out = {}
    for line in text.splitlines():
        kv = dict(p.split("=", 1) for p in line.split() if "=" in p)
        if "PartitionName" not in kv:
            continue
        max_nodes = kv.get("MaxNodes", "UNLIMITED")
        out[kv["PartitionName"]] = Partition(
            kv["PartitionName"], default=kv.get("Default") == "YES", state=kv.get("State", "UP"),
            max_nodes=None if max_nodes == "UNLIMITED" else int(max_nodes),
            max_time_min=slurm_minutes(kv.get("MaxTime", "UNLIMITED")), max_time_text=kv.get("MaxTime", "UNLIMITED"))
    return out


def parse_nodes(text: str) -> List[Node]:
    """`sinfo -h -N -o %N|%c|%m|%G`: one node per line (a node in two partitions is listed once here)."""
    nodes = {}
    for line in text.splitlines():
        if line.count("|") == 3:
            name, cpus, mem, gres = line.split("|")
            nodes[name] = Node(name, int(cpus), int(mem.rstrip("+")), gpu_count(gres))
    return list(nodes.values())


def _query(*cmd: str) -> str:
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise ConfigError(f"launcher=slurm: the Slurm controller does not answer ({reason}); start it (slurm/"
                          "start_local.sh for a local one), use launcher=local, or skip this check with "
                          "launcher.check_cluster=false")
    return done.stdout


def partition(name: Optional[str]) -> Partition:
    """The partition the job goes to (launcher.partition, else the cluster's default), with its nodes."""
    partitions = parse_partitions(_query("scontrol", "show", "partition", "-o"))
    if name is None:
        name = next((p.name for p in partitions.values() if p.default), None)
        if name is None:
            raise ConfigError("launcher.partition is not set and the cluster has no default partition; valid "
                              f"choices: {', '.join(partitions)}")
    if name not in partitions:
        raise ConfigError(f"launcher.partition={name}: no such partition on this cluster; valid choices: "
                          f"{', '.join(partitions) or '(none)'}")
    found = partitions[name]
    found.nodes = parse_nodes(_query("sinfo", "-h", "-N", "-p", name, "-o", "%N|%c|%m|%G"))
    return found


def refusal(lc: LauncherConfig, part: Partition) -> Optional[str]:
    """Everything in the request that this partition can never run, in one line (each problem with its fix, all at
    once: a request is mended in one go); None if it fits."""
    found = problems(lc, part)
    return "; and ".join(found) if found else None


def problems(lc: LauncherConfig, part: Partition) -> List[str]:
    where = f"partition '{part.name}'"
    out = []
    if not part.state.upper().startswith("UP"):
        out.append(f"{where} is {part.state}: jobs would wait until an administrator brings it up")
    if lc.nodes > len(part.nodes):
        have = len(part.nodes)
        out.append(f"launcher.nodes={lc.nodes}: {where} has {have} node(s); use launcher.nodes<={have}")
    elif part.max_nodes is not None and lc.nodes > part.max_nodes:
        out.append(f"launcher.nodes={lc.nodes}: {where} allows at most {part.max_nodes} node(s) per job (MaxNodes)")
    if part.max_time_min is not None and lc.timeout_min > part.max_time_min:
        out.append(f"launcher.timeout_min={lc.timeout_min}: {where} allows at most {part.max_time_min} min (MaxTime="
                   f"{part.max_time_text}); use launcher.timeout_min<={part.max_time_min}")
    return out + _node_problems(lc, part, nodes_said=bool(out) and out[-1].startswith("launcher.nodes"))


def _node_problems(lc: LauncherConfig, part: Partition, nodes_said: bool) -> List[str]:
    """Each node must hold nproc_per_node tasks of cpus_per_task CPUs, mem_gb and gpus_per_node GPUs."""
    cpus, mem_mb, gpus = lc.nproc_per_node * lc.cpus_per_task, (lc.mem_gb or 0) * 1024, lc.gpus_per_node
    fits = [n for n in part.nodes if n.cpus >= cpus and n.mem_mb >= mem_mb and n.gpus >= gpus]
    if len(fits) >= lc.nodes or not part.nodes:
        return []
    where = f"the nodes of partition '{part.name}'"
    out = []
    most_cpus = max(n.cpus for n in part.nodes)
    if cpus > most_cpus:
        per_task = most_cpus // lc.nproc_per_node
        change = (f"use launcher.cpus_per_task<={per_task}" if per_task else
                  f"use launcher.nproc_per_node<={most_cpus} with launcher.cpus_per_task=1")
        out.append(f"launcher.nproc_per_node={lc.nproc_per_node} x launcher.cpus_per_task={lc.cpus_per_task} = "
                   f"{cpus} CPUs per node, but {where} have at most {most_cpus} CPUs; {change}")
    most_gpus = max(n.gpus for n in part.nodes)
    if gpus > most_gpus:
        have = f"at most {most_gpus} GPUs" if most_gpus else "no GPUs (no gpu gres)"
        out.append(f"launcher.gpus_per_node={gpus}: {where} have {have}; use launcher.gpus_per_node<={most_gpus}")
    most_mem = max(n.mem_mb for n in part.nodes)
    if mem_mb > most_mem:
        out.append(f"launcher.mem_gb={lc.mem_gb}: {where} have at most {most_mem // 1024} GB (RealMemory={most_mem} "
                   f"MB); use launcher.mem_gb<={most_mem // 1024}, or null for the node's default")
    if not out and not nodes_said:
        out.append(f"launcher.nodes={lc.nodes}: only {len(fits)} of {where} have {cpus} CPUs, {lc.mem_gb or 0} GB "
                   f"and {gpus} GPUs together; use launcher.nodes<={len(fits)}")
    return out


def check(lc: LauncherConfig) -> None:
    """Refuse in one line what the partition can never run (launcher.check_cluster=false skips it)."""
    if not lc.check_cluster:
        return
    reason = refusal(lc, partition(lc.partition))
    if reason:
        raise ConfigError(f"{reason} (the job would pend forever; launcher.check_cluster=false submits it anyway)")


# Pending reasons that never clear by themselves (squeue %r); the job would wait forever.
UNRUNNABLE = {
    "PartitionConfig": "the request exceeds what the partition's nodes have (CPUs, memory, GPUs)",
    "PartitionNodeLimit": "the job asks for more nodes than the partition has or allows",
    "PartitionTimeLimit": "launcher.timeout_min exceeds the partition's MaxTime",
    "ReqNodeNotAvail": "the nodes it needs are down, drained or reserved",
    "BadConstraints": "launcher.constraint matches no node",
    "InvalidAccount": "launcher.account is not valid here",
    "InvalidQOS": "launcher.qos is not valid here",
    "DependencyNeverSatisfied": "a job it depends on can never satisfy the dependency",
}


def queue_state(job_id: str) -> Optional[tuple]:
    """(state, pending reason) from squeue, or None once the job has left the queue (or squeue fails)."""
    try:
        done = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T|%r"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
    return tuple(line.split("|", 1)) if "|" in line else None


def unrunnable(reason: str) -> Optional[str]:
    """Why a pending reason means the job can never start, or None if it may still clear."""
    key = reason.split(",")[0].strip()
    return UNRUNNABLE.get(key)


def stuck(state: Optional[tuple]) -> Optional[str]:
    """The pending reason of a job (squeue's (state, reason)) that can never start, or None."""
    return state[1] if state and state[0] == "PENDING" and unrunnable(state[1]) else None


class QueueWatch:
    """The job's state and pending reason as they change: one updating line in a terminal, one line per
    change in a log."""

    def __init__(self, job_id: str, stream, tty: bool):
        self.job_id, self.stream, self.tty = job_id, stream, tty
        self.last: Optional[tuple] = None
        self.open_line = False

    def update(self, state: tuple, elapsed_s: float) -> None:
        state_name, reason = state
        text = f"[slurm] job {self.job_id}: {state_name}" + (f" ({reason})" if reason and reason != "None" else "")
        if self.tty and state_name == "PENDING":
            self.stream.write(f"\r{text}, waiting {elapsed_s:.0f} s\033[K")
            self.stream.flush()
            self.open_line = True
        elif state != self.last:
            self.end_line()
            print(text, file=self.stream, flush=True)
        self.last = state

    def end_line(self) -> None:
        if self.open_line:
            self.stream.write("\n")
            self.open_line = False


def show_new(path: Path, shown: int, final: bool = False, stream=None, prefix: str = "[slurm] ") -> int:
    """Print what the log gained since byte `shown` (complete lines until `final`), each line after `prefix`,
    to `stream` (stderr by default); return the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(shown)
            new = f.read()
    except OSError:
        return shown
    complete = new if final else new[:new.rfind(b"\n") + 1]
    for line in complete.decode(errors="replace").splitlines():
        print(f"{prefix}{line}", file=stream or sys.stderr, flush=True)
    return shown + len(complete)
