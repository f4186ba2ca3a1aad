"""train/ (conf/train): one rank's run, from the rank environment to the summary.

loop.py (`run`: build, train, measure, summarise) uses ranks.py (the rank environment, read once; no torch,
so the command line may ask it), distributed.py (the process group), checkpoint.py (save and resume;
manifest.py says a checkpoint is whole; signals.py turns a stop signal into one), hooks.py (code named by
ABLATE_STEP_HOOKS, run as each step begins), guards.py (a fresh run dir and its lock, before a run starts),
memory_guard.py (whether it fits) and provenance.py (what ran where).
"""
