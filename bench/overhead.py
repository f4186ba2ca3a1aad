"""Overhead of ablate's measurement: the same model, batch and steps as a bare PyTorch loop and through
ablate (every metric on), alternated in one process; prints the tokens/s ratio (target >= 0.98).

    .venv/bin/python bench/overhead.py [--rounds 3] [--steps 60] [extra ablate overrides ...]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ablate import CONF_DIR, launcher, optim
from ablate.compose import validate
from ablate.config.store import register
from ablate.dataloader import SyntheticBatches
from ablate.model import build as build_model

MODEL = ["model.dim=256", "model.n_layers=4", "model.n_heads=8", "model.n_kv_heads=4", "model.ffn_hidden=768",
         "train.seq_len=128", "train.batch_size=8", "logger=none"]


def bare_loop(cfg) -> float:
    """What a user would write by hand: no metrics, no logging, no progress."""
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model)
    optimizer = optim.build(model.parameters(), cfg.optim)
    data = SyntheticBatches(cfg.model.vocab_size, cfg.train.batch_size, cfg.train.seq_len, None, cfg.train.seed)
    tokens, started = 0, None
    for step in range(cfg.train.steps):
        if step == cfg.train.warmup_steps:
            started, tokens = time.perf_counter(), 0
        x, y = data[step]
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += x.numel()
    return tokens / (time.perf_counter() - started)


def through_ablate(cfg, resolved) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        summary = launcher.launch(cfg, resolved, Path(tmp), {})
    return summary["tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    args, extra = parser.parse_known_args()
    register()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name="bench"):
        raw = compose("config", overrides=[*MODEL, f"train.steps={args.steps}", "train.warmup_steps=10",
                                           f"train.log_every={max(args.steps // 6, 1)}", *extra])
    cfg, resolved = validate(raw), OmegaConf.to_container(raw, resolve=True)
    bare, ours = [], []
    for r in range(args.rounds):   # alternate, so drift on a shared machine hits both alike
        bare.append(bare_loop(cfg))
        ours.append(through_ablate(cfg, resolved))
        print(f"round {r + 1}: bare {bare[-1]:,.0f} tok/s, ablate {ours[-1]:,.0f} tok/s, "
              f"ratio {ours[-1] / bare[-1]:.3f}", flush=True)
    ratio = statistics.median(o / b for o, b in zip(ours, bare))
    print(f"median ratio ablate / bare loop: {ratio:.3f} (target >= 0.98) over {args.rounds} rounds, "
          f"{args.steps} steps each, torch threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
