"""Hydra's and OmegaConf's errors about a user's command line or YAML, said as one line that names the key and
what it may be (compose.py raises them; anything else raised while composing is a bug and keeps its traceback)."""
from __future__ import annotations

import re
from dataclasses import is_dataclass

import yaml
from hydra.errors import HydraException, MissingConfigException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from ablate.config import SCHEMA_FILES, ConfigError
from ablate.config.fields import no_such_key, wrong_kind

# what Hydra and OmegaConf raise for a user's command line or YAML: said in one line. Anything else raised
# while composing is a bug and keeps its traceback.
USER_ERRORS = (HydraException, OmegaConfBaseException, yaml.YAMLError)


def yaml_line(e: yaml.YAMLError) -> ConfigError:
    """A YAML file that does not parse: the file, line and column, and the problem."""
    mark = getattr(e, "problem_mark", None)
    where = f"{mark.name} line {mark.line + 1}, column {mark.column + 1}" if mark else "a YAML file"
    return ConfigError(f"{where}: not valid YAML ({getattr(e, 'problem', None) or str(e).splitlines()[0]})")


def one_line(e: BaseException) -> ConfigError:
    """Hydra's own error as one line; a missing choice names the group and Hydra's valid choices; a config
    file's error names the file, the key and the problem."""
    if isinstance(e, MissingConfigException) and e.options and e.missing_cfg_file:
        group, _, choice = str(e.missing_cfg_file).rpartition("/")
        options = [o for o in e.options if o not in SCHEMA_FILES]   # schemas, not choices
        return ConfigError(f"{group}={choice}: no such choice for '{group}'; valid choices: {', '.join(options)}")
    cause = e.__cause__ or e.__context__
    if isinstance(e, yaml.YAMLError) or isinstance(cause, yaml.YAMLError):
        return yaml_line(e if isinstance(e, yaml.YAMLError) else cause)
    in_file = re.match(r"In '([^']+)'", str(e))
    if in_file and getattr(cause, "full_key", None):
        return ConfigError(f"{in_file.group(1)}.yaml: {cause.full_key}: {str(cause).strip().splitlines()[0]}")
    if isinstance(cause, ValidationError):   # a command line's value of the wrong kind: the key, its kind, its range
        said = wrong_kind(cause.object_type, cause.key, cause.full_key, cause.value)
        if said:
            return said
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        if is_dataclass(cause.object_type):   # a key typed wrong: the keys there are
            return no_such_key(cause.full_key, cause.object_type)
        append = re.search(r"use (\+\S+)", str(e))   # a free-form node (nccl.env): Hydra's own hint, kept
        if append:
            return ConfigError(f"{cause.full_key}: not in the config yet; to add it: {append.group(1)}")
    lines = [str(x).strip().splitlines()[0] for x in (e, cause) if x is not None and str(x).strip()]
    return ConfigError(": ".join(dict.fromkeys(lines)) or type(e).__name__)
