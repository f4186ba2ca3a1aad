"""The choice matrix, enumerated from the registries (a choice added later is covered without a test):
every parallel x precision choice, on one process and on 2 local ranks, is either refused in one line before
anything starts or accepted and trains a few steps (pairwise, below). The decision is the preflight's (what
`python -m ablate` runs first); each distinct refusal is also typed on the command line: exit 2, that line,
no run dir.

Trained pairwise, not all three ways: a strategy that joins a process group even on one process (a world of
one) trains that path with the first precision (fp32); its other precisions train on 2 ranks (the same
strategy code), so their accepted 1-rank twins, 8 real runs (~150 s of CI), proved nothing more than the
preflight's acceptance checked here. parallel=none joins no group: each of its precisions trains on the one
process it has; fp32 and bf16 in two micro-steps, as the single-process references test_parallel.py compares
every strategy with (the same runs, not two more)."""
import functools
import math

import pytest

from ablate import parallel, precision
from ablate.compose import preflight
from ablate.config import ConfigError
from conftest import main_in_process

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trained")]   # shares `trained` runs
CASES = [(p, q, n) for p in parallel.REGISTRY for q in precision.REGISTRY for n in (1, 2)]
FIRST_PRECISION = next(iter(precision.REGISTRY))


def trains(par: str, prec: str, ranks: int) -> bool:
    """Whether an accepted case trains here (module docstring: pairwise)."""
    return ranks == 2 or prec == FIRST_PRECISION or not parallel.choice(par).needs_group


REFERENCES = ("fp32", "bf16")   # the precisions of test_parallel.py's single-process references


def run_of(par: str, prec: str, ranks: int) -> tuple:
    """The `trained` arguments of a case: parallel=none in fp32 or bf16 is test_parallel.py's reference."""
    if not parallel.choice(par).needs_group and prec in REFERENCES:
        return par, prec, ranks, "train.grad_accum=2"
    return par, prec, ranks


def overrides(par: str, prec: str, ranks: int):
    return [f"parallel={par}", f"precision={prec}", f"launcher.nproc_per_node={ranks}"]


@functools.lru_cache(maxsize=None)   # each case's preflight (two Hydra composes, ~0.3 s) once per worker, not twice
def refusal(par: str, prec: str, ranks: int):
    """None when this machine runs the combination, else the one-line reason the preflight gives."""
    try:
        preflight(overrides(par, prec, ranks))
    except ConfigError as e:
        return str(e)
    return None


@pytest.mark.parametrize("par,prec,ranks", CASES, ids=[f"{p}-{q}-{n}rank" for p, q, n in CASES])
def test_every_choice_trains_or_is_refused_in_one_line(par, prec, ranks, trained):
    why = refusal(par, prec, ranks)
    if why is not None:
        assert "\n" not in why and any(k in why for k in ("parallel", "precision", "launcher")), why
        return
    if not trains(par, prec, ranks):
        return          # accepted by the preflight; trained on 2 ranks and, in a world of one, with fp32
    summary, rows = trained(*run_of(par, prec, ranks))
    assert summary["world_size"] == ranks and len(summary["per_rank"]) == ranks
    assert summary["choices"]["parallel"] == par and summary["choices"]["precision"] == prec
    assert rows and all(math.isfinite(r["loss"]) for r in rows)
    assert summary["numerics"]["compute_dtype"]          # the strategy said what it ran


def distinct_refusals():
    seen = {}
    for case in CASES:
        why = refusal(*case)
        if why is not None:
            seen.setdefault(why.split(":")[1] if ":" in why else why, (case, why))
    return list(seen.values())


def test_each_kind_of_refusal_on_the_command_line(tmp_path, monkeypatch, capsys):
    """Through main() in process (~1 s each; a refused command in a process of its own: test_cli.py)."""
    kinds = distinct_refusals()
    assert len(kinds) >= 3          # fp8 without an sm_89 GPU, fp16 under fsdp2, parallel=none on 2 ranks...
    for (par, prec, ranks), why in kinds:
        run_dir = tmp_path / f"{par}-{prec}-{ranks}"
        assert main_in_process(monkeypatch, [*overrides(par, prec, ranks), f"hydra.run.dir={run_dir}"]) == 2
        assert capsys.readouterr().err.strip() == f"ablate: error: {why}"
        assert not run_dir.exists()
