"""Measurement: FLOPs/MFU (flops.py), memory and fragmentation (memory.py), step timing (timing.py),
GPU utilisation from NVML (nvml.py). Each exposes plain functions the training loop calls at log steps."""
