"""config/ (conf/config.yaml and every group's schema): what a run is asked to be, checked before it starts.

errors.py (the one-line user error and its exit) <- fields.py (ranges, choices) <- models.py, optims.py,
parallels.py (the largest groups' schemas) <- groups.py (one dataclass per conf group) <- store.py (registered
with Hydra's ConfigStore; Hydra's composition made typed).
compose.py, one level up, composes a command line once and checks the choices against the registries.
"""
from ablate.config.errors import EXIT_USAGE, AblateError, ConfigError, RunFailed, RunStopped, exit_code_of
from ablate.config.groups import (
    AblateConfig,
    AllocatorConfig,
    DataConfig,
    DataloaderConfig,
    LauncherConfig,
    LoggerConfig,
    MetricsConfig,
    ModelConfig,
    NcclConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
)
from ablate.config.models import MODEL_SCHEMAS, HFModelConfig, UserModelConfig
from ablate.config.optims import OPTIM_SCHEMAS, OptimConfig, UserOptimConfig

SCHEMA_FILES = {**MODEL_SCHEMAS, **OPTIM_SCHEMAS}   # what conf/ files start from: in a group's listing, not choices

__all__ = ["EXIT_USAGE", "AblateError", "ConfigError", "RunFailed", "RunStopped", "exit_code_of", "AblateConfig",
           "AllocatorConfig", "DataConfig", "DataloaderConfig", "HFModelConfig", "LauncherConfig", "LoggerConfig",
           "MODEL_SCHEMAS", "MetricsConfig", "ModelConfig", "NcclConfig", "OPTIM_SCHEMAS", "OptimConfig",
           "ParallelConfig", "PrecisionConfig", "SCHEMA_FILES", "TrainConfig", "UserModelConfig", "UserOptimConfig"]
