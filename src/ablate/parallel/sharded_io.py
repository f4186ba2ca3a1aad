"""Sharded state (DTensor parameters: FSDP2's shards, tensor parallelism) saved and loaded by each rank for its own
shards with torch.distributed.checkpoint (DCP), no gather on rank 0. Imported by the runs that shard only."""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from ablate.metrics.experts import mixtures_of


def options(model) -> StateDictOptions:
    """A pipeline's stages hold different parameters on different ranks, and a mixture's experts are a param group
    of their own under expert parallelism only (optim.by_mesh): the optimizer's param groups are written per
    parameter (flattened, as torchtitan does), or one rank's groups, or one ep's, would be read back."""
    per_parameter = getattr(model, "stages", None) is not None or any(mixtures_of(model))
    return StateDictOptions(flatten_optimizer_state_dict=per_parameter)


def save(model, optimizer, where: Path) -> None:
    model_state, optim_state = get_state_dict(model, optimizer, options=options(model))
    with plain_errors():
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(where))


def load(model, optimizer, where: Path) -> None:
    model_state, optim_state = get_state_dict(model, optimizer, options=options(model))
    state = {"model": model_state, "optimizer": optim_state}
    with plain_errors():
        dcp.load(state, checkpoint_id=str(where))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=options(model))


@contextlib.contextmanager
def plain_errors():
    """DCP gathers every rank's failure into one CheckpointException, which derives from BaseException (so
    `except Exception` misses it) and prints each rank's traceback: raise the root cause instead, the same on
    every rank, an OSError first (a full disk says ENOSPC on the rank that hit it, "unexpected pos" elsewhere)."""
    try:
        yield
    except CheckpointException as e:
        causes = [exc for exc, _trace in (e.failures[r] for r in sorted(e.failures))]
        raise next((c for c in causes if isinstance(c, OSError)), causes[0] if causes else OSError(str(e))) from None
