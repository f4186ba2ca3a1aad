"""Structured configs: one dataclass per config group (registered in Hydra's ConfigStore by store.py).

`conf/<group>/<choice>.yaml` files fill these schemas; OmegaConf checks types while Hydra composes,
and `compose.validate()` checks values (each dataclass's `__post_init__`) and the choices the registries
implement (config/ imports none of them: every other module imports config/).
A bad value ends in one `ConfigError` line naming the key and the valid choices.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ablate.config.errors import ConfigError
from ablate.config.fields import check_ranges, choice, num
from ablate.config.models import ModelConfig, model_from_node
from ablate.config.optims import OptimConfig, optim_from_node
from ablate.config.parallels import ParallelConfig
from ablate.config.sweep import check_sweep


@dataclass
class TrainConfig:
    """The optimisation loop. `batch_size` is per rank and per micro-step."""
    steps: int = num(40, 1)                # optimizer steps
    warmup_steps: int = num(5, 0)          # excluded from every speed figure (compile, allocator warm-up)
    batch_size: int = num(8, 1)            # per rank and micro-step (derived when global_batch_size is set)
    # sequences per optimizer step over all ranks (batch_size is then derived)
    global_batch_size: Optional[int] = num(None, 1, null="batch_size per rank")
    seq_len: int = num(64, 1)   # tokens per sequence (the longest, with seq_len_min)
    # set: each batch's length is drawn from [seq_len_min, seq_len]
    seq_len_min: Optional[int] = num(None, 1, null="every batch train.seq_len long")
    grad_accum: int = num(1, 1)            # micro-steps per optimizer step
    max_grad_norm: float = num(1.0, 0)     # 0 disables clipping (the norm is still measured)
    log_every: int = num(5, 1)   # steps between logged rows (metrics.jsonl, W&B)
    seed: int = num(0, 0)   # weights and data order (batch i = f(seed, i))
    compile: bool = False          # torch.compile the model
    device: str = "auto"           # auto | cpu | cuda
    resume: Optional[str] = None   # a checkpoint file or run directory to continue
    checkpoint_every: int = num(0, 0)      # 0: only when stopped by a signal (and at the last step when > 0)
    max_nonfinite_steps: int = num(10, 0)  # consecutive NaN/inf steps that stop the run (0: never); at log steps
    skip_memory_check: bool = False   # start even when the memory estimate says the run cannot fit

    def __post_init__(self):
        check_ranges(self, "train")
        if self.warmup_steps >= self.steps and self.resume is None:   # (a resume's steps: its checkpoint's check)
            raise ConfigError(f"train.warmup_steps={self.warmup_steps}: must be < train.steps={self.steps}")
        if self.seq_len_min is not None and self.seq_len_min > self.seq_len:
            raise ConfigError(f"train.seq_len_min={self.seq_len_min}: must be in [1, train.seq_len={self.seq_len}]")
        choice("train.device", self.device, ("auto", "cpu", "cuda"))
        if self.resume is not None and not os.path.exists(self.resume):
            raise ConfigError(f"train.resume={self.resume}: no such file or run directory")


# data.dtype: how a token file stores its ids
TOKEN_DTYPES = ("uint16", "uint32")


@dataclass
class DataConfig:
    """Where the tokens come from (`dataloader` is how they reach the device): synthetic (made in process),
    tokens (a flat binary file of token ids, memory-mapped), hf (a tokenized `datasets` folder)."""
    name: str = "synthetic"   # synthetic | tokens | hf
    path: Optional[str] = None         # tokens: the .bin file; hf: the folder datasets.save_to_disk wrote
    dtype: str = "uint16"              # tokens: uint16 | uint32 (an llm.c header, when present, says which)
    column: str = "input_ids"          # hf: the column of token ids

    def __post_init__(self):
        choice("data.dtype", self.dtype, TOKEN_DTYPES)
        if self.name != "synthetic":
            if not self.path:
                raise ConfigError(f"data.path: data={self.name} reads a file; give data.path=PATH")
            if not os.path.exists(self.path):
                raise ConfigError(f"data.path={self.path}: no such file or directory")


@dataclass
class PrecisionConfig:
    """Numeric format of the forward/backward. fp16 adds a dynamic GradScaler."""
    name: str = "fp32"   # fp32 | bf16 | fp16 | fp8
    init_scale: float = num(65536.0, 0, low_open=True)    # GradScaler (fp16 only)
    growth_interval: int = num(2000, 1)   # GradScaler: steps without overflow before the scale grows
    growth_factor: float = num(2.0, 1, low_open=True)   # GradScaler: how much the scale grows
    # GradScaler: how much it shrinks on an overflow
    backoff_factor: float = num(0.5, 0, 1, low_open=True, high_open=True)
    fp8_recipe: str = "tensorwise"  # torchao Float8LinearConfig recipe (E4M3 forward, E5M2 gradients)

    def __post_init__(self):
        check_ranges(self, "precision")


@dataclass
class AllocatorConfig:
    """CUDA caching-allocator settings, written to PYTORCH_ALLOC_CONF before CUDA starts."""
    name: str = "default"   # default | expandable
    expandable_segments: bool = False   # PYTORCH_ALLOC_CONF expandable_segments:True (week-4 C5)
    # torch's own limits (c10/core/AllocatorConfig.cpp): max_split_size_mb > 20 (kLargeBuffer, 20 MiB),
    # 0 < garbage_collection_threshold < 1
    max_split_size_mb: Optional[int] = num(None, 20, low_open=True, null="no limit")
    # free cached blocks above this share of memory
    garbage_collection_threshold: Optional[float] = num(None, 0, 1, low_open=True, high_open=True, null="off")
    extra: str = ""                      # appended verbatim, e.g. "roundup_power2_divisions:4"

    def __post_init__(self):
        check_ranges(self, "allocator")


@dataclass
class DataloaderConfig:
    """How batches reach the device."""
    name: str = "naive"   # naive | pinned
    num_workers: int = num(0, 0)   # loader processes (0: in the training process)
    pin_memory: bool = False   # page-locked host batches (CUDA)
    non_blocking: bool = False   # asynchronous host-to-device copies
    prefetch_factor: Optional[int] = num(None, 1, null="torch's default")   # batches each worker keeps ready
    persistent_workers: bool = False   # workers outlive an epoch
    cuda_prefetch: bool = False          # copy batch k+1 on a side stream while step k computes
    read_latency_ms: float = num(0.0, 0)         # simulated storage latency per batch

    def __post_init__(self):
        check_ranges(self, "dataloader")
        if self.num_workers == 0 and (self.prefetch_factor is not None or self.persistent_workers):
            raise ConfigError("dataloader.prefetch_factor/persistent_workers need dataloader.num_workers >= 1")


@dataclass
class NcclConfig:
    """NCCL/CUDA environment, applied before any process group exists. Empty values set nothing."""
    name: str = "default"   # default | tuned
    env: Dict[str, str] = field(default_factory=dict)   # variables set before any process group (NCCL_*, CUDA_*)
    # 0-3 as TORCH_NCCL_ASYNC_ERROR_HANDLING reads it (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp)
    async_error_handling: Optional[int] = num(None, 0, 3, null="torch's default")   # under the name torch reads

    def __post_init__(self):
        check_ranges(self, "nccl")


@dataclass
class LoggerConfig:
    """Where figures go besides metrics.jsonl/summary.json."""
    name: str = "wandb"   # wandb | none
    project: str = "ablate"   # W&B project
    entity: Optional[str] = None   # W&B entity (team or user); null: the default
    mode: str = "auto"                   # auto: online with credentials, else offline
    group: Optional[str] = None          # W&B group (a sweep's name)
    job_type: Optional[str] = None       # W&B job_type (a week-4 claim)
    tags: List[str] = field(default_factory=list)   # W&B tags
    init_timeout_s: float = num(15.0, 0, low_open=True)   # online W&B that does not answer by then: log offline

    def __post_init__(self):
        check_ranges(self, "logger")
        choice("logger.mode", self.mode, ("auto", "online", "offline", "disabled"))


@dataclass
class LauncherConfig:
    """Where the ranks run: local processes, or a Slurm job through submitit."""
    name: str = "local"   # local | slurm
    nproc_per_node: int = num(1, 1)   # ranks on each node
    nodes: int = num(1, 1)   # nodes (Slurm)
    gpus_per_node: int = num(0, 0)   # GPUs asked per node (Slurm)
    cpus_per_task: int = num(1, 1)   # CPUs per rank (Slurm)
    mem_gb: Optional[int] = num(None, 1, null="the partition's default")   # memory per node (Slurm)
    timeout_min: int = num(60, 1)   # the job's time limit (Slurm)
    signal_delay_s: int = num(90, 0)   # seconds before the limit that Slurm warns (checkpoint and requeue)
    partition: Optional[str] = None   # Slurm partition
    account: Optional[str] = None   # Slurm account
    qos: Optional[str] = None   # Slurm QOS
    constraint: Optional[str] = None   # Slurm node features
    additional_parameters: Dict[str, Any] = field(default_factory=dict)   # more sbatch options, as submitit takes them
    setup: List[str] = field(default_factory=list)   # shell lines run before the ranks (module load, source venv)
    wait: bool = True   # wait for the job and print its summary
    dry_run: bool = False   # write the sbatch script, submit nothing
    max_restarts: int = num(3, 0)                # requeues after preemption/time limit
    folder: Optional[str] = None         # submitit folder; default: <run dir>/slurm
    check_cluster: bool = True           # refuse what the partition can never run before submitting (cluster.py)
    cancel_unrunnable: bool = True       # wait: cancel a job whose pending reason cannot clear by itself
    array_parallelism: Optional[int] = num(None, 1, null="no limit")   # -m sweeps: tasks of its array at once
    hardware: Optional[str] = None   # the GPU the job gets (conf/hardware name or a file): its planned peak must fit
    allow_unfit: bool = False        # submit a job whose planned peak exceeds launcher.hardware's memory
    python: Optional[str] = None     # the job's interpreter (a path); null: launcher.setup's, else the writer's

    def __post_init__(self):
        check_ranges(self, "launcher")

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node


@dataclass
class MetricsConfig:
    """Measurement knobs (not a group: plain fields under `metrics`)."""
    # the MFU denominator per device, given
    peak_tflops: Optional[float] = num(None, 0, low_open=True, null="the datasheet or measured peak")
    gemm_probe: bool = True              # measure this machine's matmul peak in the run's dtype
    gemm_probe_n: int = num(0, 0)                # 0: 8192 on CUDA, 1024 on CPU
    nvml_interval_s: float = num(0.2, 0, low_open=True)   # seconds between NVML utilisation samples
    # where the measured peak is cached per (host, hardware, dtype, threads, torch), so every run and sweep on
    # a host shares one MFU denominator; null: the user cache (ABLATE_CACHE_DIR or ~/.cache/ablate/peak_flops.json)
    peak_cache: Optional[str] = None
    measure_peak: bool = False           # probe again now and replace the cached peak (metrics/peak.py)
    # predict the step before the first one (summary.json's `predicted`; docs/prediction.md): on a CPU each rank's
    # step with free collectives, ~1 s, and the cached probe of gloo's collectives; on a GPU, its hardware file's
    predict: bool = True
    # the figure a -m job returns to Hydra's sweeper (hydra-optuna-sweeper optimises it): any summary.json key
    objective: str = "tokens_per_s"
    # [start, count]: trace training steps start..start+count-1 with torch.profiler (traces/rank{N}.json.gz)
    # and measure exposed communication and data wait from the trace; null: off
    profile_steps: Optional[List[int]] = None
    # a rank whose work before its first collective (compute + data) is over this factor of the other ranks'
    # median is named in summary.json's `straggler` (metrics/steady.py)
    straggler_factor: float = num(1.2, 1, low_open=True)
    # figures of your own: [{_target_: mypkg.MyCollector, ...}], each called after every step and at the end
    # (metrics/collectors.py, docs/collectors.md)
    collectors: List[Any] = field(default_factory=list)

    def __post_init__(self):
        check_ranges(self, "metrics")


@dataclass
class AblateConfig:
    # Any: the built-in Llama and model=hf are typed by their files' schema (MODEL_SCHEMAS); a user's own model
    # file is a free-form node made a UserModelConfig here
    model: Any = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # Any: adamw and sgd are typed by their files' schema (`base_optim`); a user's own optimizer file is a free-form
    # node made a UserOptimConfig here
    optim: Any = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    dataloader: DataloaderConfig = field(default_factory=DataloaderConfig)
    nccl: NcclConfig = field(default_factory=NcclConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    # a sweeps/ file's claim metadata, if any; `repeat` is there for every run, so a -m grid repeats with
    # sweep.repeat=0,1 (the report pairs the repeats)
    sweep: Dict[str, Any] = field(default_factory=lambda: {"repeat": 0})

    def __post_init__(self):
        if isinstance(self.model, dict):
            self.model = model_from_node(self.model)
        if isinstance(self.optim, dict):
            self.optim = optim_from_node(self.optim)
        check_sweep(self.sweep)   # a sweeps/ file's node: refused before any of its runs trains
        t, world = self.train, self.launcher.world_size
        if t.global_batch_size is not None:   # over the data-parallel ranks: a tp group and a pipeline share a batch
            dp = max(1, world // (self.parallel.tp * self.parallel.pp))
            per_step = dp * t.grad_accum
            if t.global_batch_size % per_step or t.global_batch_size < per_step:
                raise ConfigError(f"train.global_batch_size={t.global_batch_size}: does not split over "
                                  f"{dp} data-parallel ranks x train.grad_accum={t.grad_accum}; use a multiple of "
                                  f"{per_step}")
            t.batch_size = t.global_batch_size // per_step
        spec = self.metrics.profile_steps
        if spec is not None and (len(spec) != 2 or spec[0] < 1 or spec[1] < 1 or sum(spec) - 1 > self.train.steps):
            raise ConfigError(f"metrics.profile_steps={list(spec)}: give [start, count] with start >= 1, count >= 1 "
                              f"and start + count - 1 <= train.steps={self.train.steps}")
        if self.model.max_seq_len is not None and self.train.seq_len > self.model.max_seq_len:
            raise ConfigError(f"train.seq_len={self.train.seq_len}: must be <= model.max_seq_len="
                              f"{self.model.max_seq_len}")
