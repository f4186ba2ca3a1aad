"""From Hydra's composition to the typed config: the schema registered with Hydra's ConfigStore, keys the
schema does not declare refused in one line, every value checked (`typed`), and the resolver that names
a multirun job's folder (`hydra.sweep.subdir`)."""
from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf, open_dict

from ablate.config.fields import no_such_key
from ablate.config.groups import AblateConfig
from ablate.config.models import MODEL_SCHEMAS
from ablate.config.optims import OPTIM_SCHEMAS


def register() -> None:
    """Register the schema: conf/config.yaml's defaults list starts from `ablate_schema`, so every group
    file is merged into its typed dataclass (an unknown key or a wrong type fails composition). The model
    node alone starts untyped: a model file brings its schema (`defaults: [base_llama]`, `base_hf`), and a
    user's own (`_target_` + arguments) has none."""
    store = ConfigStore.instance()
    schema = OmegaConf.structured(AblateConfig)
    schema.model = {}
    schema.optim = {}
    store.store(name="ablate_schema", node=schema)
    for group, schemas in (("model", MODEL_SCHEMAS), ("optim", OPTIM_SCHEMAS)):
        for name, node in schemas.items():
            store.store(group=group, name=name, node=node)
    OmegaConf.register_new_resolver("ablate_dirname", short_dirname, replace=True)


def short_dirname(overrides: str, limit: int = 150) -> str:
    """A multirun job's folder name from its overrides (Hydra's override_dirname), cut with a hash of the
    whole when it is long: a folder name has at most 255 bytes, and a dozen overrides pass that. Where the
    job runs and what it measures (launcher.*, metrics.*, logger.*) go first, the knobs under study stay."""
    if len(overrides) <= limit:
        return overrides
    import hashlib

    kept = ",".join(o for o in overrides.split(",") if not o.startswith(("launcher.", "metrics.", "logger.")))
    return f"{kept[:limit - 9]}_{hashlib.sha1(overrides.encode()).hexdigest()[:8]}"


FREE_FORM = {"sweep", "nccl.env", "launcher.additional_parameters", "optim.args"}   # nodes meant for any keys


def is_users_model(node) -> bool:
    """A model or optim node no schema of ours types: a user's own file (`_target_` + its arguments)."""
    return isinstance(node, DictConfig) and OmegaConf.get_type(node) is dict


def unknown_keys(node, schema, prefix: str = "") -> List[Tuple[str, type]]:
    """(key, its node's schema) for each key in `node` that the dataclass `schema` does not declare (e.g. a
    `+train.lrr=1` typo). A typed sub-node is checked against its own schema (the model file's)."""
    declared = {f.name for f in fields(schema)}
    out = []
    for key in node.keys():
        path = f"{prefix}{key}"
        if path in FREE_FORM or (path in ("model", "optim") and is_users_model(node[key])):
            continue
        if str(key) not in declared:
            out.append((path, schema))
            continue
        sub = node._get_node(key)
        if isinstance(sub, DictConfig) and is_dataclass(OmegaConf.get_type(sub)):
            out += unknown_keys(sub, OmegaConf.get_type(sub), f"{path}.")
    return out


# groups whose `name` is only a label, so it is the choice's own (a `--config-dir` model file without `name:`
# is recorded under its choice, not the schema's default); the other groups' `name` picks an implementation
LABELLED_BY_CHOICE = ("model", "allocator", "dataloader", "nccl")


def group_choices(runtime_choices) -> Dict[str, str]:
    """Hydra's `hydra.runtime.choices` less Hydra's own groups and the unset ones: what each group was set to."""
    return {k: v for k, v in runtime_choices.items() if not k.startswith("hydra") and v is not None}


def typed(cfg: DictConfig, choices: Optional[Mapping[str, str]] = None) -> AblateConfig:
    """Typed, value-checked config object (runs every `__post_init__`); keys the schema does not know
    (added with `+`) are refused in one line; compose.validate adds the registries' choices. `choices`:
    Hydra's group choices (read from the config's `hydra` node when it has one)."""
    plain = cfg
    if "hydra" in cfg:   # a copy without it, still typed (masked_copy would drop the schema: a plain dict)
        choices = choices or dict(cfg.hydra.runtime.get("choices") or {})
        plain = cfg.copy()
        with open_dict(plain):
            plain.pop("hydra")
    for group in LABELLED_BY_CHOICE + (("optim",) if is_users_model(plain.get("optim")) else ()):
        if (choices or {}).get(group):
            with open_dict(plain[group]):
                plain[group].name = choices[group]
    extra = unknown_keys(plain, AblateConfig)
    if extra:
        raise no_such_key(*extra[0])
    return OmegaConf.to_object(plain)
