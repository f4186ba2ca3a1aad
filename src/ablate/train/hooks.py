"""Step hooks: code from outside ablate that runs on every rank as each step begins, named by
`ABLATE_STEP_HOOKS=module:function[,module:function...]` (the module importable from the PYTHONPATH).
A hook is called as `hook(rank, step)`; what it raises ends the run like any error of that rank.

The test suite plants its faults this way (tests/planted.py: a failing rank, a straggler), so the training
loop carries no fault injection of its own; a user can hang a probe or a debugger on a step the same way.
"""
from __future__ import annotations

import importlib
import os
from typing import Callable, List

from ablate.config import ConfigError

VARIABLE = "ABLATE_STEP_HOOKS"
Hook = Callable[[int, int], None]


def load() -> List[Hook]:
    """The hooks the environment names, imported once when a rank's loop starts."""
    hooks = []
    for spec in filter(None, (s.strip() for s in os.environ.get(VARIABLE, "").split(","))):
        module, _, name = spec.partition(":")
        try:
            hooks.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"{VARIABLE}={spec}: cannot be loaded ({e}); give module:function, the module on "
                              "the PYTHONPATH") from None
    return hooks
