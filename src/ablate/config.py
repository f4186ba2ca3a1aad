"""Structured configs: one dataclass per config group (registered in Hydra's ConfigStore by schema.py).

`conf/<group>/<choice>.yaml` files fill these schemas; OmegaConf checks types while Hydra composes,
and `schema.validate()` checks values (each dataclass's `__post_init__`).
A bad value ends in one `ConfigError` line naming the key and the valid choices.
"""
from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


class ConfigError(ValueError):
    """A user mistake in the config: printed as one line, never a traceback."""


def _choice(key: str, value: Any, valid) -> None:
    if value not in valid:
        raise ConfigError(f"{key}={value}: not a valid choice; valid choices: {', '.join(map(str, valid))}")


def _registered(group: str):
    """A group's valid choices, from the one registry that implements them (imported on use)."""
    return tuple(importlib.import_module(f"ablate.{group}").REGISTRY)


def _at_least(key: str, value, low) -> None:
    if value is None or value < low:
        raise ConfigError(f"{key}={value}: must be >= {low}")


@dataclass
class ModelConfig:
    """A Llama-style decoder. Sizes follow Meta's published Llama 3 configs (see conf/model/*.yaml)."""
    name: str = "tiny"
    dim: int = 64                  # hidden size
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2            # < n_heads: grouped-query attention
    vocab_size: int = 256
    ffn_hidden: int = 192          # SwiGLU inner size
    max_seq_len: int = 256         # RoPE table length
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    activation_checkpointing: bool = False   # recompute each block's forward in backward (8N accounting)
    attention: str = "sdpa"        # sdpa: fused kernel; math: explicit matmuls (countable by FlopCounterMode)

    def __post_init__(self):
        for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_hidden", "max_seq_len"):
            _at_least(f"model.{k}", getattr(self, k), 1)
        _choice("model.attention", self.attention, ("sdpa", "math"))
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model.dim={self.dim}, model.n_heads={self.n_heads}, model.n_kv_heads="
                              f"{self.n_kv_heads}: dim must divide by n_heads and n_heads by n_kv_heads")


@dataclass
class TrainConfig:
    """The optimisation loop. `batch_size` is per rank and per micro-step."""
    steps: int = 40                # optimizer steps
    warmup_steps: int = 5          # excluded from every speed figure (compile, allocator warm-up)
    batch_size: int = 8            # per rank and micro-step (derived when global_batch_size is set)
    global_batch_size: Optional[int] = None   # sequences per optimizer step over all ranks
    seq_len: int = 64
    seq_len_min: Optional[int] = None   # set: each batch's length is drawn from [seq_len_min, seq_len]
    grad_accum: int = 1            # micro-steps per optimizer step
    lr: float = 3e-3
    weight_decay: float = 0.1
    beta1: float = 0.9             # AdamW betas (Llama / nanoGPT values)
    beta2: float = 0.95
    max_grad_norm: float = 1.0     # 0 disables clipping (the norm is still measured)
    log_every: int = 5
    seed: int = 0
    compile: bool = False          # torch.compile the model
    device: str = "auto"           # auto | cpu | cuda
    resume: Optional[str] = None   # a checkpoint file or run directory to continue
    checkpoint_every: int = 0      # 0: only when stopped by a signal (and at the last step when > 0)
    max_nonfinite_steps: int = 10  # consecutive NaN/inf steps that stop the run (0: never); checked at log steps
    skip_memory_check: bool = False   # start even when the memory estimate says the run cannot fit

    def __post_init__(self):
        _at_least("train.steps", self.steps, 1)
        _at_least("train.warmup_steps", self.warmup_steps, 0)
        if self.warmup_steps >= self.steps:
            raise ConfigError(f"train.warmup_steps={self.warmup_steps}: must be < train.steps={self.steps}")
        for k in ("batch_size", "seq_len", "grad_accum", "log_every"):
            _at_least(f"train.{k}", getattr(self, k), 1)
        if self.seq_len_min is not None and not 1 <= self.seq_len_min <= self.seq_len:
            raise ConfigError(f"train.seq_len_min={self.seq_len_min}: must be in [1, train.seq_len={self.seq_len}]")
        if not math.isfinite(self.lr) or self.lr <= 0:
            raise ConfigError(f"train.lr={self.lr}: must be a finite number > 0")
        for k in ("beta1", "beta2"):
            if not 0 <= getattr(self, k) < 1:
                raise ConfigError(f"train.{k}={getattr(self, k)}: must be in [0, 1)")
        _at_least("train.max_grad_norm", self.max_grad_norm, 0)
        _at_least("train.checkpoint_every", self.checkpoint_every, 0)
        _at_least("train.max_nonfinite_steps", self.max_nonfinite_steps, 0)
        _choice("train.device", self.device, ("auto", "cpu", "cuda"))
        if self.resume is not None and not os.path.exists(self.resume):
            raise ConfigError(f"train.resume={self.resume}: no such file or run directory")


@dataclass
class PrecisionConfig:
    """Numeric format of the forward/backward. fp16 adds a dynamic GradScaler."""
    name: str = "fp32"
    init_scale: float = 65536.0    # GradScaler (fp16 only)
    growth_interval: int = 2000
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    fp8_recipe: str = "tensorwise"  # torchao Float8LinearConfig recipe (E4M3 forward, E5M2 gradients)

    def __post_init__(self):
        _choice("precision.name", self.name, _registered("precision"))
        _at_least("precision.growth_interval", self.growth_interval, 1)
        if self.init_scale <= 0:
            raise ConfigError(f"precision.init_scale={self.init_scale}: must be > 0")


@dataclass
class ParallelConfig:
    """Data-parallel strategy. DeepSpeed fields apply to zero1/2/3 only."""
    name: str = "none"
    no_sync: bool = True                 # ddp: all-reduce once per optimizer step, not every micro-step
    bucket_cap_mb: Optional[float] = None   # ddp: gradient bucket size (None: torch's 25 MB)
    reshard_after_forward: bool = True   # fsdp2
    overlap_comm: bool = True            # deepspeed: overlap reduction with backward
    contiguous_gradients: bool = True
    reduce_bucket_size: int = 50_000_000
    allgather_bucket_size: int = 50_000_000
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_param_persistence_threshold: int = 100_000
    offload_optimizer: bool = False

    def __post_init__(self):
        _choice("parallel.name", self.name, _registered("parallel"))


@dataclass
class AllocatorConfig:
    """CUDA caching-allocator settings, written to PYTORCH_ALLOC_CONF before CUDA starts."""
    name: str = "default"
    expandable_segments: bool = False
    max_split_size_mb: Optional[int] = None
    garbage_collection_threshold: Optional[float] = None
    extra: str = ""                      # appended verbatim, e.g. "roundup_power2_divisions:4"


@dataclass
class DataloaderConfig:
    """How batches reach the device."""
    name: str = "naive"
    num_workers: int = 0
    pin_memory: bool = False
    non_blocking: bool = False
    prefetch_factor: Optional[int] = None
    persistent_workers: bool = False
    cuda_prefetch: bool = False          # copy batch k+1 on a side stream while step k computes
    read_latency_ms: float = 0.0         # simulated storage latency per batch

    def __post_init__(self):
        _at_least("dataloader.num_workers", self.num_workers, 0)
        _at_least("dataloader.read_latency_ms", self.read_latency_ms, 0)
        if self.prefetch_factor is not None:
            _at_least("dataloader.prefetch_factor", self.prefetch_factor, 1)
        if self.num_workers == 0 and (self.prefetch_factor is not None or self.persistent_workers):
            raise ConfigError("dataloader.prefetch_factor/persistent_workers need dataloader.num_workers >= 1")


@dataclass
class NcclConfig:
    """NCCL/CUDA environment, applied before any process group exists. Empty values set nothing."""
    name: str = "default"
    env: Dict[str, str] = field(default_factory=dict)
    async_error_handling: Optional[int] = None   # written under the name the installed torch reads


@dataclass
class LoggerConfig:
    """Where figures go besides metrics.jsonl/summary.json."""
    name: str = "wandb"
    project: str = "ablate"
    entity: Optional[str] = None
    mode: str = "auto"                   # auto: online with credentials, else offline
    group: Optional[str] = None          # W&B group (a sweep's name)
    job_type: Optional[str] = None       # W&B job_type (a week-4 claim)
    tags: List[str] = field(default_factory=list)
    init_timeout_s: float = 15.0         # online W&B that does not answer by then: log offline, sync later

    def __post_init__(self):
        _choice("logger.name", self.name, _registered("tracking"))
        _choice("logger.mode", self.mode, ("auto", "online", "offline", "disabled"))


@dataclass
class LauncherConfig:
    """Where the ranks run: local processes, or a Slurm job through submitit."""
    name: str = "local"
    nproc_per_node: int = 1
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    mem_gb: Optional[int] = None
    timeout_min: int = 60
    signal_delay_s: int = 90
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    additional_parameters: Dict[str, Any] = field(default_factory=dict)
    setup: List[str] = field(default_factory=list)
    wait: bool = True
    dry_run: bool = False
    max_restarts: int = 3                # requeues after preemption/time limit
    folder: Optional[str] = None         # submitit folder; default: <run dir>/slurm
    check_cluster: bool = True           # refuse what the partition can never run before submitting (cluster.py)
    cancel_unrunnable: bool = True       # wait: cancel a job whose pending reason cannot clear by itself
    array_parallelism: Optional[int] = None   # -m sweeps go as one job array: at most this many tasks at once

    def __post_init__(self):
        _choice("launcher.name", self.name, _registered("launcher"))
        for k in ("nproc_per_node", "nodes", "cpus_per_task"):
            _at_least(f"launcher.{k}", getattr(self, k), 1)
        _at_least("launcher.gpus_per_node", self.gpus_per_node, 0)

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node


@dataclass
class MetricsConfig:
    """Measurement knobs (not a group: plain fields under `metrics`)."""
    peak_tflops: Optional[float] = None  # override the datasheet/measured peak
    gemm_probe: bool = True              # measure this machine's matmul peak in the run's dtype
    gemm_probe_n: int = 0                # 0: 8192 on CUDA, 1024 on CPU
    nvml_interval_s: float = 0.2
    # where the measured peak is cached per (host, device, dtype, threads), so every run of a sweep shares
    # one MFU denominator; null: the user cache (ABLATE_CACHE_DIR or ~/.cache/ablate/peak_flops.json)
    peak_cache: Optional[str] = None
    # [start, count]: trace training steps start..start+count-1 with torch.profiler (traces/rank{N}.json.gz)
    # and measure exposed communication and data wait from the trace; null: off
    profile_steps: Optional[List[int]] = None


@dataclass
class AblateConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    dataloader: DataloaderConfig = field(default_factory=DataloaderConfig)
    nccl: NcclConfig = field(default_factory=NcclConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    sweep: Dict[str, Any] = field(default_factory=dict)   # a sweeps/ file's claim metadata, if any

    def __post_init__(self):
        t, world = self.train, self.launcher.world_size
        if t.global_batch_size is not None:
            per_step = world * t.grad_accum
            if t.global_batch_size % per_step or t.global_batch_size < per_step:
                raise ConfigError(f"train.global_batch_size={t.global_batch_size}: does not split over "
                                  f"{world} ranks x train.grad_accum={t.grad_accum}; use a multiple of {per_step}")
            t.batch_size = t.global_batch_size // per_step
        from ablate.parallel import REGISTRY as STRATEGIES

        if world > 1 and not STRATEGIES[self.parallel.name].needs_group:
            several = [c for c, spec in STRATEGIES.items() if spec.needs_group]
            raise ConfigError(f"parallel=none with {world} ranks (launcher nodes x nproc_per_node): one process "
                              f"only; valid choices for several ranks: {', '.join(several)}")
        spec = self.metrics.profile_steps
        if spec is not None and (len(spec) != 2 or spec[0] < 1 or spec[1] < 1 or sum(spec) - 1 > self.train.steps):
            raise ConfigError(f"metrics.profile_steps={list(spec)}: give [start, count] with start >= 1, count >= 1 "
                              f"and start + count - 1 <= train.steps={self.train.steps}")
        if self.train.seq_len > self.model.max_seq_len:
            raise ConfigError(f"train.seq_len={self.train.seq_len}: must be <= model.max_seq_len="
                              f"{self.model.max_seq_len}")
