"""train/ (conf/train): one rank's run, from the rank environment to the summary.

loop.py (`run`: build, train, measure, summarise) uses distributed.py (the rank environment, read once, and
the process group), checkpoint.py (save and resume; manifest.py says a checkpoint is whole; signals.py
turns a stop signal into one), guards.py (what must be true before a run starts: a fresh run dir, its
lock, memory) and provenance.py (what ran where).
"""
