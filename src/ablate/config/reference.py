"""docs/config.md, made from the structured configs themselves: every key of `python -m ablate --cfg job` with its
type, default and meaning (the comment beside the field in config/, or on the lines above it). Regenerate with
`python -m ablate.config.reference > docs/config.md`; tests/test_config.py fails when a key has no line or the file
is out of date."""
from __future__ import annotations

import dataclasses
import inspect
import io
import re
import tokenize
import typing
from typing import Dict, Iterator, List, Tuple

from ablate.config.groups import AblateConfig
from ablate.config.models import HFModelConfig, ModelConfig, UserModelConfig
from ablate.config.optims import OptimConfig, UserOptimConfig

HEADER = """# Configuration keys

Every key of `python -m ablate --cfg job` (the default: `model=tiny`, `optim=adamw`), by group, with its type, its
default and what it means; then the keys of the other model and optimizer files. Made from the structured configs
(`src/ablate/config/`) by `python -m ablate.config.reference > docs/config.md`; a test fails when a key is missing.
Each group's choices are files in `conf/<group>/` (and in a `--config-dir`); any key is an override:
`python -m ablate train.steps=100 parallel=fsdp2 parallel.tp=2`.
"""
# groups whose schema comes from the chosen file (the default's, then the others')
EXTRA = [("model (model=hf)", HFModelConfig), ("model (your own file: `_target_` + its arguments)", UserModelConfig),
         ("optim (your own file: `_target_` + its arguments)", UserOptimConfig)]


def comments(cls) -> Dict[str, str]:
    """{field: its comment}: the comment on the field's line, else the comment lines right above it."""
    source = inspect.getsource(cls)
    out: Dict[str, str] = {}
    above: List[str] = []
    by_line: Dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            by_line[tok.start[0]] = tok.string.lstrip("# ").strip()
    for number, line in enumerate(source.splitlines(), 1):
        match = re.match(r"\s+(\w+): [^=]+(=|$)", line)
        if line.strip().startswith("#"):
            above.append(by_line.get(number, ""))
            continue
        if match and not line.strip().startswith(("def ", "return", "@")):
            out[match.group(1)] = by_line.get(number) or " ".join(above)
        above = []
    return out


def type_name(field: dataclasses.Field) -> str:
    name = str(field.type).replace("typing.", "")
    optional = re.fullmatch(r"Optional\[(.*)\]", name)
    return f"{optional.group(1)} or null" if optional else name


def default_of(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return repr(field.default) if field.default is not None else "null"
    if field.default_factory is not dataclasses.MISSING:
        return repr(field.default_factory())
    return "(required)"


def rows(cls, prefix: str) -> Iterator[Tuple[str, str, str, str]]:
    notes = comments(cls)
    for field in dataclasses.fields(cls):
        if field.name == "target":   # a user's `_target_`
            yield f"{prefix}._target_", "str", "(required)", "the class or function that builds it (an import path)"
            continue
        yield f"{prefix}.{field.name}", type_name(field), default_of(field), notes.get(field.name, "")


def groups() -> List[Tuple[str, type]]:
    hints = typing.get_type_hints(AblateConfig)
    out = []
    for field in dataclasses.fields(AblateConfig):
        schema = {"model": ModelConfig, "optim": OptimConfig}.get(field.name, hints[field.name])
        out.append((field.name, schema if dataclasses.is_dataclass(schema) else None))
    return out


def table(title: str, cls, prefix: str) -> List[str]:
    doc = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
    lines = [f"## {title}", "", doc, "", "| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {t} | `{d}` | {m.replace('|', '/')} |" for k, t, d, m in rows(cls, prefix)]
    return lines + [""]


def render() -> str:
    lines = [HEADER]
    for name, schema in groups():
        if schema is None:   # the sweep node: a sweeps/ file's data (config/sweep.py)
            lines += [f"## {name}", "", "A sweeps/ file's claim and checks (`sweeps/README.md`); on every run:", "",
                      "| key | type | default | meaning |", "|---|---|---|---|",
                      "| `sweep.repeat` | int | `0` | which repeat of its sweep this run is (the report pairs the "
                      "repeats) |", ""]
            continue
        lines += table(name, schema, name)
    for title, cls in EXTRA:
        lines += table(title, cls, title.split()[0])
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
