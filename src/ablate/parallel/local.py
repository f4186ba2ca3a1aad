"""parallel=none: one process, no communication."""
from ablate.parallel.base import Breakdown, TorchStrategy
from ablate.precision import Precision


class Local(TorchStrategy):
    """Everything the torch base does; nothing to reduce (comm stays 0)."""

    grad_reduce_dtype = None

    def __init__(self, model, parallel, train, optim_cfg, precision, device, world_size: int):
        super().__init__(model, train, optim_cfg, precision, device)

    @classmethod
    def plan_bytes(cls, numels, parallel, precision: Precision, world: int) -> Breakdown:
        n = float(sum(numels))
        return Breakdown(4 * n, 4 * n, 8 * n)     # fp32 parameters, gradients, Adam m + v
