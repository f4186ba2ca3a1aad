"""parallel=none: one process, no communication."""
from ablate.parallel.base import Strategy


class Local(Strategy):
    """Everything the base does; nothing to reduce (comm stays 0)."""
