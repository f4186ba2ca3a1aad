"""What the fork server of launcher/local.py imports before it forks any rank (its preload), and only it.

The server is a child of the launcher in the launcher's process group, so a signal to the whole group reaches
it too. SIGINT it ignores by itself (Python's forkserver); SIGTERM (`kill -TERM -PGID`, systemd stopping a
unit, Slurm ending a step) would end it, and the launcher, which learns of its ranks' exits through the server,
would then take ranks still checkpointing for ranks gone and say "before a checkpoint was written". So the
server ignores SIGTERM; each rank takes the default back first thing (local._rank_entry) and then installs
its own handler (train/signals.py). The server ends once the launcher and its ranks are gone.
"""
import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)

import torch._dynamo  # noqa: E402,F401  (every rank's first optimizer imports it: torch/_compile.py, ~2 s of CPU)

import ablate.launcher.local  # noqa: E402,F401  (what every rank runs: torch and the trainer, imported once)
