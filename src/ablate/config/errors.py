"""What ablate's library code raises when a run cannot go on, and what the entry points make of it.

Library code never ends the process: it raises one of these typed exceptions, and the command-line entry
points (`python -m ablate`, `ablate.sweeps`, `ablate.report`, `ablate.plan`, `ablate.maxbatch`, the -m
launcher plugin) alone turn them into one line on stderr and an exit code (`exit_code_of`). Anything else
is a bug and keeps its traceback.
"""
from __future__ import annotations

import sys

EXIT_USAGE = 2   # what argparse and Hydra's own usage errors exit with


class AblateError(Exception):
    """A run that cannot go on for a reason the user can act on: one line, never a traceback."""
    exit_code = 1
    kind = ""

    def __init__(self, message: str, exit_code: int = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    def line(self, program: str = "ablate") -> str:
        return f"{program}: {self.kind}{self}"


class ConfigError(AblateError, ValueError):
    """A user mistake in the config or the command line: exit 2, before anything runs."""
    exit_code = EXIT_USAGE
    kind = "error: "


class RunStopped(AblateError):
    """The run ended early on purpose (a stop signal: 128 + its number; non-finite training: 1), with its
    checkpoint and how to continue in the message."""


class RunFailed(AblateError):
    """A rank, a Slurm job or an array task failed: the message names the root cause (rank, host, error)."""


def exit_code_of(error: AblateError, program: str = "ablate") -> int:
    """The entry points' one mapping: the error's line (`<program>: [error: ]<message>`), its exit code
    returned. On stderr; on stdout when the exit code is 0 (a stop that is no failure: a sweep's allocation
    requeued on its time-limit warning says so among its progress lines)."""
    print(error.line(program), file=sys.stderr if error.exit_code else sys.stdout, flush=True)
    return error.exit_code
