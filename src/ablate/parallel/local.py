"""parallel=none: one data-parallel rank, no gradient reduction; with parallel.tp > 1, that rank's layers split over
tp processes (tp.py), whose collectives are counted on the mesh's `tp` dim."""
from ablate.parallel.base import TorchStrategy
from ablate.parallel.state_bytes import Breakdown
from ablate.precision import Precision


class Local(TorchStrategy):
    """Everything the torch base does; no gradient to reduce (comm: tensor parallelism's alone)."""

    grad_reduce_dtype = None

    def __init__(self, model, parallel, train, optim_cfg, precision, device, layout, mesh):
        super().__init__(model, train, optim_cfg, precision, device, layout, mesh)

    @classmethod
    def plan_bytes(cls, numels, parallel, precision: Precision, layout) -> Breakdown:
        n = float(sum(numels))
        return Breakdown(4 * n, 4 * n, 8 * n)     # fp32 parameters, gradients, Adam m + v
