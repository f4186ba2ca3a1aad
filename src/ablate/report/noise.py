"""How much identical runs differ here: each sweep's own noise, and the host's A/A floor with its address.

- A sweep's own noise: the spread of its baseline arm's repeats (an A/A inside the sweep). With the sd of
  log tokens/s over those repeats, the ratio of two identical runs falls within +-(exp(1.96 sqrt(2) sd) - 1)
  95% of the time: `pair_spread`.
- The host's floor: the A/A sweep's (sweeps/aa_noise.yaml) tokens/s interval, kept in
  <cache>/noise_floor.json per host and workload ("<host>|<workload>"), with the date and the directory it
  came from. An A/A with an outlier, a stall or a run whose machine was more than 10% off its calibrated
  speed (summary.json's machine_speed) never replaces a floor (it measured the other job, or the machine, not
  the noise). Every report's header says which floor it shows, where and when it was measured, and for which
  workload.
"""
from __future__ import annotations

import json
import math
import os
import socket
import statistics
import sys
from datetime import datetime
from typing import Dict, List, Optional

from ablate import user_cache_dir
from ablate.report import runs as R

Z95 = 1.959964


def workload(run: R.Run) -> str:
    """What the floor depends on besides the host: the model, the batch shape, ranks, precision, strategy."""
    c = run.config
    model, train = c.get("model") or {}, c.get("train") or {}
    return (f"{model.get('name', '?')} b{train.get('batch_size')}x{train.get('seq_len')} "
            f"accum {train.get('grad_accum', 1)}, {(c.get('precision') or {}).get('name')}, "
            f"{(c.get('parallel') or {}).get('name')}, x{run.summary.get('world_size', 1)}")


def within(group: R.Group) -> Optional[Dict[str, float]]:
    """This sweep's own noise from its baseline repeats (None under 3 repeats)."""
    base = group.arms.get("baseline")
    rates = [r.metric("tokens_per_s") for r in (base.runs if base else [])]
    rates = [v for v in rates if v and v > 0]
    if len(rates) < 3:
        return None
    sd = statistics.stdev(math.log(v) for v in rates)
    return {"n": len(rates), "sd_log": sd, "pair_spread": math.exp(Z95 * math.sqrt(2) * sd) - 1}


def within_text(noise: Optional[Dict[str, float]]) -> str:
    if not noise:
        return "Noise in this sweep: fewer than 3 baseline repeats, no estimate (use --repeats 3 or more)."
    return (f"Noise in this sweep (its baseline's {noise['n']} repeats, an A/A inside it): two identical runs' "
            f"tokens/s differ by up to ±{noise['pair_spread']:.1%} (95%; sd of log tokens/s {noise['sd_log']:.3f}).")


def _cache():
    return user_cache_dir() / "noise_floor.json"


def _read() -> Dict[str, Dict]:
    """The cached floors; a damaged file is named on stderr and set aside (<file>.damaged), never taken for
    "no A/A measured yet" nor overwritten unseen."""
    path = _cache()
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text())
        if not (isinstance(entries, dict) and all(isinstance(v, dict) for v in entries.values())):
            raise ValueError("not a mapping of host|workload to floors")
        bad = next((k for k, v in entries.items() if not well_typed(v)), None)
        if bad is not None:
            raise ValueError(f"the entry {bad!r} has a field of the wrong type")
    except (OSError, ValueError) as e:
        aside = path.with_name(path.name + ".damaged")
        try:
            os.replace(path, aside)
        except OSError:
            aside = None
        print(f"ablate: warning: the noise-floor cache {path} cannot be read ({type(e).__name__}: {e})"
              + (f"; set aside as {aside}" if aside else ""), file=sys.stderr)
        return {}
    return entries


# an entry's fields and their types, as floor() writes them
FIELDS = {"half_width": (int, float), "ci_low": (int, float), "ci_high": (int, float), "n": int, "hardware": str,
          "host": str, "workload": str, "measured": str}


def well_typed(entry: Dict) -> bool:
    return all(isinstance(entry.get(k), t) and not isinstance(entry.get(k), bool) for k, t in FIELDS.items())


def cached() -> Dict[str, Dict]:
    """The noise floors this user's cache holds, by host and workload (ablate.baseline keeps the host's)."""
    return _read()


def floor(groups: List[R.Group], checks, flagged: Dict[str, str]) -> Optional[Dict[str, object]]:
    """The floor for these runs: measured by them (and kept, unless an outlier or stall spoiled it), else
    this host's cached floor for their workload, else this host's latest for any workload (said so)."""
    host, entries, unused = socket.gethostname(), _read(), ""
    for group in (g for g in groups if g.sweep.get("noise_floor")):
        check = next((c for c in checks if c.sweep == group.name and c.metric == "tokens_per_s"), None)
        if check is None or check.ci_low is None:
            unused = f"; these runs' A/A gives no interval ({check.reason if check else 'no tokens/s check'})"
            continue
        every = [r for arm in group.arms.values() for r in arm.runs]
        # the same rule as every report's: a run whose machine was off its calibrated speed measured the machine
        spoiled = [r.path.name for r in every if str(r.path) in flagged or r.summary.get("stalls")
                   or (r.summary.get("machine_speed") or {}).get("off")]
        entry = {"half_width": max(check.ci_high - 1, 1 - check.ci_low), "ci_low": check.ci_low,
                 "ci_high": check.ci_high, "n": check.n, "hardware": check.hardware, "host": host,
                 "workload": workload(every[0]), "measured": _when(every), "dir": str(every[0].path.parent.resolve())}
        if not spoiled:
            entries[f"{host}|{entry['workload']}"] = entry
            _cache().parent.mkdir(parents=True, exist_ok=True)
            _cache().write_text(json.dumps(entries, indent=1))
        return {**entry, "from": "these runs" + (f" (not cached: {len(spoiled)} run(s) with an outlier, a stall "
                                                 f"or a machine off its calibrated speed: {', '.join(spoiled[:3])})"
                                                 if spoiled else "")}
    mine = [e for e in entries.values() if e.get("host") == host]
    if not mine:
        return {"none": unused} if unused else None
    wanted = {workload(r) for g in groups for arm in g.arms.values() for r in arm.runs}
    same = [e for e in mine if e.get("workload") in wanted]
    chosen = max(same or mine, key=lambda e: e.get("measured", ""))
    return {**chosen, "from": f"cached ({_cache()})" + ("" if same else ": another workload than these runs'")
            + unused}


def _when(runs: List[R.Run]) -> str:
    """When the runs were made: the newest summary.json's time."""
    newest = max((r.path / "summary.json").stat().st_mtime for r in runs)
    return datetime.fromtimestamp(newest).strftime("%Y-%m-%d %H:%M")


def header_line(entry: Optional[Dict[str, object]]) -> str:
    if not entry or "none" in entry:
        return ("**Noise floor**: no A/A measured on this host yet" + (entry or {}).get("none", "")
                + ": `python -m ablate.sweeps aa_noise --repeats 5`.")
    return (f"**Noise floor** (A/A sweep, {entry['from']}): tokens/s differs by up to ±{entry['half_width']:.1%} "
            f"between identical runs (95% interval of the ratio [{entry['ci_low']:.3f}, {entry['ci_high']:.3f}], "
            f"n={entry['n']}), measured {entry['measured']} on {entry['host']} ({entry['hardware']}) for the "
            f"workload {entry['workload']}, in `{entry['dir']}`.")
