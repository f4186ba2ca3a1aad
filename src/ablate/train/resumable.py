"""What a checkpoint can become on resume: refused in one line before anything is written (compose), and
checked again by each rank as it loads (train/trainer.py); what changes is recorded with the run."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from ablate import parallel
from ablate.config import ConfigError
from ablate.config.dims import in_use
from ablate.train.checkpoint import check_complete, newest_whole, read_meta, resolve

# what a checkpoint's format cannot change on resume (parallel: each strategy's file layout, in its registry)
FIXED = ("model", "precision.name", "optim.name", "optim._target_", "parallel.tp", "parallel.pp",
         "parallel.pp_stages_per_rank")
CHANGEABLE = ("optim.lr", "optim.weight_decay", "optim.beta1", "optim.beta2", "optim.schedule", "optim.warmup_steps",
              "optim.min_lr_ratio", "optim.decay_steps", "train.max_grad_norm",
              # allowed, but the run is no longer the saved one's continuation: another data order, other shapes
              "train.seed", "train.seq_len", "data.name", "data.path")


def _flat(node, prefix="") -> Dict[str, object]:
    out = {}
    for k, v in (node or {}).items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_resumable(saved: Optional[Dict], now: Dict, step: int, world: int, saved_world: Optional[int],
                    meshes: Tuple[Optional[Dict], Optional[Dict]] = (None, None)) -> Dict:
    """Refuse (one line) what a checkpoint cannot become; return {key: [saved, now]} of what changes: the keys that
    may change, the global batch, and the layout (the strategy, the world, the mesh: `meshes`, the checkpoint's and
    this run's records, where both are known)."""
    steps = now["train"]["steps"]
    if steps <= step:
        raise ConfigError(f"train.steps={steps}: the checkpoint is at step {step}; ask for more steps to continue "
                          f"(e.g. train.steps={step + max(step, 10)})")
    if not saved:
        return {}
    a, b = _flat(saved), _flat(now)
    fixed = [k for k in sorted(set(a) | set(b)) if k.startswith(FIXED) and a.get(k) != b.get(k)]
    was, now_ = (parallel.REGISTRY.get(a.get("parallel.name")), parallel.REGISTRY.get(b.get("parallel.name")))
    if was is None or now_ is None or was.checkpoint != now_.checkpoint \
            or (was.checkpoint_per_world and saved_world not in (None, world)):
        fixed.append("parallel")
    if fixed:
        raise ConfigError(f"train.resume: the checkpoint cannot continue under "
                          f"{', '.join(_change(k, a, b, saved_world, world) for k in fixed[:4])}; resume with the "
                          "checkpoint's values, or start a new run")
    _check_horizon(a, b, step)
    changed = {k: [a.get(k), b.get(k)] for k in CHANGEABLE if a.get(k) != b.get(k)}
    batch = [_global_batch(a, saved_world or world), _global_batch(b, world)]
    if batch[0] != batch[1]:   # more ranks (or another batch size): the same step now sees more sequences
        changed["global_batch"] = batch
    if a.get("parallel.name") != b.get("parallel.name"):   # a strategy that reads the same checkpoint (DCP's)
        changed["parallel.name"] = [a.get("parallel.name"), b.get("parallel.name")]
    if saved_world not in (None, world):
        changed["world_size"] = [saved_world, world]
    if None not in meshes and meshes[0] != meshes[1]:
        changed["mesh"] = [in_use(meshes[0]), in_use(meshes[1])]
    return changed


def _check_horizon(a: Dict, b: Dict, step: int) -> None:
    """A decaying schedule runs over train.steps: a resume that changes train.steps would stretch the decay and
    raise the rate again (warmup_cosine over 10 steps, resumed to 15: 1e-4 at step 10, 3e-4 at step 11). Refused
    unless optim.decay_steps says which horizon to keep (the checkpoint's, or a new one on purpose)."""
    if b.get("optim.schedule", "constant") == "constant" or b.get("optim.decay_steps") is not None:
        return
    was = a.get("optim.decay_steps") or a.get("train.steps")
    if was is None or was == b.get("train.steps"):
        return
    raise ConfigError(f"train.steps={b.get('train.steps')}: optim.schedule={b.get('optim.schedule')} decays over "
                      f"train.steps, and the checkpoint's run (at step {step}) decayed over {was}: its learning rate "
                      f"would rise again; keep its schedule with optim.decay_steps={was} (the floor holds after it), "
                      "or give optim.decay_steps=N for a new horizon")


def _change(key: str, a: Dict, b: Dict, saved_world: Optional[int], world: int) -> str:
    if key == "parallel":   # the strategy, or the world a per-rank checkpoint was written for
        return f"parallel={a.get('parallel.name')} on {saved_world} rank(s) -> {b.get('parallel.name')} on {world}"
    return f"{key}={a.get(key)} -> {b.get(key)}"


def _global_batch(flat: Dict[str, object], world: int) -> int:
    """Sequences per optimizer step, from a flattened config (global_batch_size, when it set the per-rank
    batch) and its world size."""
    given = flat.get("train.global_batch_size")
    if given:
        return int(given)
    # a tensor-parallel group, and a pipeline, trains on one batch
    dp = max(1, world // (int(flat.get("parallel.tp") or 1) * int(flat.get("parallel.pp") or 1)))
    return int(flat.get("train.batch_size") or 0) * int(flat.get("train.grad_accum") or 1) * dp


def check_resume(cfg, record: Dict) -> None:
    """What a resume cannot become, refused before anything is written (each rank checks again as it loads):
    judged on the newest checkpoint that is whole (a truncated latest falls back to the previous one)."""
    path = resolve(cfg.train.resume)
    if path is not None:
        check_complete(path)
        meta = read_meta(newest_whole(path))
        check_resumable(meta.get("config"), record, meta["step"], cfg.launcher.world_size, meta.get("world_size"))
