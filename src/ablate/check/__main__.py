"""`python -m ablate.check [--config-dir DIR] [--steps N] [--rtol X] [--dir D] OVERRIDES` (check/__init__.py: the
two runs and their comparison): exit 0 same, 1 different, 2 bad input (one line)."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from ablate.check import RTOL, check
from ablate.check import __doc__ as CHECK_DOC
from ablate.config import AblateError, exit_code_of
from ablate.config import arguments as cli


def _parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ablate.check", description=CHECK_DOC.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=cli.count, default=8, help="optimizer steps each run trains (default 8)")
    parser.add_argument("--rtol", type=cli.share, default=None,
                        help="largest relative difference of a step's loss that is the same (default: by precision, "
                             + ", ".join(f"{k} {v:g}" for k, v in RTOL.items()) + ")")
    parser.add_argument("--dir", type=cli.out_dir, default=None,
                        help="where the two runs go (default: a temporary folder, kept when they differ)")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR", type=cli.in_dir,
                        help="a config dir of your own (model/, optim/, ... files)")
    parser.add_argument("overrides", nargs="*", help="the run's overrides, as for python -m ablate")
    return parser.parse_intermixed_args(argv)   # options before, between or after the overrides


def main(argv: Optional[List[str]] = None) -> None:
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        sys.exit(check(args))
    except AblateError as e:
        sys.exit(exit_code_of(e, "ablate.check"))


if __name__ == "__main__":
    main()
