"""conf/model's schemas: the built-in Llama (`base_llama`), a transformers config (`base_hf`), and a user's own
model file (`_target_` + its arguments), which has no schema of ours: its node is made a UserModelConfig."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from ablate.config.errors import ConfigError
from ablate.config.fields import check_ranges, choice, num
from ablate.config.moe import MoEConfig
from ablate.config.tp_plan import Split, decode_plan

EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
CHECKPOINTING = ("false", "true", "an integer k >= 2 (every k-th block)", "selective")


def checkpointing_mode(value: Any):
    """model.activation_checkpointing decoded once: False, True (every block), k >= 2 (every k-th block) or
    "selective" (per op); none/full spelled out are taken too. One line for anything else."""
    if isinstance(value, str):
        value = {"none": False, "false": False, "full": True, "true": True}.get(value.strip().lower(), value)
        value = int(value) if isinstance(value, str) and value.isdigit() else value
    if isinstance(value, bool) or value == "selective":
        return value
    if isinstance(value, int) and value >= 1:
        return True if value == 1 else value
    raise ConfigError(f"model.activation_checkpointing={value}: not a valid choice; valid choices: "
                      f"{', '.join(CHECKPOINTING)}")


@dataclass
class ModelConfig:
    """The built-in Llama-style decoder (`model=tiny|small|1b|8b|70b|405b`, each file starting from `base_llama`).
    Sizes follow Meta's published Llama 3 configs (see conf/model/*.yaml)."""
    name: str = "tiny"   # the size's label (recorded; the file sets it)
    dim: int = num(64, 1)                  # hidden size
    n_layers: int = num(2, 1)   # transformer blocks
    n_heads: int = num(4, 1)   # attention (query) heads
    n_kv_heads: int = num(2, 1)            # < n_heads: grouped-query attention
    vocab_size: int = num(256, 1)   # vocabulary (embedding rows, logits)
    ffn_hidden: int = num(192, 1)          # SwiGLU inner size
    max_seq_len: int = num(256, 1)         # RoPE table length
    norm_eps: float = num(1e-5, 0, low_open=True)   # RMSNorm epsilon
    rope_theta: float = num(10000.0, 0, low_open=True)   # RoPE base frequency
    tie_embeddings: bool = False   # the LM head shares the embedding matrix
    # recompute in backward: false | true (every block: the 8N accounting) | k >= 2 (every k-th block) | selective
    # (per op: the matmuls' and attention's outputs kept but every second matmul's): model/checkpointing.py
    activation_checkpointing: Any = False
    attention: str = "sdpa"        # sdpa: fused kernel; math: explicit matmuls (countable by FlopCounterMode)
    moe: Optional[MoEConfig] = None   # a mixture of experts in every block's feed-forward (config/moe.py); null: dense

    def __post_init__(self):
        check_ranges(self, "model")
        choice("model.attention", self.attention, ("sdpa", "math"))
        self.activation_checkpointing = checkpointing_mode(self.activation_checkpointing)
        if self.moe is not None and self.activation_checkpointing == "selective":
            # its per-op policy would drop every second expert matmul, whose FLOPs depend on the routing
            raise ConfigError("model.activation_checkpointing=selective with model.moe: not for a mixture of experts "
                              "here; valid choices: false, true, an integer k >= 2 (every k-th block)")
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model.dim={self.dim}, model.n_heads={self.n_heads}, model.n_kv_heads="
                              f"{self.n_kv_heads}: dim must divide by n_heads and n_heads by n_kv_heads")


@dataclass
class HFModelConfig:
    """`model=hf model.config=PATH/config.json`: a transformers causal LM built from its config, randomly
    initialised (nothing downloaded)."""
    name: str = "hf"   # recorded label
    config: Optional[str] = None           # a transformers config.json (or the folder holding one)
    blocks: Optional[str] = None           # attribute path of the repeated blocks; null: found by rule
    activation_checkpointing: Any = False   # false | true | k >= 2 | selective, as for the built-in Llama

    def __post_init__(self):
        self.activation_checkpointing = checkpointing_mode(self.activation_checkpointing)
        if not self.config:
            raise ConfigError("model.config: give the path of a transformers config.json (model=hf "
                              "model.config=PATH/config.json)")
        if not os.path.exists(self.config):
            raise ConfigError(f"model.config={self.config}: no such file")

    @property
    def max_seq_len(self) -> Optional[int]:
        return None

    @property
    def experts(self) -> Optional[int]:
        """Routed experts per mixture, as transformers configs name them (Mixtral's num_local_experts, Qwen-MoE's
        num_experts, DeepSeek's n_routed_experts); None for a dense model."""
        path = os.path.join(self.config, "config.json") if os.path.isdir(self.config) else self.config
        try:
            with open(path) as f:
                node = json.load(f)
        except (OSError, ValueError):
            return None
        return next((node[k] for k in EXPERT_KEYS if isinstance(node.get(k), int)), None)


# keys of a user's model node that are ablate's alone; every other key is an argument of `_target_` (max_seq_len
# and vocab_size too: ablate reads them as well, and a constructor taking one of these is refused: model/__init__.py)
USER_MODEL_KEYS = ("name", "_target_", "blocks", "activation_checkpointing", "tp_plan")


@dataclass
class UserModelConfig:
    """A model file of the user's own (`--config-dir DIR`, `DIR/model/NAME.yaml`): `_target_` names a class or
    function that returns an nn.Module, every other key but ablate's own (USER_MODEL_KEYS) is its argument.
    `max_seq_len` and `vocab_size`, when given, are arguments that ablate reads too (the longest train.seq_len;
    the vocabulary of a module without a `vocab_size` attribute)."""
    target: str
    name: str = "custom"   # recorded label (the choice, e.g. model=mine)
    args: Dict[str, Any] = field(default_factory=dict)   # every other key of the file: the constructor's arguments
    blocks: Optional[str] = None   # attribute path of the repeated blocks; null: found by rule
    activation_checkpointing: Any = False   # false | true | k >= 2 | selective, as for the built-in Llama
    max_seq_len: Optional[int] = None   # an argument ablate reads too: the longest train.seq_len
    # parallel.tp > 1: {module path pattern: colwise | rowwise | sequence_parallel, or a mapping with style, input,
    # output, fused} (config/tp_plan.py, docs/layouts.md); without one, tensor parallelism is refused for this model
    tp_plan: Optional[Dict[str, Any]] = None

    def __post_init__(self):
        self.splits: Optional[Dict[str, Split]] = decode_plan(self.tp_plan)   # decoded once, checked here
        self.activation_checkpointing = checkpointing_mode(self.activation_checkpointing)

    @property
    def experts(self) -> Optional[int]:
        """Routed experts per mixture: the constructor's argument of a name transformers gives it (EXPERT_KEYS),
        which ablate reads too, as it reads max_seq_len; None when there is none (a dense model, or one that does
        not say: parallel.ep > 1 is refused before launch)."""
        return next((self.args[k] for k in EXPERT_KEYS if isinstance(self.args.get(k), int)), None)

    @classmethod
    def from_node(cls, node: Dict[str, Any]) -> "UserModelConfig":
        return cls(target=str(node["_target_"]), name=node.get("name") or "custom",
                   args={k: v for k, v in node.items() if k not in USER_MODEL_KEYS},
                   blocks=node.get("blocks"), activation_checkpointing=node.get("activation_checkpointing") or False,
                   max_seq_len=node.get("max_seq_len"),
                   tp_plan=_plain(node["tp_plan"]) if node.get("tp_plan") else None)


def _plain(node) -> Dict[str, Any]:
    """An OmegaConf mapping (a composed node) as plain dicts, for the record and the decoder."""
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(node) if isinstance(node, DictConfig) else dict(node)


MODEL_SCHEMAS = {"base_llama": ModelConfig, "base_hf": HFModelConfig}   # conf/model files start from these


def model_from_node(node: Dict[str, Any]):
    """A model file without a schema of ours: a user's own model (`_target_` + arguments), or, without
    `_target_`, the built-in Llama at the sizes it gives (each key checked as `base_llama` would)."""
    if node.get("_target_"):
        return UserModelConfig.from_node(node)
    from omegaconf import OmegaConf

    unknown = sorted(set(node) - {f for f in ModelConfig.__dataclass_fields__})
    if unknown:
        raise ConfigError(f"model.{unknown[0]}: no such key of the built-in Llama (model={node.get('name')}); give "
                          "`_target_:` for a model of your own, or use the Llama's keys: "
                          f"{', '.join(ModelConfig.__dataclass_fields__)}")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), node))
