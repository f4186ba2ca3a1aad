"""`python -m ablate.launcher.probe`: what a job's Python can do, asked in the environment the sbatch script gives it
(launcher/job_check.py runs the script's own environment lines, then this): its torch and CUDA build, and whether
it builds the run's model on the meta device (importing the user's module as the job will). Reads the pickled
model node on stdin; writes one JSON line on stdout; a model that does not build is the answer's `error`; a
Python without torch or ablate fails to start it, which the caller reads.
"""
from __future__ import annotations

import json
import pickle
import sys


def answer() -> dict:
    import torch

    from ablate.config import ConfigError
    from ablate.model import build

    out = {"python": sys.executable, "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        build(pickle.loads(sys.stdin.buffer.read()), "meta")
    except ConfigError as e:   # the one line a local run would say (a module that does not import, ...)
        out["error"] = str(e)
    except Exception as e:     # noqa: BLE001 - whatever the job's Python cannot do is the answer
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
    return out


if __name__ == "__main__":
    print(json.dumps(answer()), flush=True)
