"""What ablate costs a training step, measured from outside: a user's 4-layer module of width 256 (batch 8, seq 128,
AdamW with clipping) trained by a hand-written loop and by `python -m ablate`, each as a fresh process, at 50 and 550
steps; a step's cost is (T(550) - T(50)) / 500, so start-up (imports, building, the GEMM probe) cancels out. Rounds
are interleaved (loop 50, ablate 50, loop 550, ablate 550, ...); prints each round's loop / ablate ratio and the
median (target >= 0.98: ablate's step no dearer than the loop's).

Start-up, in the same rounds: `python -c "import torch"`, the loop and ablate at 3 steps, each a fresh process;
prints the medians of ablate / import torch and ablate / loop. torch.optim's step imports torch._dynamo (about as
long as `import torch` itself, torch 2.13), so no 3-step run of a torch optimizer starts in under ~x1.9 of
`import torch`: the loop's own ratio says where that floor lies on the machine measured.

    .venv/bin/python bench/step_cost.py [--rounds 5] [--ranks 1] [extra ablate overrides ...]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODULE = '''
import torch
from torch import nn


class Net(nn.Module):
    """The user's module: token ids in, logits out; 4 residual MLP blocks of width 256."""

    def __init__(self, vocab_size=512, dim=256, n_layers=4):
        super().__init__()
        self.vocab_size = vocab_size
        self.embed, self.head = nn.Embedding(vocab_size, dim), nn.Linear(dim, vocab_size)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.GELU(),
                                                  nn.Linear(4 * dim, dim)) for _ in range(n_layers))

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)
'''

LOOP = '''
import sys, torch
from benchnet import Net
torch.manual_seed(0)
steps = int(sys.argv[1])
model = Net()
decay = [p for p in model.parameters() if p.dim() >= 2]
rest = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                        lr=3e-3, betas=(0.9, 0.95))
g = torch.Generator().manual_seed(0)
for step in range(steps):
    x = torch.randint(0, 512, (8, 129), generator=g)
    logits = model(x[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 512), x[:, 1:].reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
'''

STARTUP_STEPS = 3
ABLATE = ["model=benchnet", "train.batch_size=8", "train.seq_len=128", "optim=adamw", "train.max_grad_norm=1.0",
          "logger=none", "train.warmup_steps=1", "metrics.gemm_probe=false"]


def timed(cmd, env, cwd) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--short", type=int, default=50)
    p.add_argument("--long", type=int, default=550)
    args, extra = p.parse_known_args()
    work = Path(tempfile.mkdtemp(prefix="ablate-step-cost-"))
    (work / "benchnet.py").write_text(MODULE)
    (work / "loop.py").write_text(LOOP)
    (work / "conf" / "model").mkdir(parents=True)
    (work / "conf" / "model" / "benchnet.yaml").write_text("_target_: benchnet.Net\nvocab_size: 512\n")
    env = {**os.environ, "PYTHONPATH": str(work)}
    ratios, starts = [], []
    for r in range(args.rounds):
        t = {}
        t["torch"] = timed([sys.executable, "-c", "import torch"], env, work)
        for n in (STARTUP_STEPS, args.short, args.long):
            t["loop", n] = timed([sys.executable, "loop.py", str(n)], env, work)
            t["ablate", n] = timed([sys.executable, "-m", "ablate", "--config-dir", str(work / "conf"), *ABLATE,
                                    f"train.steps={n}", f"hydra.run.dir={work / f'run{r}_{n}'}", *extra], env, work)
        starts.append((t["ablate", STARTUP_STEPS] / t["torch"], t["loop", STARTUP_STEPS] / t["torch"],
                       t["ablate", STARTUP_STEPS] / t["loop", STARTUP_STEPS]))
        per_step = {k: (t[k, args.long] - t[k, args.short]) / (args.long - args.short) for k in ("loop", "ablate")}
        ratios.append(per_step["loop"] / per_step["ablate"])
        print(f"round {r + 1}: loop {per_step['loop'] * 1e3:.2f} ms/step, ablate {per_step['ablate'] * 1e3:.2f} "
              f"ms/step, loop / ablate x{ratios[-1]:.3f}", flush=True)
    print(f"median loop / ablate per-step cost: x{statistics.median(ratios):.3f} "
          f"(rounds {min(ratios):.3f} to {max(ratios):.3f}; target >= 0.98)")
    n = STARTUP_STEPS
    for i, what in enumerate((f"ablate {n} steps / import torch", f"loop {n} steps / import torch",
                              f"ablate / loop at {n} steps")):
        values = [s[i] for s in starts]
        print(f"start-up, {what}: median x{statistics.median(values):.2f} (rounds {min(values):.2f} to "
              f"{max(values):.2f})")


if __name__ == "__main__":
    main()
