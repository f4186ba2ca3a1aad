"""Shared helpers: Hydra's real compose API on conf/, and real runs: in this process (a 1-rank run trains here), as
`python -m ablate` (a process of its own: what a user types), or with the command's front in this process and its
work in processes of its own (several ranks, Slurm's tasks, a driver's runs: launch_in_process, cli_in_process,
drive_in_process), which saves each such run a launcher's imports, ~3-7 CPU-s on a 2-core host bound by CPU."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, List

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ablate import CONF_DIR
from ablate.compose import validate
from ablate.config.store import register

REPO = Path(__file__).resolve().parents[1]
# What a launcher, Slurm or a W&B login would have put in the environment, removed once for the whole test
# run: the suite runs as a user's plain shell would, and every `python -m ablate` it starts inherits this.
RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
LAUNCHER_PREFIXES = ("SLURM_", "TORCHELASTIC_", "SUBMITIT_", "OMPI_COMM_WORLD_", "PMI_")
CREDENTIALS = ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_BASE_URL", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RUN_GROUP")


def launcher_variables() -> Dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k in RANK_VARIABLES or k in CREDENTIALS or k.startswith(LAUNCHER_PREFIXES)}


for _name in launcher_variables():
    del os.environ[_name]
register()
# The parallel tier runs 3 workers on this 2-core host: a run with torch's default (a thread per core) then
# spins OpenMP threads on cores another worker holds, 8.1 CPU-s for the default 40-step run beside two busy
# processes against 4.9 with one thread, and ~1.6x its wall time. Each process a worker starts takes one
# thread, as torchrun gives each of several processes on a host (the README's commands too, in their bare
# environment of PATH and HOME: test_readme.py); the serial tier (timings) keeps torch's default.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# measured peaks (and the noise floor) go to a cache of the test session's own, never the user's
SESSION_CACHE = os.environ["ABLATE_CACHE_DIR"] = tempfile.mkdtemp(prefix="ablate-test-cache-")
atexit.register(shutil.rmtree, SESSION_CACHE, True)   # (each run of the suite left one per process in /tmp)


def fixed_collective_probes() -> Dict[str, object]:
    """This host's probe of gloo's collectives (predict/collectives.py) as fixed figures, for every run of the
    session that predicts its step: no test times collectives (~10-40 s a rank count here) but the one that probes
    for real (test_predict_here.py, serial, which drops its entry first). 0.3 ms + 1 ns a byte after short work,
    twice that after long."""
    from ablate.predict import collectives

    def segment(work_s: float, f: float) -> Dict[str, object]:
        line = [[n, f * (3e-4 + n * 1e-9)] for n in collectives.SIZES]
        return {"work_s": work_s, **{kind: line for kind in collectives.KINDS}}

    entry = {"costs": [segment(5e-4, 1.0), segment(2.5e-3, 1.5), segment(1e-2, 2.0)], "measured_at": "fixed",
             "how": "fixed figures of the test session (tests/conftest.py)"}
    return {collectives.key(procs, group): entry for procs in (2, 4) for group in (2, 4) if group <= procs}


(Path(SESSION_CACHE) / "collectives.json").write_text(json.dumps(fixed_collective_probes()))


def _sigint_as_a_terminal_leaves_it() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# Popen arguments for a command typed in a terminal, for the tests that press Ctrl-C: its own process group (the
# terminal's Ctrl-C goes to the whole group) and SIGINT at its default, whatever this test run inherited (a suite
# started with `&` from a script has SIGINT ignored, and an ignored signal stays ignored across exec: its
# commands would then rightly ignore a Ctrl-C, as background jobs do).
AS_TYPED_IN_A_TERMINAL = {"start_new_session": True, "preexec_fn": _sigint_as_a_terminal_leaves_it}


def group_choices(group: str) -> List[str]:
    """The choices Hydra itself knows for a group."""
    from ablate.compose import choices, hydra_context

    with hydra_context():
        return choices(group)


def compose_cfg(overrides: List[str] = ()):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name="test"):
        return compose("config", overrides=list(overrides))


def run_in_process(tmp_path: Path, overrides: List[str] = ()) -> Dict:
    """Compose + validate + launch, as `python -m ablate` does, inside this process."""
    from ablate import launcher

    cfg = compose_cfg(["logger=none", *overrides])
    typed = validate(cfg)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    return launcher.launch(typed, resolved, tmp_path, {"precision": typed.precision.name})


def main_in_process(monkeypatch, args: List[str]) -> int:
    """`python -m ablate ARGS` as its main() in this process (no interpreter and imports to pay for): the exit
    code it would leave with (0 when main returned)."""
    monkeypatch.setattr(sys, "argv", ["ablate", *args])
    return _entry_main()


def _entry_main() -> int:
    from ablate import __main__ as entry

    try:
        entry.main()
    except SystemExit as e:
        return e.code or 0
    return 0


COMMAND_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}   # what every command the tests start runs with
LAUNCHER_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@contextmanager
def as_a_process_of_its_own():
    """An entry point run in this process leaves it as it found it: what torch's elastic agent or a driver sets
    (handlers on SIGINT/SIGTERM/SIGHUP/SIGQUIT, TORCHELASTIC_* variables), sys.argv and the environment are
    put back: this process is the test run's."""
    saved_argv, saved_env = sys.argv, dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in LAUNCHER_SIGNALS}
    try:
        yield
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        for s, handler in handlers.items():
            signal.signal(s, handler)


def launch_in_process(args: List[str]) -> int:
    """`python -m ablate ARGS` as main() in this process, as launcher of its ranks when it has several: they are
    real processes, forked by the fork server this process started with its first such run and keeps (each
    later one starts without the ~7 CPU-s of a launcher's and a server's imports)."""
    with as_a_process_of_its_own():
        sys.argv = ["ablate", *args]
        return _entry_main()


def cli_in_process(capsys, args: List[str], env: Dict[str, str] = None) -> subprocess.CompletedProcess:
    """run_cli's result from `python -m ablate ARGS` as main() in this process (as launch_in_process), with
    run_cli's environment: for a command whose work is done by processes of its own (Slurm's tasks, a -m
    grid's jobs, several ranks) and whose lines are the test's."""
    capsys.readouterr()
    with as_a_process_of_its_own():
        os.environ.update({**COMMAND_ENV, **(env or {})})
        code = launch_in_process(args)
    said = capsys.readouterr()
    return subprocess.CompletedProcess(["ablate", *args], code, said.out, said.err)


def drive_in_process(main, argv: List[str]) -> int:
    """A driver's main(argv) (ablate.sweeps, ablate.tune) in this process, its runs processes of their own as
    ever: the driver's ~5 CPU-s of imports and checks paid once by this process."""
    with as_a_process_of_its_own():
        return main(argv)


def run_cli(args: List[str], cwd: Path = REPO, timeout: int = 600, env: Dict[str, str] = None):
    """`python -m ablate ARGS` in a real subprocess."""
    full_env = {**os.environ, **COMMAND_ENV, **(env or {})}
    return subprocess.run([sys.executable, "-m", "ablate", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def run_module(module: str, args: List[str], timeout: int = 600, env: Dict[str, str] = None):
    """`python -m MODULE ARGS` (ablate.maxbatch, ablate.sweeps, ...) in a real subprocess."""
    full_env = {**os.environ, **COMMAND_ENV, **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def read_jsonl(path: Path) -> List[Dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def fast():
    """Overrides that keep a real run to a couple of seconds."""
    return ["train.steps=6", "train.warmup_steps=2", "train.log_every=2", "metrics.gemm_probe_n=256",
            "metrics.predict=false"]


@pytest.fixture(autouse=True)
def no_rank_variables_leak():
    """Every later `python -m ablate` inherits this process's environment: a RANK or MASTER_PORT left behind
    by one test makes every later run think it is a rank of some job (it happened once: 52 failures)."""
    yield
    leaked = launcher_variables()
    for k in leaked:
        os.environ.pop(k)
    assert not leaked, f"the test left launcher variables in the environment: {leaked}"


@pytest.fixture(autouse=True)
def no_wandb_service_shared():
    """A test that runs W&B in this process leaves W&B's service running and its address in WANDB_SERVICE
    (W&B saves it for child processes): every later `python -m ablate` of this worker would then log through
    that service instead of starting its own wandb-core, as no user's shell does (seen: the helper-kill test
    found no helper to kill). Each test starts without it."""
    yield
    os.environ.pop("WANDB_SERVICE", None)


# The few steps every strategy x precision run takes, shared by the parity tests and the choice matrix so
# that each (parallel, precision, ranks, extras) trains once per test session.
RUN_COMMON = ["logger=none", "train.steps=6", "train.warmup_steps=2", "train.log_every=2", "metrics.gemm_probe_n=128",
              "metrics.predict=false"]


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """trained(parallel, precision, ranks, *extra) -> (summary, metrics rows) of a real run, memoised for the
    session. Several ranks: ablate's main() in this process as their launcher, the ranks real processes
    (launch_in_process; the 14 of the choice matrix and the parity tests, ~90 CPU-s less than as many `python
    -m ablate`, whose own path the README's commands and the fault tests type). One rank: `python -m ablate`,
    which would train in this process otherwise (DeepSpeed keeps its groups from one run to the next there)."""
    done: Dict[tuple, tuple] = {}

    def run(parallel_choice: str, precision_choice: str, ranks: int, *extra: str):
        key = (parallel_choice, precision_choice, ranks, *extra)
        if key not in done:
            run_dir = tmp_path_factory.mktemp(f"{parallel_choice}_{precision_choice}_{ranks}")
            args = [*RUN_COMMON, f"parallel={parallel_choice}", f"precision={precision_choice}",
                    f"launcher.nproc_per_node={ranks}", *extra, f"hydra.run.dir={run_dir}"]
            if ranks > 1:
                code = launch_in_process(args)
                assert code == 0, f"{key}: exit {code} (its line is in this test's captured stderr)"
            else:
                result = run_cli(args)
                assert result.returncode == 0, f"{key}: {result.stderr[-4000:]}"
            done[key] = (json.loads((run_dir / "summary.json").read_text()), read_jsonl(run_dir / "metrics.jsonl"))
        return done[key]

    return run


USER_DIR = REPO / "tests" / "user"   # a team's own module (mymodels.py) and config dir (conf/), as in the README
HF_LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 192,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 256, "tie_word_embeddings": False}


@pytest.fixture(scope="session")
def user_files(tmp_path_factory):
    """What a user brings, written by the test (nothing downloaded): a token file (uint16 ids < 512, counting
    by 3 so the loss falls), a 2-layer Llama config.json, a tokenized datasets folder (when datasets is
    installed), the user's config dir and module."""
    import types

    import numpy as np

    root = tmp_path_factory.mktemp("user")
    tokens = root / "train.bin"
    (np.arange(20_000) * 3 % 512).astype(np.uint16).tofile(tokens)
    (root / "hf_llama").mkdir()
    (root / "hf_llama" / "config.json").write_text(json.dumps(HF_LLAMA))
    dataset = root / "dataset"
    try:
        from datasets import Dataset

        Dataset.from_dict({"input_ids": [[(i * 7 + j) % 256 for j in range(50)] for i in range(40)]}
                          ).save_to_disk(str(dataset))
    except ImportError:
        dataset.mkdir()
    return types.SimpleNamespace(tokens=tokens, hf_config=root / "hf_llama" / "config.json", dataset=dataset,
                                 config_dir=USER_DIR / "conf", module_dir=USER_DIR,
                                 env={"PYTHONPATH": os.pathsep.join(filter(None, [str(USER_DIR),
                                                                                 os.environ.get("PYTHONPATH")]))})
