"""`python -m ablate.sweeps NAME [NAME ...] [--repeats R] [--dir DIR] [-- OVERRIDES]`: run sweeps/ files
with repeats, interleaved, each run in a fresh process, then the report.

Order: every arm once per block, block after block (A B, A B, ...: drift on a shared machine hits both
arms alike), or `--order random` (each block shuffled). Each run is `python -m ablate +sweeps=NAME
<arm> sweep.repeat=K` in its own process (allocator, NCCL and CUDA settings are per process), and every
run of the call shares one measured peak (metrics.peak_cache), so MFU has one denominator.
`python -m ablate.sweeps --list` lists the sweeps; `week4` is the whole table (sweeps/week4.yml:
a suite, a list of sweeps; .yml so that Hydra, which reads only .yaml, does not offer it as `+sweeps=week4`).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import yaml

from ablate import SWEEPS_DIR, design
from ablate.report import compare, outliers, sequential

SUITE_SUFFIX = ".yml"   # sweeps/<name>.yml lists sweeps (week4); sweeps/<name>.yaml is one sweep (a Hydra config)


def _path(name: str) -> Path:
    suite = SWEEPS_DIR / f"{name}{SUITE_SUFFIX}"
    return suite if suite.exists() else SWEEPS_DIR / f"{name}.yaml"


def load(name: str) -> dict:
    return yaml.safe_load(_path(name).read_text()) or {}


def available() -> List[str]:
    return sorted({p.stem for p in SWEEPS_DIR.glob("*.yaml")} | {p.stem for p in SWEEPS_DIR.glob(f"*{SUITE_SUFFIX}")})


def expand(names: List[str]) -> List[str]:
    out = []
    for name in names:
        if name not in available():
            raise SystemExit(f"ablate.sweeps: error: no sweep '{name}'; valid choices: {', '.join(available())}")
        data = load(name)
        out += data["sweeps"] if isinstance(data.get("sweeps"), list) else [name]
    return out


def listing() -> str:
    rows = []
    for name in available():
        data = load(name)
        if isinstance(data.get("sweeps"), list):
            rows.append(f"{name:<14} the whole table: {', '.join(data['sweeps'])}")
            continue
        s, params = data.get("sweep", {}), (data.get("hydra", {}).get("sweeper", {}).get("params") or {})
        arms = ", ".join(f"{k}={v}" for k, v in params.items() if k != "sweep.repeat")
        what = {"factorial": f"factorial: {arms}",
                "stack": "stack: " + ", ".join(a.label for a in design.stack(s)) if s.get("design") == "stack" else ""
                }.get(s.get("design"), f"knob: {s.get('knob')}; arms: {arms}")
        rows.append(f"{name:<14} {s.get('claim', ''):<3} {s.get('technique', '')}\n{'':<19}claim: "
                    f"{s.get('claimed_text', '')}\n{'':<19}{what}")
    return "\n".join(rows)


def is_side_arm(name: str, combo: List[str]) -> bool:
    """An arm that is neither the sweep's baseline nor its treatment (C4's fp16): drawn, not judged."""
    s = load(name).get("sweep", {})
    knob = s.get("knob", "")
    for o in combo:
        key, _, value = o.partition("=")
        if key in (knob, knob.rsplit(".name", 1)[0]):
            return value not in (str(s.get("baseline")).lower(), str(s.get("treatment")).lower(),
                                 str(s.get("baseline")), str(s.get("treatment")))
    return False


def plan_runs(names: List[str], extra: List[str], repeats: int, order: str, seed: int,
              side_arms_once: bool = True) -> List[Tuple[str, List[str], int]]:
    """(sweep, overrides, repeat) for every run, in running order; validates every point first. Side arms
    run once (repeat 0) unless asked: they are drawn but judged by no check, and can be slow (fp16 on a CPU)."""
    from ablate.compose import grid, hydra_context, preflight
    from ablate.config.store import register

    register()
    runs = []
    for name in names:
        node = load(name).get("sweep", {})
        if node.get("design") == "stack":   # arms listed by the file, not a grid: each checked like a grid point
            combos = [[f"+sweeps={name}", *arm.overrides, f"sweep.arm={arm.label}", *extra]
                      for arm in design.stack(node)]
            for combo in combos:
                preflight(combo)
        else:
            preflight([f"+sweeps={name}", *extra])       # one line and nothing run, on any bad point
            with hydra_context():
                combos = [[o for o in c if not o.startswith("sweep.repeat=")]
                          for c in grid([f"+sweeps={name}", *extra])]
            combos = in_design(name, combos)
        rng = random.Random(seed)
        for r in range(repeats):
            block = [c for c in combos if r == 0 or not (side_arms_once and is_side_arm(name, c))]
            if (order or ("random" if is_factorial(name) else "interleaved")) == "random":
                rng.shuffle(block)
            runs += [(name, combo, r) for combo in block]
    return runs


def load_design(combo: List[str]) -> Optional[str]:
    name = next((o.split("=", 1)[1] for o in combo if o.startswith("+sweeps=")), None)
    return load(name).get("sweep", {}).get("design") if name else None


def is_factorial(name: str) -> bool:
    """A factorial sweep runs in randomized blocks (one per repeat) unless --order says otherwise."""
    return load(name).get("sweep", {}).get("design") == "factorial"


def in_design(name: str, combos: List[List[str]]) -> List[List[str]]:
    """A factorial sweep's grid cut to its design's points (a `fraction`); any other sweep's grid as is."""
    s = load(name).get("sweep", {})
    if s.get("design") != "factorial" or not s.get("fraction"):
        return combos
    cells = design.build(s["factors"], s["fraction"])
    wanted = [set(cells.overrides(point)) for point in cells.points]
    return [c for c in combos if any(w <= set(c) for w in wanted)]


def _label(combo: List[str], extra: List[str]) -> str:
    """The arm: its `sweep.arm` when it has one (a stack), else the overrides that are not the sweep itself
    nor the caller's fixed extras."""
    arm = next((o.split("=", 1)[1] for o in combo if o.startswith("sweep.arm=")), None)
    if arm and load_design(combo) == "stack":
        return arm
    fixed = {o.split("=", 1)[0] for o in extra}   # Hydra rewrites values (false -> False): compare keys
    return " ".join(o for o in combo if not o.startswith("+sweeps=") and o.split("=", 1)[0] not in fixed) or "default"


def run_bounded(cmd: List[str], env: Dict[str, str], timeout: Optional[float]) -> subprocess.CompletedProcess:
    """Run one arm (or its batch search) in its own process group; past `timeout` the whole group is killed
    (its ranks and loader workers too) and the run is named as timed out, while the sweep goes on."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        return subprocess.CompletedProcess(cmd, 124, None, f"{err}\ntimed out after {timeout:.0f} s (--run-timeout)")
    return subprocess.CompletedProcess(cmd, proc.returncode, None, err)


def run_dir_of(root: Path, i: int, name: str, r: int, label: str) -> Path:
    return root / name / f"{i:03d}_r{r}_{re.sub(r'[^A-Za-z0-9.+-]+', '-', label)[:60]}"


def run_all(runs, root: Path, extra: List[str], extra_env=None, run_timeout: Optional[float] = None,
            until: Optional[float] = None, search: Optional[Dict] = None, first: int = 1) -> List[str]:
    """Every run in order, each a fresh process; `until` (a time.time()) skips what would start too late.
    Then each outlier run (report/outliers.py) is run once more, beside it, and paired in its place."""
    failed, started, done = [], time.monotonic(), {}
    env = {**os.environ, **(extra_env or {})}
    for i, (name, combo, r) in enumerate(runs, first):
        label = _label(combo, extra)
        run_dir = run_dir_of(root, i, name, r, label)
        done[str(run_dir)] = (name, combo, r)
        title = f"[{i}/{len(runs) + first - 1}] {name} {label} r{r}"
        kept = resume_point(run_dir)
        if kept:
            print(f"{title}: {kept}", flush=True)
            if kept.startswith("still running"):
                failed.append(f"{name} {label} r{r} ({kept})")
            continue
        result = run_one(name, combo, r, run_dir, env, run_timeout, until, search)
        if result is None:
            failed.append(f"{name} {label} r{r} (not run: out of time)")
            print(f"{title}: not run, the time given (--until) is up", flush=True)
            continue
        done_here = i - first + 1
        eta = (time.monotonic() - started) / done_here * (len(runs) - done_here)
        say(title, result, run_dir, f", about {eta:.0f} s left")
        if result.returncode:
            failed.append(f"{name} {label} r{r}")
    rerun_outliers(root, done, env, run_timeout, until, search)
    return failed


def rerun_outliers(root: Path, done: Dict[str, Tuple], env, run_timeout, until, search) -> None:
    """Each outlier of this call's runs, run once more beside it (never a rerun's rerun)."""
    for path, reason in outliers.in_dirs([root]).items():
        rerun = Path(path).parent / f"{Path(path).name}{RERUN_SUFFIX}"
        if path not in done or rerun.exists():
            continue
        name, combo, r = done[path]
        print(f"outlier: {Path(path).name}: {reason}; running it once more as {rerun.name}", flush=True)
        result = run_one(name, combo, r, rerun, env, run_timeout, until, search)
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
PLAN_FILE = "plan.json"   # the call's runs, in order: the same command on the same --dir continues it


def resume_point(run_dir: Path) -> str:
    """A run dir from an earlier call of this sweep: '' (run it), or why it is not run now. A finished run is
    kept; one that did not finish is set aside as <dir>.incomplete-N (never deleted) and run again; one a
    live process still writes into (a driver killed with -9 leaves its child running) is left alone."""
    from ablate.config import ConfigError
    from ablate.train import guards

    if (run_dir / "summary.json").exists():
        return "finished in an earlier call: kept"
    if not run_dir.exists():
        return ""
    try:
        guards.check_unlocked(run_dir)
    except ConfigError:
        return "still running (another process holds it): not run again; rerun this command when it ends"
    k = 1 + sum(1 for _ in run_dir.parent.glob(f"{run_dir.name}.incomplete-*"))
    run_dir.rename(run_dir.with_name(f"{run_dir.name}.incomplete-{k}"))
    return ""


def claim_dir(root: Path, runs) -> str:
    """The --dir for this call: new (its plan written), or an earlier call of the same plan (continued);
    '' when fine, else why not."""
    plan = [{"sweep": name, "overrides": combo, "repeat": r} for name, combo, r in runs]
    path = root / PLAN_FILE
    if path.exists():
        if json.loads(path.read_text()) == plan:
            return ""
        return (f"--dir {root} holds another call's runs (a different sweep, repeats or overrides); choose another "
                f"folder, or repeat that call's command to continue it")
    if root.exists() and any(root.rglob("metrics.jsonl")):
        return (f"--dir {root} already holds runs; choose another folder "
                f"(python -m ablate.report {root} reports on them)")
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan, indent=1))
    return ""


def mark_rerun(original: Path, rerun: Path, reason: str) -> None:
    """The outlier keeps its figures and says where its rerun is; the rerun says what it replaces."""
    for path, keys in ((original, {"rerun_as": rerun.name, "outlier": reason}), (rerun, {"rerun_of": original.name})):
        summary = json.loads((path / "summary.json").read_text())
        (path / "summary.json").write_text(json.dumps({**summary, **keys}, indent=2))


def run_one(name: str, combo: List[str], r: int, run_dir: Path, env: Dict[str, str], run_timeout, until,
            search) -> Optional[subprocess.CompletedProcess]:
    """One run (and its batch search) in a fresh process, its time in `.took`; None when there is no
    time left to start it (--until)."""
    left = None if until is None else until - time.time()
    if left is not None and left < 10:
        return None
    timeout = min((t for t in (run_timeout, left) if t is not None), default=None)
    root = run_dir.parent.parent
    group = [] if any(o.startswith("logger.group=") for o in combo) else [f"logger.group='{name}-{root.name}'"]
    cmd = [sys.executable, "-m", "ablate", *combo, "hydra.mode=RUN", f"hydra.run.dir={run_dir}",
           f"sweep.repeat={r}", f"metrics.peak_cache={root / 'peak_flops.json'}", *group]
    t0 = time.monotonic()
    result = run_bounded(cmd, env, timeout)
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
    summary = json.loads((run_dir / "summary.json").read_text())
    on_cpu = not str(summary.get("device", "cpu")).startswith("cuda")
    spec = {k: v for k, v in spec.items() if v is not None and k != "cpu_mem_budget_gb"} | (
        {"mem_budget_gb": spec["cpu_mem_budget_gb"]} if on_cpu and spec.get("cpu_mem_budget_gb") else {})
    options = [f"--{k.replace('_', '-')}={v}" for k, v in spec.items()]
    search_dir = run_dir / "max_batch"
    if timeout is not None and timeout < 5:
        return subprocess.CompletedProcess([], 124, None, "no time left for the batch search (--run-timeout/--until)")
    cmd = [sys.executable, "-m", "ablate.maxbatch", *options, "--", *combo, "hydra.mode=RUN",
           f"hydra.run.dir={search_dir}", f"sweep.repeat={repeat}"]
    result = run_bounded(cmd, env, timeout)
    if result.returncode == 0:
        found = json.loads((search_dir / "summary.json").read_text())
        summary["max_batch"] = found["max_batch"]
        summary["max_batch_search"] = {k: found[k] for k in ("fit_rule", "figure", "search", "limit_reached")}
        summary["max_batch_search"].update(dir=str(search_dir), trials=len(found["trials"]))
        summary.setdefault("notes", {}).update(found.get("notes") or {})
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return result


def run_until_decided(runs, root: Path, extra: List[str], env: Dict[str, str], args, search) -> Tuple[List[str], float]:
    """--repeats auto: a block of repeats at a time; from --min-repeats on, a look at the verdicts (at the
    corrected level) after each block, until every verdict is decided or --max-repeats."""
    confidence, failed, looks, why = sequential.level(args.min_repeats, args.max_repeats), [], [], ""
    for r in range(args.max_repeats):
        block = [run for run in runs if run[2] == r]
        failed += run_all(block, root, extra, env, args.run_timeout, args.until, search,
                          first=sum(1 for run in runs if run[2] < r) + 1)
        if r + 1 < args.min_repeats:
            continue
        looks.append(r + 1)
        stop, why = sequential.decision(compare.build([root], level=confidence)["checks"], r + 1, args.max_repeats)
        print(f"look at n={r + 1}: {why}", flush=True)
        if stop:
            break
    sequential.write(root, {"level": confidence, "looks": looks, "stopped": why, "min_repeats": args.min_repeats,
                            "max_repeats": args.max_repeats,
                            "possible_looks": args.max_repeats - args.min_repeats + 1})
    return failed, confidence


def main(argv: List[str] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    argv, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m ablate.sweeps", description=__doc__.split("\n\n")[1],
                                     epilog="example: python -m ablate.sweeps c3_no_sync --repeats 3 -- logger=none")
    parser.add_argument("names", nargs="*", help="sweeps/ files (week4: all of them); see --list")
    parser.add_argument("--list", action="store_true", help="list the sweeps with their claim, knob and arms")
    parser.add_argument("--repeats", default="1", help="runs per arm (default 1: no interval), or auto: add "
                        "repeats until every verdict is decided (report/sequential.py)")
    parser.add_argument("--min-repeats", type=int, default=2, help="with --repeats auto: the first look")
    parser.add_argument("--max-repeats", type=int, default=5, help="with --repeats auto: the last look")
    parser.add_argument("--dir", type=Path, help="output folder (default multirun/<names>_<time>)")
    parser.add_argument("--order", choices=("interleaved", "random"), default=None,
                        help="interleaved (A B, A B, ...: the default) or random blocks (the default of a factorial "
                             "design: each repeat a block in its own random order)")
    parser.add_argument("--seed", type=int, default=0, help="seed of --order random")
    parser.add_argument("--run-timeout", type=float, help="seconds per run (and per batch search); a run past "
                        "it is killed and named, the sweep goes on")
    parser.add_argument("--until", type=float, help="a Unix time: runs that would start after it are not run "
                        "(and named); a run's timeout never passes it")
    parser.add_argument("--batch-search", action="append", default=[], metavar="KEY=VALUE",
                        help="change a sweep's batch_search (e.g. multiple_of=64, limit=512, start=64)")
    parser.add_argument("--repeat-side-arms", action="store_true",
                        help="repeat arms that are neither baseline nor treatment too (default: once)")
    args = parser.parse_args(argv)
    if args.list:
        print(listing())
        return 0
    auto = args.repeats == "auto"
    if not args.names or not (auto or args.repeats.isdigit() and int(args.repeats) >= 1) \
            or not 1 <= args.min_repeats <= args.max_repeats:
        parser.error("give at least one sweep name (see --list) and --repeats >= 1 or auto "
                     "(with 1 <= --min-repeats <= --max-repeats)")
    repeats = args.max_repeats if auto else int(args.repeats)
    from ablate.config import ConfigError

    try:
        runs = plan_runs(expand(args.names), extra, repeats, args.order, args.seed,
                         side_arms_once=not args.repeat_side_arms)
    except ConfigError as e:
        print(f"ablate.sweeps: error: {e}", file=sys.stderr)
        return 2
    root = args.dir or Path("multirun") / f"{'-'.join(args.names)}_{datetime.now():%Y-%m-%d_%H-%M-%S}"
    refused = claim_dir(root, runs)
    if refused:
        print(f"ablate.sweeps: error: {refused}", file=sys.stderr)
        return 2
    order = args.order or ("random blocks" if any(is_factorial(n) for n in expand(args.names)) else "interleaved")
    print(f"{len(runs)} runs ({'up to ' if auto else ''}{repeats} repeat(s), {order}) into {root}", flush=True)
    search = {k: yaml.safe_load(v) for k, _, v in (kv.partition("=") for kv in args.batch_search)}
    env = {"ABLATE_PREFLIGHT_DONE": "1"}
    if auto:
        failed, confidence = run_until_decided(runs, root, extra, env, args, search)
    else:
        failed, confidence = run_all(runs, root, extra, env, args.run_timeout, args.until, search), 0.95
    from ablate import report

    code = report.main([str(root), "--confidence", str(confidence)]) if root.exists() else 2
    if failed:
        print(f"ablate.sweeps: {len(failed)} run(s) failed: {'; '.join(failed)} (named in the report)",
              file=sys.stderr)
    return 1 if failed else code


if __name__ == "__main__":
    sys.exit(main())
