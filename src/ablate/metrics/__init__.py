"""Measurement: each figure is one collector (collectors.py's BuiltIn), the meter (meter.py) keeps the measuring
window and lists them: health.py, throughput.py (FLOPs in flops.py, the peak in peak.py, steady-state speed and
stalls from the median step in steady.py), timing.py, comm.py, memory.py, gpu_util.py, host.py. A user's own
collectors: collectors.py. Traces: profile.py, overlap.py."""
