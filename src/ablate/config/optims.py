"""conf/optim's schemas: the built-in optimizers (`base_optim`: adamw, sgd) and a user's own optimizer file
(`DIR/optim/NAME.yaml`: `_target_` + that optimizer's own arguments), which has no schema of ours and inherits
nothing from the default: its node is made a UserOptimConfig."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from ablate.config.errors import ConfigError
from ablate.config.fields import check_ranges, choice, num

# optim.schedule: the learning rate as a function of the step (optim.py)
SCHEDULES = ("constant", "warmup_cosine", "warmup_linear")


@dataclass
class OptimConfig:
    """The optimizer and its learning-rate schedule. `name` picks adamw or sgd, or a `_target_` given on the command
    line (an optimizer class called with the parameter groups, `lr` and `args`)."""
    name: str = "adamw"   # adamw | sgd
    _target_: Optional[str] = None   # an optimizer class given on the command line, instead of name
    lr: float = num(3e-3, 0, low_open=True)   # peak learning rate (the schedule's)
    weight_decay: float = num(0.1, 0)                 # matrices only; norms, biases and embeddings' 1-D: 0
    beta1: float = num(0.9, 0, 1, high_open=True)     # AdamW betas (Llama / nanoGPT values)
    beta2: float = num(0.95, 0, 1, high_open=True)   # AdamW second-moment decay
    momentum: float = num(0.9, 0, 1, high_open=True)  # sgd
    schedule: str = "constant"   # constant | warmup_cosine | warmup_linear
    warmup_steps: int = num(0, 0)                     # linear warm-up from lr / warmup_steps to lr
    min_lr_ratio: float = num(0.1, 0, 1)              # the decay's floor, as a share of lr
    # the step the decay reaches its floor (held after it); null: train.steps. A resume that changes train.steps
    # keeps the checkpoint's schedule only with this set to the checkpoint's horizon (train/resumable.py)
    decay_steps: Optional[int] = num(None, 1, null="train.steps")
    args: Dict[str, Any] = field(default_factory=dict)   # more keyword arguments for a `_target_` optimizer

    def __post_init__(self):
        check_ranges(self, "optim")
        choice("optim.schedule", self.schedule, SCHEDULES)


# keys of a user's optimizer file that are ablate's (its learning-rate schedule); every other key, `lr` included,
# is an argument of `_target_` (ablate reads `lr` too: the schedule scales it)
USER_OPTIM_KEYS = ("name", "_target_", "schedule", "warmup_steps", "min_lr_ratio", "decay_steps")


@dataclass
class UserOptimConfig:
    """A user's optimizer file: `_target_` (a torch.optim.Optimizer class, or a function returning one) called with
    the parameter groups and the file's other keys, as written. `weight_decay`, when given, decays matrices only
    (norms, biases: 0), as for adamw and sgd; when not, the optimizer's own default holds."""
    target: str
    lr: float   # the optimizer's lr, scaled by ablate's schedule
    name: str = "custom"   # recorded label (the choice, e.g. optim=rms)
    args: Dict[str, Any] = field(default_factory=dict)   # every argument but lr
    schedule: str = "constant"   # constant | warmup_cosine | warmup_linear
    warmup_steps: int = num(0, 0)   # linear warm-up from lr / warmup_steps to lr
    min_lr_ratio: float = num(0.1, 0, 1)   # the decay's floor, as a share of lr
    decay_steps: Optional[int] = num(None, 1, null="train.steps")   # the step the decay reaches its floor

    def __post_init__(self):
        check_ranges(self, "optim")
        choice("optim.schedule", self.schedule, SCHEDULES)
        if not isinstance(self.lr, (int, float)) or self.lr <= 0:
            raise ConfigError(f"optim.lr={self.lr}: out of range; allowed: > 0")

    @classmethod
    def from_node(cls, node: Dict[str, Any]) -> "UserOptimConfig":
        if node.get("lr") is None:
            raise ConfigError(f"optim.lr: {node['_target_']} needs a learning rate in its file (ablate's schedule "
                              "scales it); give `lr:`")
        args = {k: v for k, v in node.items() if k not in USER_OPTIM_KEYS and k != "lr"}
        kept = {k: node[k] for k in ("schedule", "warmup_steps", "min_lr_ratio", "decay_steps")
                if node.get(k) is not None}
        return cls(target=str(node["_target_"]), lr=float(node["lr"]), name=node.get("name") or "custom", args=args,
                   **kept)

    @property
    def weight_decay(self) -> Optional[float]:
        return self.args.get("weight_decay")


OPTIM_SCHEMAS = {"base_optim": OptimConfig}   # conf/optim files start from it


def optim_from_node(node: Dict[str, Any]):
    """An optimizer file without a schema of ours: a user's own (`_target_` + its arguments)."""
    if not node.get("_target_"):
        raise ConfigError("optim: a file of your own names its optimizer with `_target_:` (e.g. torch.optim.RMSprop) "
                          "and gives its arguments; or start it from `defaults: [base_optim]`")
    return UserOptimConfig.from_node(node)
