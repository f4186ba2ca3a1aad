"""A user mistake in the config: one line naming the key and the valid choices, exit code 2, no traceback."""
from __future__ import annotations

import sys
from typing import NoReturn

EXIT_USAGE = 2   # what argparse and Hydra's own usage errors exit with


class ConfigError(ValueError):
    """A user mistake in the config: printed as one line, never a traceback."""


def fail(message: str) -> NoReturn:
    print(f"ablate: error: {message}", file=sys.stderr)
    sys.exit(EXIT_USAGE)
