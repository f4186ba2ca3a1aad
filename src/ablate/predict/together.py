"""The ranks' free steps (here.py) at one time, as the run's ranks share the cores: each starts its timed steps when
every rank has built its step, and keeps stepping, untimed, until the slowest is timed. Without it a rank that
built first timed its steps on emptier cores: a run's own prediction of fsdp2 x tp2 on 4 ranks read 17% short where
the same steps spawned together read 1%. The ranks have not joined any process group yet, so they meet in a
FileStore on this host (several nodes are not predicted).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch.distributed as dist

# the most a rank waits for the others: a rank that never comes (it failed to build) costs the prediction its
# company, never the run its start
WAIT_S = 120.0


class Together:
    def __init__(self, path: Path, world: int):
        self.store, self.world = dist.FileStore(str(path), world), world
        self.arrived = self.done = False

    def count(self, key: str) -> int:
        return int(self.store.add(key, 0))

    def arrive(self) -> None:
        """This rank has built its step: wait until every rank has (or WAIT_S)."""
        self.store.add("arrived", 1)
        self.arrived = True
        deadline = time.monotonic() + WAIT_S
        while self.count("arrived") < self.world and time.monotonic() < deadline:
            time.sleep(0.002)

    def timed(self) -> float:
        """This rank has timed its steps; when."""
        self.store.add("timed", 1)
        self.done = True
        return time.monotonic()

    def waiting(self, since: float) -> bool:
        """Some rank is still timing its steps (asked for at most WAIT_S after this one's were timed)."""
        return self.count("timed") < self.world and time.monotonic() - since < WAIT_S

    def leave(self) -> None:
        """Counted as arrived and timed whatever happened: no rank waits on one whose free step failed."""
        if not self.arrived:
            self.store.add("arrived", 1)
        if not self.done:
            self.store.add("timed", 1)
