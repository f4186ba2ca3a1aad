"""`python -m ablate.sweeps week4 | NAME [NAME ...] [-- overrides]`: run sweeps/ files one after another
into one folder, then `ablate.report` over it. Each sweep is `python -m ablate +sweeps=NAME` (a Hydra
multirun defined by its file); a failed sweep is reported and the others still run."""
from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import List

import yaml

from ablate import SWEEPS_DIR


def expand(names: List[str]) -> List[str]:
    out = []
    for name in names:
        path = SWEEPS_DIR / f"{name}.yaml"
        if not path.exists():
            valid = ", ".join(sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml")))
            raise SystemExit(f"ablate.sweeps: error: no sweep '{name}'; valid choices: {valid}")
        data = yaml.safe_load(path.read_text()) or {}
        out += data["sweeps"] if "sweeps" in data and isinstance(data["sweeps"], list) else [name]
    return out


def main(argv: List[str] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    names, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    if not names:
        print(__doc__, file=sys.stderr)
        return 2
    sweeps = expand(names)
    root = Path("multirun") / f"{'-'.join(names)}_{datetime.now():%Y-%m-%d_%H-%M-%S}"
    failed = []
    for i, name in enumerate(sweeps, 1):
        print(f"[{i}/{len(sweeps)}] {name} -> {root / name}", flush=True)
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "ablate", f"+sweeps={name}",
                                 f"hydra.sweep.dir={root / name}", *extra])
        print(f"[{i}/{len(sweeps)}] {name}: {'ok' if result.returncode == 0 else 'FAILED'} "
              f"in {time.monotonic() - started:.0f} s", flush=True)
        if result.returncode != 0:
            failed.append(name)
    from ablate import report

    code = report.main([str(root)]) if root.exists() else 2
    if failed:
        print(f"ablate.sweeps: {len(failed)} sweep(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else code


if __name__ == "__main__":
    sys.exit(main())
