"""Measurement: FLOPs/MFU (flops.py), memory and fragmentation (memory.py), step and phase timing
(timing.py), steady-state speed and stalls from the median step (steady.py), the peak (peak.py),
communication (comm.py), traces (profile.py, overlap.py), all gathered by meter.py at log steps."""
