"""Running a sweep's planned runs: each in a fresh process (its own process group, killed past its
timeout), the same command continuing an earlier call (its plan kept in D/plan.json), each outlier run
once more beside it, and a sweep's batch search after its run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import yaml

from ablate.config import record
from ablate.launcher import group
from ablate.launcher.script import STEP_GRACE_S
from ablate.metrics import host
from ablate.report import outliers
from ablate.report.plan import PLAN_FILE, note_failed, run_dir_of  # where the i-th run goes: one rule, the report's
from ablate.sweeps import _label, load
from ablate.train import guards

SWEEP_STOPPED = "it is set aside as unfinished; the same command continues the sweep"


def run_bounded(args: List[str], run_dir: Path, env: Dict[str, str], timeout: Optional[float],
                grace_s: float = 0, **where) -> subprocess.CompletedProcess:
    """One arm (or its batch search: `module`) in its own process group (group.run_ablate): past `timeout` the whole
    group is killed and the run is named as timed out, while the sweep goes on."""
    result, _ = group.run_ablate(args, run_dir, env=env, timeout=timeout, grace_s=grace_s, then=SWEEP_STOPPED,
                                 **where)
    if result.returncode == 124 and timeout is not None:
        result.stderr += " (--run-timeout)"
    return result


def run_all(runs, root: Path, extra: List[str], extra_env=None, run_timeout: Optional[float] = None,
            until: Optional[float] = None, search: Optional[Dict] = None, first: int = 1, steps=None,
            wait_quiet: Optional[float] = None) -> List[str]:
    """Every run in order, each a fresh process (with `steps`, a job step of the sweep's Slurm allocation:
    allocation.Steps); `until` (a time.time()) skips what would start too late; `wait_quiet` (seconds) waits
    before each run, that long at most, for the host's CPU to be under host.BUSY_FRAC busy. Then each outlier
    run (report/outliers.py) is run once more, beside it, and paired in its place."""
    failed, started, done = [], time.monotonic(), {}
    env = {**os.environ, **(extra_env or {})}
    for i, (name, combo, r) in enumerate(runs, first):
        label = _label(combo, extra)
        run_dir = run_dir_of(root, i, name, r, label)
        done[str(run_dir)] = (name, combo, r)
        title = f"[{i}/{len(runs) + first - 1}] {name} {label} r{r}"
        kept = resume_point(run_dir, combo, r)
        if kept:
            print(f"{title}: {kept}", flush=True)
            if not kept.startswith(OTHER_RUN):
                continue
        if steps:
            steps.requeue_if_warned(title)
        if wait_quiet:
            quiet(title, wait_quiet)
        result = run_one(name, combo, r, run_dir, env, run_timeout, until, search, steps)
        if steps:
            steps.requeue_if_warned(title)
        if result is None:
            failed.append(f"{name} {label} r{r} (not run: out of time)")
            print(f"{title}: not run, the time given (--until) is up", flush=True)
            continue
        done_here = i - first + 1
        eta = (time.monotonic() - started) / done_here * (len(runs) - done_here)
        say(title, result, run_dir, f", about {eta:.0f} s left")
        if result.returncode:
            failed.append(f"{name} {label} r{r}")
            note_failed(run_dir, result.returncode, result.stderr)   # the report names it, with its error
    rerun_outliers(root, done, env, run_timeout, until, search, steps)
    return failed


def quiet(title: str, max_wait_s: float) -> None:
    """--wait-quiet: wait (bounded) for a quiet host before a run, saying so when it waited."""
    waited, frac = host.wait_for_quiet(max_wait_s)
    if frac is not None and frac >= host.BUSY_FRAC:
        print(f"{title}: the host is still {frac:.0%} busy after {waited:.0f} s (--wait-quiet): running anyway; "
              "the run's host_load says so", flush=True)
    elif waited > 1.5:
        print(f"{title}: waited {waited:.0f} s for a quiet host (now {frac:.0%} busy)", flush=True)


def unfinished(runs, root: Path, extra: List[str]) -> int:
    """How many of the plan's runs have no summary in `root` yet."""
    return sum(not record.exists(run_dir_of(root, i, name, r, _label(combo, extra)))
               for i, (name, combo, r) in enumerate(runs, 1))


def rerun_outliers(root: Path, done: Dict[str, Tuple], env, run_timeout, until, search, steps=None) -> None:
    """Each outlier of this call's runs, run once more beside it (never a rerun's rerun)."""
    for path, reason in outliers.in_dirs([root]).items():
        rerun = Path(path).parent / f"{Path(path).name}{RERUN_SUFFIX}"
        if path not in done or rerun.exists():
            continue
        name, combo, r = done[path]
        print(f"outlier: {Path(path).name}: {reason}; running it once more as {rerun.name}", flush=True)
        result = run_one(name, combo, r, rerun, env, run_timeout, until, search, steps)
        if result is None:
            print(f"[rerun] {rerun.name}: not run, the time given (--until) is up", flush=True)
            continue
        say(f"[rerun] {rerun.name}", result, rerun)
        if result.returncode == 0:
            mark_rerun(Path(path), rerun, reason)


def say(title: str, result, run_dir: Path, tail: str = "") -> None:
    status = "ok" if result.returncode == 0 else f"FAILED (exit {result.returncode})"
    print(f"{title}: {status} in {result.took:.0f} s{tail}", flush=True)
    if result.returncode:
        last = [ln for ln in result.stderr.strip().splitlines() if ln.strip()][-1:]
        print(f"    {last[0] if last else 'no error output'} (run dir {run_dir})", file=sys.stderr, flush=True)


RERUN_SUFFIX = "_rerun"


OTHER_RUN = "finished in an earlier call, but"


def resume_point(run_dir: Path, combo: List[str], repeat: int) -> str:
    """A run dir from an earlier call of this sweep: '' (run it), or what is done with it, said on the run's line. A
    finished run is kept, if its config.yaml is the plan's run; one that is not (put there by hand, or by another
    sweep), or that did not finish, is set aside as <dir>.other-N or <dir>.incomplete-N (never deleted) and run
    again; one a live process still writes into (a driver killed with -9 leaves its child running, which finishes
    its run) is waited for, then kept or set aside as any other."""
    if record.exists(run_dir):
        other = disagreement(run_dir, combo, repeat)
        if not other:
            return "finished in an earlier call: kept"
        return f"{OTHER_RUN} {other}: set aside as {aside(run_dir, 'other').name}, and run again"
    if not run_dir.exists():
        return ""
    waited = guards.wait_for_holder(run_dir, lambda pid: print(
        f"{run_dir.name}: still running (pid {pid}: an earlier call's run, its driver gone); waiting for it to end "
        "(Ctrl-C stops the waiting, not the run)", flush=True))
    if waited is not None:   # it ended: finished (kept), or not (set aside below)
        return resume_point(run_dir, combo, repeat)
    aside(run_dir, "incomplete")
    return ""


def aside(run_dir: Path, why: str) -> Path:
    """Move a run dir out of its planned place, as <dir>.<why>-N (report/plan.py SET_ASIDE: the report skips it)."""
    k = 1 + sum(1 for _ in run_dir.parent.glob(f"{run_dir.name}.{why}-*"))
    return run_dir.rename(run_dir.with_name(f"{run_dir.name}.{why}-{k}"))


def disagreement(run_dir: Path, combo: List[str], repeat: int) -> str:
    """Where a finished run's config.yaml says other than its planned overrides ('' where it agrees with each it
    records): a group's choice is its `name`, a key its value."""
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return "its config.yaml cannot be read"
    for override in [*combo, f"sweep.repeat={repeat}"]:
        key, sep, value = override.partition("=")
        key = key.lstrip("+~")
        if not sep or key.split(".")[0] in ("hydra", "sweeps"):
            continue
        found = config
        for part in key.split(".") if "." in key else (key, "name"):
            found = found.get(part) if isinstance(found, dict) else None
        want = yaml.safe_load(value)
        if found is not None and not same(found, want):
            return f"its config.yaml has {key}={found} where the plan has {value}"
    return ""


def same(a, b) -> bool:
    if a == b or str(a).lower() == str(b).lower():
        return True
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def claim_dir(root: Path, runs) -> str:
    """The --dir for this call: new (its plan written), an earlier call of the same plan (continued), or of a
    plan this one extends (more --repeats of the same sweep: the earlier plan is where this one starts, so its
    runs keep their places and the new repeats follow); '' when fine, else why not."""
    plan = [{"sweep": name, "overrides": combo, "repeat": r} for name, combo, r in runs]
    path = root / PLAN_FILE
    if path.exists():
        try:
            earlier = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            return (f"--dir {root}: {path} cannot be read ({type(e).__name__}: {e}), so nothing says which runs "
                    "are this call's; choose another folder, or remove that file to plan the folder anew")
        if earlier == plan:
            return ""
        if isinstance(earlier, list) and 0 < len(earlier) < len(plan) and plan[:len(earlier)] == earlier:
            path.write_text(json.dumps(plan, indent=1))   # more repeats of the same runs: added after them
            print(f"--dir {root}: adding {len(plan) - len(earlier)} run(s) to the {len(earlier)} of an earlier call "
                  "(more repeats of the same plan)", flush=True)
            return ""
        return (f"--dir {root}: its {PLAN_FILE} is another call's plan ({first_difference(earlier, plan)}: a "
                "different sweep, fewer repeats, other overrides, or the file edited); choose another folder, or "
                "repeat that call's command to continue it")
    if root.exists() and any(root.rglob("metrics.jsonl")):
        return (f"--dir {root} already holds runs; choose another folder "
                f"(python -m ablate.report {root} reports on them)")
    try:
        root.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(plan, indent=1))
    except OSError as e:   # read-only, no permission, full
        return f"--dir {root}: cannot be written ({e.strerror or type(e).__name__}); choose another folder"
    return ""


def first_difference(earlier, plan: List[Dict]) -> str:
    """Where a folder's plan.json and this call's plan part, in words."""
    if not isinstance(earlier, list):
        return f"it holds a {type(earlier).__name__}, not a list of runs"
    for i, (was, now) in enumerate(zip(earlier, plan), 1):
        if was != now:
            return f"run {i} there is {json.dumps(was)[:120]}, here {json.dumps(now)[:120]}"
    return f"{len(earlier)} runs there, {len(plan)} here"


def mark_rerun(original: Path, rerun: Path, reason: str) -> None:
    """The outlier keeps its figures and says where its rerun is; the rerun says what it replaces."""
    for path, keys in ((original, {"rerun_as": rerun.name, "outlier": reason}), (rerun, {"rerun_of": original.name})):
        record.update(path, **keys)


def run_one(name: str, combo: List[str], r: int, run_dir: Path, env: Dict[str, str], run_timeout, until,
            search, steps=None) -> Optional[subprocess.CompletedProcess]:
    """One run (and its batch search) in a fresh process (with `steps`, a job step of the allocation),
    its time in `.took`; None when there is no time left to start it (--until)."""
    left = None if until is None else until - time.time()
    if left is not None and left < 10:
        return None
    timeout = min((t for t in (run_timeout, left) if t is not None), default=None)
    root = run_dir.parent.parent
    group = [] if any(o.startswith("logger.group=") for o in combo) else [f"logger.group='{name}-{root.name}'"]
    step = steps.prefix(combo, f"ablate-{run_dir.name}") if steps else []
    t0 = time.monotonic()
    result = run_bounded([*combo, "hydra.mode=RUN", f"sweep.repeat={r}", *group], run_dir, env, timeout,
                         grace_s=STEP_GRACE_S if step else 0, prefix=step)
    spec = load(name).get("sweep", {}).get("batch_search")
    if result.returncode == 0 and spec:   # the search shares its arm's time: the run's limit and --until
        left_for_search = None if timeout is None else timeout - (time.monotonic() - t0)
        result = batch_search({**spec, **(search or {})}, combo, r, run_dir, env, left_for_search)
    result.took = time.monotonic() - t0
    return result


def batch_search(spec: Dict, combo: List[str], repeat: int, run_dir: Path, env: Dict[str, str],
                 timeout: Optional[float] = None):
    """A sweep's `batch_search` (C5's "batch x4"): the largest batch that fits under this arm's config, found
    by `python -m ablate.maxbatch` in <run dir>/max_batch, and written into the run's summary as `max_batch`.
    On a GPU an out-of-memory error decides; on a CPU the spec's `cpu_mem_budget_gb` (peak RSS) does."""
    summary = dict(record.load(run_dir))
    on_cpu = not record.load(run_dir).device.startswith("cuda")
    spec = {k: v for k, v in spec.items() if v is not None and k != "cpu_mem_budget_gb"} | (
        {"mem_budget_gb": spec["cpu_mem_budget_gb"]} if on_cpu and spec.get("cpu_mem_budget_gb") else {})
    options = [f"--{k.replace('_', '-')}={v}" for k, v in spec.items()]
    search_dir = run_dir / "max_batch"
    if timeout is not None and timeout < 5:
        return subprocess.CompletedProcess([], 124, None, "no time left for the batch search (--run-timeout/--until)")
    result = run_bounded([*options, "--", *combo, "hydra.mode=RUN", f"sweep.repeat={repeat}"], search_dir, env, timeout,
                         module="ablate.maxbatch")
    if result.returncode == 0:
        found = record.load(search_dir)
        summary["max_batch"] = found["max_batch"]
        summary["max_batch_search"] = {k: found[k] for k in ("fit_rule", "figure", "search", "limit_reached")}
        summary["max_batch_search"].update(dir=str(search_dir), trials=len(found["trials"]))
        summary.setdefault("notes", {}).update(found.notes)
        record.write(run_dir, summary)
    return result
