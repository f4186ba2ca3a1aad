"""conf/hardware/*.yaml -> one GPU's datasheet, declared once: its memory, its peak FLOP/s per dtype and the
bandwidth of the links its collectives cross (within a node, across nodes), each file citing its source. Read by
the datasheet MFU (metrics/flops.py: which file a device is, by its name) and by `ablate.plan --hardware NAME`
(whether the planned peak fits its memory). A team's own GPU: a YAML file with the same keys, given by path.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import yaml

from ablate import CONF_DIR
from ablate.config import ConfigError

HARDWARE_DIR = CONF_DIR / "hardware"
KEYS = ("name", "device_names", "memory_gib", "peak_tflops", "nvlink_gbytes_per_s", "network_gbits_per_s",
        # optional, achieved (microbenchmarks, each sourced in the file, or measured by `python -m ablate.calibrate`):
        # the step-time model's rates (predict/kernels.py, predict/__init__.py)
        "matmul_tflops", "attention_tflops", "memory_gbytes_per_s", "launch_us", "collective_gbytes_per_s",
        "collective_latency_us", "collective_latency_after_us", "op_us", "autograd_us", "optimizer_tensor_us",
        "optimizer_us", "overlap", "strategy_unit_us", "framework_unit_us", "provenance")
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
# Parts that share a family name with a file here but run at other clocks and power (H100/H200 NVL, GB200, GH200):
# no file of theirs, so they get none rather than the SXM/B200 one, which would read their MFU ~15% low. Set
# metrics.peak_tflops for them, or give ablate.plan a file of their own.
OTHER_VARIANTS = ("NVL", "GB200", "GH200")


@dataclass(frozen=True)
class Hardware:
    name: str
    device_names: Tuple[str, ...]       # torch.cuda.get_device_name() contains one of these (upper case)
    memory_bytes: float
    peak_flops: Dict[str, float]        # per dtype column: bf16 | fp8 | fp32
    nvlink_bytes_per_s: Optional[float]
    network_bytes_per_s: Optional[float]
    source: str                         # the file
    matmul_flops: Optional[Dict[str, float]] = None   # achieved (the file's matmul_tflops), per dtype column
    attention_flops: Optional[Dict[str, float]] = None   # achieved by SDPA's fused kernel, per dtype column
    memory_bytes_per_s: Optional[float] = None        # achieved by memory-bound kernels
    launch_s: Optional[float] = None                  # the least time a kernel takes
    collective_bytes_per_s: Optional[Dict[str, float]] = None   # nccl-tests' bus bandwidth within a node, per kind
    collective_latency_s: Optional[Dict[str, float]] = None     # base, hop_nvlink, hop_network (NCCL's ring model)
    provenance: Optional[Dict[str, str]] = None       # where each achieved figure comes from
    op_seconds: Optional[Dict[str, float]] = None     # ops timed at their own shapes (predict/kernels.py's signature)
    autograd_s: Optional[float] = None                # a training step's op beyond the op: autograd's node, engine
    overlap: Optional[float] = None                   # the share of communication concurrent compute hides
    optimizer_tensor_s: Optional[float] = None        # the optimizer's step and clipping per parameter tensor
    strategy_unit_s: Optional[Dict[str, float]] = None   # a strategy's bookkeeping per unit and pass (its mesh)
    # a call's base latency after that much compute since the last (keys: microseconds of work): the lockstep probe's
    # on a CPU, where a call waits longer for its slowest peer the longer the work before it
    collective_latency_after_s: Optional[Dict[str, float]] = None
    optimizer_seconds: Optional[Dict[str, float]] = None   # a rank's optimizer step timed at its shapes (its signature)
    framework_unit_s: Optional[float] = None   # what a unit's forward and backward cost beyond its ops, per pass

    def record(self) -> Dict[str, object]:
        return {"name": self.name, "memory_bytes": self.memory_bytes, "peak_flops": self.peak_flops,
                "nvlink_bytes_per_s": self.nvlink_bytes_per_s, "network_bytes_per_s": self.network_bytes_per_s,
                "source": self.source}


def given(key: str, value) -> str:
    """How the user gave the file: `--hardware FILE`, or `launcher.hardware=FILE`."""
    return f"{key}{value}" if key.endswith("=") else f"{key} {value}"


def load(path: Path, key: str = "--hardware") -> Hardware:
    """One file; a key missing or unknown is one line naming the file (as `key` gave it) and the keys."""
    try:
        node = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{given(key, path)}: cannot be read ({type(e).__name__}: {str(e).splitlines()[0]})") \
            from None
    if not isinstance(node, dict):
        raise ConfigError(f"{given(key, path)}: not a hardware file (a YAML mapping of {', '.join(KEYS)}); valid: "
                          f"{', '.join(choices())}, or such a file of your own")
    unknown, missing = set(node) - set(KEYS), [k for k in KEYS[:4] if k not in node]
    if unknown or missing or not isinstance(node.get("peak_tflops"), dict):
        raise ConfigError(f"{given(key, path)}: {'unknown ' + ', '.join(sorted(unknown)) if unknown else ''}"
                          f"{'; ' if unknown and missing else ''}{'missing ' + ', '.join(missing) if missing else ''}"
                          f"{'peak_tflops must map dtypes to TFLOP/s' if not (unknown or missing) else ''}; "
                          f"a hardware file has {', '.join(KEYS)}")
    net = node.get("network_gbits_per_s")
    nvlink = node.get("nvlink_gbytes_per_s")
    return Hardware(str(node["name"]), tuple(str(d).upper() for d in node["device_names"]),
                    float(node["memory_gib"]) * 2**30, {k: float(v) * 1e12 for k, v in node["peak_tflops"].items()},
                    float(nvlink) * 1e9 if nvlink else None, float(net) * 1e9 / 8 if net else None, str(path),
                    scaled(node, "matmul_tflops", 1e12, path, key), scaled(node, "attention_tflops", 1e12, path, key),
                    _number(node, "memory_gbytes_per_s", 1e9, path, key), _number(node, "launch_us", 1e-6, path, key),
                    scaled(node, "collective_gbytes_per_s", 1e9, path, key),
                    scaled(node, "collective_latency_us", 1e-6, path, key),
                    {str(k): str(v) for k, v in (node.get("provenance") or {}).items()},
                    scaled(node, "op_us", 1e-6, path, key), _number(node, "autograd_us", 1e-6, path, key),
                    _number(node, "overlap", 1.0, path, key), _number(node, "optimizer_tensor_us", 1e-6, path, key),
                    scaled(node, "strategy_unit_us", 1e-6, path, key),
                    scaled(node, "collective_latency_after_us", 1e-6, path, key),
                    scaled(node, "optimizer_us", 1e-6, path, key), _number(node, "framework_unit_us", 1e-6, path, key))


def scaled(node, name: str, unit: float, path, key: str) -> Optional[Dict[str, float]]:
    """An optional mapping of figures (`{bf16: 682}`), in SI units; one line naming the key if it is not one."""
    value = node.get(name)
    if value is None:
        return None
    try:
        return {str(k): float(v) * unit for k, v in dict(value).items()}
    except (TypeError, ValueError):
        raise ConfigError(f"{given(key, path)}: {name} must map names to numbers (e.g. {{bf16: 682}}), not "
                          f"{value!r}") from None


def _number(node, name: str, unit: float, path, key: str) -> Optional[float]:
    value = node.get(name)
    if value is None:
        return None
    try:
        return float(value) * unit
    except (TypeError, ValueError):
        raise ConfigError(f"{given(key, path)}: {name} must be a number, not {value!r}") from None


def choices() -> Dict[str, Path]:
    return {p.stem: p for p in sorted(HARDWARE_DIR.glob("*.yaml"))}


def named(name_or_path: str, key: str = "--hardware") -> Hardware:
    """conf/hardware/NAME.yaml, or a file of the user's own (`key`: how the user gave it, for the one line)."""
    if name_or_path in choices():
        return load(choices()[name_or_path], key)
    if Path(name_or_path).is_file():
        return load(Path(name_or_path), key)
    raise ConfigError(f"{given(key, name_or_path)}: no such hardware; valid: {', '.join(choices())}, or a YAML file "
                      "of your own with the same keys")


def every() -> List[Hardware]:
    return [load(p) for p in choices().values()]


def for_device(device_name: str) -> Optional[Hardware]:
    """The file a torch.cuda.get_device_name() string is, by its longest matching name ("H100 PCIE" before
    "H100"), or None."""
    name = device_name.upper()
    if any(v in name for v in OTHER_VARIANTS):
        return None
    matches = [(len(d), hw) for hw in every() for d in hw.device_names if d in name]
    return max(matches, key=lambda m: m[0])[1] if matches else None
