"""ablate.tune and the objective a -m job returns: the space, pruning, the Pareto front and the verdict in
process; one real tune (2 runs, one trial pruned, continued: ~30 s). The README's own tune, typed by
test_readme.py, is the one confirmed (its best two run 3 more times each)."""
import csv
import json

import pytest

from ablate.config import ConfigError
from ablate.tune import Trial, best_two, direction, pareto, parse_space, prune_reason
from conftest import drive_in_process


def test_the_space_and_the_direction():
    assert parse_space(["parallel=ddp,fsdp2", "train.batch_size=8, 16"]) == {
        "parallel": ["ddp", "fsdp2"], "train.batch_size": ["8", "16"]}
    with pytest.raises(ConfigError, match="--space parallel=ddp: give KEY=V1,V2"):
        parse_space(["parallel=ddp"])
    assert direction("tokens_per_s") == "maximize" and direction("step_time_s") == "minimize"


def test_the_space_takes_several_knobs_per_flag_and_refuses_a_key_no_config_has(tmp_path):
    """In process (~1 s): `--space K=V1,V2 K=V1,V2 --space K=V1,V2` (the issue's form and the README's) is one
    space; a key the config does not have is one line before anything is written."""
    from ablate.tune.__main__ import parser, run

    args = parser().parse_args(["--space", "parallel=ddp,zero2", "precision=fp32,bf16", "--space",
                                "train.batch_size=2,4", "--dir", str(tmp_path / "D")])
    assert parse_space(args.space) == {"parallel": ["ddp", "zero2"], "precision": ["fp32", "bf16"],
                                       "train.batch_size": ["2", "4"]}
    args = parser().parse_args(["--space", "train.micro_batch=2,4", "--dir", str(tmp_path / "D")])
    with pytest.raises(ConfigError, match="train.micro_batch: no such key in 'train'"):
        run(args, ["logger=none"])
    assert not (tmp_path / "D").exists()


def test_an_objective_no_trial_would_record_is_refused_before_any_runs(tmp_path, user_files, monkeypatch, capsys):
    """In process (~1 s): `--objective nosuch` is one line and exit 2, nothing written; a figure the registry
    declares, a mesh dim's bytes and a figure a collector declares (`figures`) are taken."""
    from ablate.tune import check_objective
    from ablate.tune.__main__ import main

    code = main(["--space", "optim=adamw,sgd", "--objective", "nosuch", "--dir", str(tmp_path / "D"), "--",
                 "logger=none"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--objective nosuch: not a figure every trial records" in err[0], err
    assert not (tmp_path / "D").exists()
    monkeypatch.syspath_prepend(str(user_files.module_dir))
    mine = [{"_target_": "mycollectors.LossDrop"}]
    for objective in ("mfu", "activation_bytes", "comm_bytes_by_dim.tp", "loss_drop_total"):
        check_objective(objective, mine)
    with pytest.raises(ConfigError, match="your collectors declare: loss_drop, loss_drop_total"):
        check_objective("loss_dropped", mine)
    assert direction("activation_bytes") == "minimize" and direction("data_wait_frac") == "minimize"


def test_fixed_overrides_are_judged_with_each_point_not_alone(tmp_path, monkeypatch):
    """In process (~2 s): `-- launcher.nproc_per_node=2` alone is parallel=none on 2 ranks (refused), but every
    point of `--space parallel=ddp,zero2` makes it a valid run: the tune starts its first trial."""
    from ablate.tune import __main__ as tune_main

    class FirstTrial(Exception):
        pass

    def first_trial(*args, **kwargs):
        raise FirstTrial

    monkeypatch.setattr(tune_main, "one_trial", first_trial)
    args = tune_main.parser().parse_args(["--space", "parallel=ddp,zero2", "--dir", str(tmp_path / "D")])
    with pytest.raises(FirstTrial):
        tune_main.run(args, ["launcher.nproc_per_node=2", "logger=none"])


def test_pareto_front_and_best_two_by_hand():
    trials = [Trial(0, ["a"], objective=100.0, mem_peak_bytes=1e9), Trial(1, ["b"], objective=150.0,
              mem_peak_bytes=2e9), Trial(2, ["c"], objective=90.0, mem_peak_bytes=1.5e9),
              Trial(3, ["d"], state="pruned")]
    assert [t.number for t in pareto(trials, maximise=True)] == [0, 1]   # 2 is slower and larger than 0
    assert [t.number for t in best_two(trials, maximise=True)] == [1, 0]
    again = Trial(4, ["b"], objective=150.0, mem_peak_bytes=2e9, reason="the same point as trial 1")   # one config
    assert [t.number for t in best_two([*trials, again], maximise=True)] == [1, 0]
    assert best_two([trials[1], again], maximise=True)[1] is None
    assert [t.number for t in pareto([*trials, again], maximise=True)] == [0, 1]


def test_a_point_asked_again_is_free_and_the_tune_measures_trials_distinct_points():
    """In process (~0 s): --trials counts distinct points (TPE may ask again for a measured one), bounded by the
    space's size and by ASKS_PER_TRIAL asks per trial."""
    from types import SimpleNamespace

    from ablate.tune.__main__ import ASKS_PER_TRIAL, left

    space, args = {"a": ["1", "2"], "b": ["1", "2", "3"]}, SimpleNamespace(trials=3)
    asked = [Trial(0, ["a=1", "b=1"]), Trial(1, ["a=1", "b=1"]), Trial(2, ["a=2", "b=1"])]
    assert left(asked, space, args)                                       # 2 distinct of 3
    assert not left([*asked, Trial(3, ["a=2", "b=3"])], space, args)      # 3 distinct
    assert not left([Trial(n, ["a=1", "b=1"]) for n in range(ASKS_PER_TRIAL * 3)], space, args)
    assert not left([Trial(n, [f"a={a}", f"b={b}"]) for n, (a, b) in enumerate([(1, 1), (1, 2), (2, 1), (2, 2),
                     (1, 3), (2, 3)])], space, SimpleNamespace(trials=12))   # the whole space measured


def test_what_cannot_fit_is_pruned_before_it_runs():
    assert prune_reason(["train.batch_size=4"], 1e9) is None
    reason = prune_reason(["train.batch_size=4096"], 1e9)
    assert reason.startswith("needs at least ") and "over the 1.0 GB budget" in reason


def test_a_slurm_tune_needs_one_allocation_for_its_largest_trial_and_its_driver_asks_the_same(tmp_path):
    """In process (~1 s): whether the tune allocates (a launcher with job steps in the base or the space), the
    allocation's size (its largest trial), and the driver's command line parsed back to the same call."""
    from ablate.sweeps import allocation
    from ablate.tune.__main__ import parser
    from ablate.tune.slurm import driver_command, trial_configs

    slurm = ["launcher=slurm", "launcher.gpus_per_node=0", "parallel=ddp", "logger=none"]
    configs = trial_configs({"launcher.nodes": ["1", "2"], "dataloader": ["naive", "pinned"]}, slurm)
    assert len(configs) == 4 and allocation.allocates(configs)
    assert allocation.largest(configs).launcher.nodes == 2
    assert not allocation.allocates(trial_configs({"dataloader": ["naive", "pinned"]}, ["logger=none"]))
    args = parser().parse_args(["--space", "dataloader=naive,pinned", "--trials", "3", "--confirm", "2",
                                "--mem-budget-gb", "4", "--dir", str(tmp_path / "D")])
    driver = driver_command(args, slurm)
    assert driver[:3] == ["-u", "-m", "ablate.tune"] and driver[driver.index("--") + 1:] == slurm
    again = parser().parse_args(driver[3:driver.index("--")])
    assert vars(again) == {**vars(args), "dir": (tmp_path / "D").resolve()}


def test_the_confirmation_has_three_outcomes_and_a_beaten_winner_gives_way(tmp_path):
    """In process (~0.1 s): the winner / runner-up interval above x1 (maximised: beats), below (the runner-up
    beats it: it becomes the best, in best.yaml and report.md too), or holding x1 (indistinguishable)."""
    from types import SimpleNamespace

    from ablate.tune import output
    from ablate.tune.__main__ import verdict

    assert verdict(1.1, 1.3, maximise=True) == "beats" and verdict(0.76, 0.95, maximise=True) == "loses"
    assert verdict(0.9, 1.2, maximise=True) == "same" and verdict(0.76, 0.95, maximise=False) == "beats"
    trials = [Trial(9, ["dataloader=pinned"], "complete", 120.0, 1e6), Trial(0, ["dataloader=naive"], "complete",
                                                                            100.0, 1e6)]
    args = SimpleNamespace(dir=tmp_path, objective="tokens_per_s", confirm=2, space=["dataloader=naive,pinned"])
    output.write(args, trials, [], None, {"best": 0, "text": "the runner-up beats the winner"})
    assert (tmp_path / "best.yaml").read_text() == "dataloader=naive\n"
    assert "**Best**: trial 0" in (tmp_path / "report.md").read_text()


def test_a_small_space_is_asked_point_by_point_to_its_end():
    """In process (~0.3 s): the whole grid when it has no more points than --trials, each point once, and
    telling the last one does not raise (optuna's grid stops study.optimize there, which a tune never runs)."""
    import optuna

    from ablate.tune.__main__ import sampler

    space = {"dataloader": ["naive", "pinned"], "train.batch_size": ["4", "8"]}
    study = optuna.create_study(direction="maximize", sampler=sampler(space, trials=4, seed=0))
    asked = []
    for value in range(4):
        t = study.ask({k: optuna.distributions.CategoricalDistribution(v) for k, v in space.items()})
        asked.append(tuple(t.params[k] for k in space))
        study.tell(t, float(value))
    assert sorted(asked) == [("naive", "4"), ("naive", "8"), ("pinned", "4"), ("pinned", "8")]


def test_a_multirun_job_returns_its_objective(tmp_path):
    from omegaconf import OmegaConf

    from hydra_plugins.ablate_launcher.fresh_process import job_result

    (tmp_path / "summary.json").write_text(json.dumps({"tokens_per_s": 1234.5, "step_time_s": 0.2}))
    cfg = OmegaConf.create({"metrics": {"objective": "step_time_s"}})
    assert job_result(0, tmp_path, cfg)[1] == 0.2
    assert job_result(0, tmp_path / "prepared", cfg)[1] is None   # a Slurm array point: no figures yet
    status, error = job_result(2, tmp_path / "missing", cfg)
    assert status.name == "FAILED" and "exited 2" in str(error)


@pytest.mark.slow
def test_a_tune_prunes_runs_and_continues(tmp_path, capsys):
    """Two calls of the driver in process (conftest.drive_in_process), each trial a process of its own."""
    from ablate.tune.__main__ import main as tune_main

    d = tmp_path / "tune"
    common = ["--space", "train.batch_size=2,4,4096", "--mem-budget-gb", "1", "--dir", str(d), "--", "logger=none",
              "train.steps=6", "train.warmup_steps=2", "metrics.gemm_probe_n=128", "metrics.predict=false"]
    first = drive_in_process(tune_main, ["--trials", "2", *common])
    assert first in (0, 1), capsys.readouterr().err[-2000:]   # 1: both trials pruned or failed (no winner)
    capsys.readouterr()
    second = drive_in_process(tune_main, ["--trials", "3", *common])
    said = capsys.readouterr()
    assert second == 0, (said.out + said.err)[-3000:]   # the trial lines (stdout) say which failed, why
    assert "continuing the tune" in said.out
    rows = list(csv.DictReader((d / "tune.csv").open()))
    states = {r["overrides"]: r["state"] for r in rows}
    assert states == {"train.batch_size=2": "complete", "train.batch_size=4": "complete",
                      "train.batch_size=4096": "pruned"}
    assert "over the 1.0 GB budget" in next(r["reason"] for r in rows if r["state"] == "pruned")
    best = (d / "best.yaml").read_text().split()
    assert best[-1] in ("train.batch_size=2", "train.batch_size=4") and "logger=none" in best
    assert (d / "report.md").exists() and (d / "tune.png").exists() and (d / "optuna.db").exists()


def test_trials_logged_to_wandb_get_a_parallel_coordinates_workspace(tmp_path):   # in process, ~1 s
    from ablate.tune import Trial
    from ablate.tune.output import write_workspace

    trials = []
    for n, batch in enumerate((2, 4)):
        run_dir = tmp_path / "trials" / f"{n:03d}"
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({"tokens_per_s": 1000.0 * (n + 1),
                                                          "wandb": {"group": "tune-D", "mode": "offline"}}))
        (run_dir / "config.yaml").write_text("logger:\n  project: mine\n  entity: team\n")
        trials.append(Trial(n, [f"train.batch_size={batch}", "precision=bf16"], "complete", 1000.0 * (n + 1),
                            1e8, "", str(run_dir), 1.0))
    assert write_workspace(tmp_path, trials[:0], ["train.batch_size"], "tokens_per_s") is None   # none logged
    path = write_workspace(tmp_path, trials, ["train.batch_size", "precision"], "tokens_per_s")
    text = path.read_text()
    assert path.name == "wandb_workspace.json" and '"value": "tune-D"' in text and '"project": "mine"' in text
    for column in ("config:train.value.batch_size", "config:precision.value.name", "summary:tokens_per_s",
                   "summary:mem_peak_bytes"):          # the parallel-coordinates panel's axes
        assert f'"accessor": "{column}"' in text, column


def test_a_tune_killed_with_9_resumes_its_point_once_and_ends_the_orphan(tmp_path):
    """In process (~2 s): the study of a call killed mid-trial holds a RUNNING trial, and its run may still be going
    (it holds its run dir's lock). Continuing ends that run (its process group), tells the trial failed and asks
    for its point again first: it is measured once, and a grid is not gone round again (duplicates, warnings)."""
    import subprocess
    import sys

    import optuna

    from ablate.train import guards
    from ablate.tune.__main__ import resume_interrupted

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'optuna.db'}", direction="maximize")
    space = {"optim": optuna.distributions.CategoricalDistribution(["adamw", "sgd"])}
    study.tell(study.ask(space), 1.0)
    running = study.ask(space)
    run_dir = tmp_path / "trials" / f"{running.number:03d}"
    run_dir.mkdir(parents=True)
    orphan = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from ablate.train import guards; guards.lock(Path(sys.argv[1])); print(1, flush=True); "
                               "time.sleep(60)", str(run_dir)], stdout=subprocess.PIPE, start_new_session=True)
    assert orphan.stdout.readline().strip() == b"1"   # it holds the lock
    resume_interrupted(study, tmp_path)
    assert orphan.wait(timeout=15) != 0               # ended, with its group
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING]
    assert study.trials[-1].system_attrs["fixed_params"] == running.params   # its point first, asked again
    assert guards.stop_holder(run_dir) is None          # nothing holds it now
