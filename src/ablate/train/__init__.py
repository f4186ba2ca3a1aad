"""train/ (conf/train): one rank's run, from the rank environment to the summary.

trainer.py (`run`: build, resume, train, measure, summarise; the steps themselves in loop.py) uses ranks.py
(the rank environment, read once; no torch, so the command line may ask it), distributed.py (the process
group), checkpoint.py (save and resume; resumable.py says what a checkpoint can become; manifest.py says a
checkpoint is whole; signals.py turns a stop signal into one), hooks.py (code named by ABLATE_STEP_HOOKS,
run as each step begins), guards.py (a fresh run dir and its lock, before a run starts), memory_guard.py
(whether it fits) and provenance.py (what ran where).
"""
