"""A command line composed once: Hydra's composition, made typed and checked against the registries, before
Hydra runs anything. A bad choice, type or value, or a combination this machine cannot run, ends in ONE
line naming the key and the valid choices, exit code 2, no traceback, and no run directory created.

A single run (`compose_run`) is composed once and the same config object is what Hydra's `run_job` hands
to the task; a multirun (`preflight`) composes every point of its grid to check it before the sweep starts.

The valid choices are Hydra's own (its config repository, so `--config-dir` and `hydra.searchpath`
add choices to any group, sweeps included). Hydra's informational flags (--help, --hydra-help, -sc,
--info) pass straight through.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from hydra import compose, initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import run_job
from hydra.types import HydraContext, RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from ablate import CONF_DIR, launcher
from ablate.config import SCHEMA_FILES, AblateConfig, AblateError, ConfigError
from ablate.config.command_line import INFO_FLAGS, config_keys, split_argv, with_search_path
from ablate.config.hydra_errors import USER_ERRORS, one_line
from ablate.config.store import LABELLED_BY_CHOICE, group_choices, register, typed
from ablate.train import guards
from ablate.train.ranks import rank_env


@contextmanager
def hydra_context():
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name="ablate"):
        yield


def choices(group: str, overrides: List[str] = ()) -> List[str]:
    """The choices Hydra knows for a group (inside hydra_context; a searchpath override counts)."""
    if overrides:
        compose("config", overrides=[o for o in overrides if o.startswith("hydra.searchpath=")])
    return sorted(o for o in GlobalHydra.instance().config_loader().get_group_options(group) if o not in SCHEMA_FILES)


def validate(cfg: DictConfig, choices: Optional[Mapping[str, str]] = None) -> AblateConfig:
    """The typed, value-checked config (config/store.py) whose every group's `name` its registry implements."""
    cfg = typed(cfg, choices)
    check_choices(cfg)
    return cfg


def registries() -> Dict[str, Mapping]:
    """`<group>.name` -> its implementation: the one registry per group (decoded nowhere else). Imported when
    a composed config is checked, not with this module: precision's and parallel's registries bring torch,
    which a command that Hydra or the schema refuses must not pay for (a refusal costs less than torch)."""
    from ablate import logger, parallel, precision

    return {"precision": precision.REGISTRY, "parallel": parallel.REGISTRY, "logger": logger.REGISTRY,
            "launcher": launcher.REGISTRY}


def check_choices(cfg: AblateConfig) -> None:
    """Every group's `name` is one its registry implements, and the strategy can run on the ranks asked."""
    found = registries()
    for group, registry in found.items():
        name = getattr(cfg, group).name
        if name not in registry:
            raise ConfigError(f"{group}.name={name}: not a valid choice; valid choices: {', '.join(registry)}")
    from ablate.parallel import layout_of  # torch, as registries(): paid once the config passed Hydra and the schema

    layout_of(cfg)   # the ranks' layout (parallel/mesh.py): tp, shard_size and the world agree, or one line
    from ablate.metrics import collectors

    collectors.check(cfg.metrics.collectors)   # the user's collectors import and have their two methods


def check_hardware(cfg: AblateConfig) -> None:
    """What this machine cannot run, said before anything starts (each launcher checks its own)."""
    launcher.check(cfg)


def check_run_dir(overrides: List[str], multirun: bool = False) -> None:
    """hydra.run.dir of a single run: not empty, not already holding a run (unless resumed), writable (a
    multirun writes under hydra.sweep.dir)."""
    guards.check_run_dir_override(overrides)
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")]
    if not given or multirun:
        return
    if rank_env().launched and rank_env().rank != 0:   # one task of several (srun): rank 0 owns the directory,
        return                                         # and may already be writing into it
    resume = next((o.split("=", 1)[1] for o in overrides if o.startswith("train.resume=")), None)
    guards.check_fresh(Path(given[-1]), resume)
    guards.check_unlocked(Path(given[-1]))
    guards.check_writable(Path(given[-1]))


def sweeper_params(parsed) -> List[str]:
    """A sweeps/ file's own grid (hydra.sweeper.params), less the keys the command line sets itself."""
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    cfg = compose("config", overrides=fixed, return_hydra_config=True)
    params = cfg.hydra.sweeper.get("params") or {}
    given = {o.get_key_element() for o in parsed}
    return [f"{k}={v}" for k, v in params.items() if k not in given and f"+{k}" not in given]


def grid(overrides: List[str]) -> List[List[str]]:
    """Every combination a command line (and a sweeps/ file's grid) asks for, as override lists."""
    parser = OverridesParser.create()
    parsed = parser.parse_overrides(overrides)
    parsed = parser.parse_overrides(sweeper_params(parsed) + overrides)
    return BasicSweeper.split_arguments(parsed, None)[0] if parsed else [[]]


def _validate(combo: List[str], hardware: bool) -> None:
    try:
        checked = validate(compose("config", overrides=list(combo)))
    except ConfigError:
        raise
    except USER_ERRORS as e:
        raise one_line(e) from None
    if hardware:
        check_hardware(checked)


def checked(combos: List[List[str]]) -> List[AblateConfig]:
    """Each run's typed config, composed as its fresh process will compose it (a sweep's Slurm allocation
    must hold its largest run)."""
    register()
    with hydra_context():
        try:
            # with Hydra's node: its group choices label the model and the other labelled groups as a run's record
            return [validate(compose("config", overrides=config_keys(combo), return_hydra_config=True))
                    for combo in combos]
        except USER_ERRORS as e:   # a key no config has (a tune's --space, a sweep's grid): one line
            raise one_line(e) from None


def config_of(argv: List[str]) -> Tuple[DictConfig, AblateConfig, Dict[str, str]]:
    """A command line's composition (hydra node included), its typed config and its choices, `--config-dir`
    honoured: for the tools that read a run's config without running it (ablate.plan, ablate.maxbatch)."""
    register()
    overrides, config_dirs = split_argv(argv)
    with hydra_context():
        try:
            cfg = compose("config", overrides=config_keys(with_search_path(overrides, config_dirs)),
                          return_hydra_config=True)
            choices = group_choices(cfg.hydra.runtime.choices)
            return cfg, validate(cfg, choices), choices
        except ConfigError:
            raise
        except USER_ERRORS as e:
            raise one_line(e) from None


def preflight(argv: List[str], hardware: bool = True) -> None:
    """Compose every combination the command line (and a sweeps/ file's grid) asks for and validate it,
    or fail in one line. Hydra's --help, --hydra-help, -sc and --info are left to Hydra."""
    if any(arg.split("=")[0] in INFO_FLAGS for arg in argv):
        return
    register()
    overrides, config_dirs = split_argv(argv)
    check_run_dir(overrides, multirun=any(arg in ("-m", "--multirun") for arg in argv))
    overrides = config_keys(with_search_path(overrides, config_dirs))
    with hydra_context():
        try:
            combos = grid(overrides)
        except USER_ERRORS as e:
            raise one_line(e) from None
        for combo in combos:
            _validate(combo, hardware)


MULTIRUN = object()   # what run_single returns when the composed config asks for a multirun (a sweeps/ file)
Task = Callable[[DictConfig, AblateConfig, Dict[str, str]], object]


def run_record(cfg: DictConfig, checked: AblateConfig) -> Dict:
    """What config.yaml records: the composition resolved, without Hydra's node, every label group named by
    the choice that made it."""
    plain = cfg.copy()
    with open_dict(plain):
        plain.pop("hydra", None)
    for group in LABELLED_BY_CHOICE + ("optim",):   # (a user's optimizer file, too, is recorded by its choice)
        with open_dict(plain[group]):
            plain[group].name = getattr(checked, group).name
    return OmegaConf.to_container(plain, resolve=True)


def is_single_run(argv: List[str]) -> bool:
    """A plain `python -m ablate [overrides]` (--config-dir allowed) and no sweep override: composed here,
    once. -m, Hydra's other flags and sweep overrides (a,b) go through hydra.main."""
    if any(a.startswith("-") and a.split("=")[0] not in ("--config-dir", "-cd") for a in argv):
        return False
    try:
        parsed = OverridesParser.create().parse_overrides(split_argv(argv)[0])
    except USER_ERRORS:
        return False   # Hydra's own message, through preflight
    return not any(o.is_sweep_override() for o in parsed)


def _composed(overrides: List[str]) -> Tuple[DictConfig, Dict[str, str]]:
    """Hydra's composition of a single run, hydra node included (inside hydra_context), and its choices."""
    try:
        cfg = GlobalHydra.instance().hydra.compose_config("config", overrides, run_mode=RunMode.RUN,
                                                          with_log_configuration=True)
    except USER_ERRORS as e:
        raise one_line(e) from None
    return cfg, group_choices(cfg.hydra.runtime.choices)


def run_single(argv: List[str], task: Task, checks: bool = True):
    """Compose a single run ONCE, check it (values, registries, run dir, and with `checks` this machine), then
    hand that same config to Hydra's run_job (run dir, .hydra/, logging), which calls task(cfg, checked,
    choices) inside it. Nothing is created before every check passed. Returns MULTIRUN, having run nothing,
    when the config itself asks for a multirun (a sweeps/ file's `hydra.mode`)."""
    register()
    overrides, config_dirs = split_argv(argv)
    if checks:
        check_run_dir(overrides)
    with hydra_context():
        cfg, choices = _composed(with_search_path(overrides, config_dirs))
        if cfg.hydra.mode == RunMode.MULTIRUN:
            return MULTIRUN
        try:
            checked = validate(cfg, choices)
        except ConfigError:
            raise
        except USER_ERRORS as e:
            raise one_line(e) from None
        if checks:
            check_hardware(checked)
        if checked.train.resume:   # what the checkpoint cannot become, refused before Hydra writes .hydra/
            from ablate.train import resumable  # torch.distributed.checkpoint: only a resume reads one

            resumable.check_resume(checked, run_record(cfg, checked))
        if checks and not (rank_env().launched and rank_env().rank != 0):   # rank 0 owns the directory
            guards.lock(Path(str(cfg.hydra.run.dir)))   # claimed before Hydra writes .hydra/ into it
        cfg.hydra.mode = RunMode.RUN
        callbacks = Callbacks(cfg)
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=callbacks)
        callbacks.on_run_start(config=cfg, config_name="config")
        stopped: List[AblateError] = []

        def job(task_cfg: DictConfig):
            try:
                return task(task_cfg, checked, choices)
            except AblateError as e:   # said in one line by the entry point: Hydra would print a line above it
                stopped.append(e)

        ret = run_job(hydra_context=context, task_function=job, config=cfg, job_dir_key="hydra.run.dir",
                      job_subdir_key=None, configure_logging=True)
        callbacks.on_run_end(config=cfg, config_name="config", job_return=ret)
        if stopped:
            raise stopped[0]
        return ret.return_value   # a bug's exception, raised again with its traceback
