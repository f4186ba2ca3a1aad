"""Every config combination composes and validates; bad values are refused with the key named."""
import itertools

import pytest

from ablate.compose import config_of, validate
from ablate.config import AblateConfig, ConfigError
from conftest import compose_cfg, group_choices

FIVE = ("precision", "parallel", "allocator", "dataloader", "nccl")


def all_pairs(choices):
    """Rows that hold every pair of choices of any two of the groups at least once (a greedy covering array):
    the whole product of the first two groups (precision x parallel, the pair the registries check together),
    each other group's choice picked per row to cover the most pairs not yet covered, then a row for any
    pair still missing. ~28 compositions instead of the 224 of the full product (each costs Hydra ~0.2 s
    here); the test checks the covering itself, so a group that grows cannot slip out of it."""
    first, second, *rest = choices
    covered = set()

    def pairs(row):
        return {(i, a, j, b) for (i, a), (j, b) in itertools.combinations(enumerate(row), 2)}

    rows = []
    for a, b in itertools.product(first, second):
        row = [a, b]
        for options in rest:
            row.append(max(options, key=lambda o: len(pairs(row + [o]) - covered)))
        rows.append(tuple(row))
        covered |= pairs(row)
    for i, j in itertools.combinations(range(len(choices)), 2):
        for a, b in itertools.product(choices[i], choices[j]):
            if (i, a, j, b) not in covered:
                row = [c[0] for c in choices]
                row[i], row[j] = a, b
                rows.append(tuple(row))
                covered |= pairs(row)
    return rows


def test_every_pair_of_choices_of_the_five_groups_composes():
    choices = [group_choices(g) for g in FIVE]
    rows = all_pairs(choices)
    for i, j in itertools.combinations(range(len(FIVE)), 2):   # the covering: every pair of any two groups
        assert {(r[i], r[j]) for r in rows} == set(itertools.product(choices[i], choices[j])), (FIVE[i], FIVE[j])
    assert len(rows) >= 28
    for combo in rows:
        cfg = validate(compose_cfg([f"{g}={c}" for g, c in zip(FIVE, combo)]))
        assert isinstance(cfg, AblateConfig)
        for group, choice in zip(FIVE, combo):
            assert getattr(cfg, group).name == choice          # one name per choice (ddp_sync included)


@pytest.mark.parametrize("group", ["model", "train", "logger", "launcher", "optim", "data"])
def test_other_groups_compose(group, user_files):
    # what a choice needs besides itself: several ranks a parallel strategy, model=hf its config, data a file
    needs = {"launcher": ["parallel=ddp"], "model=hf": [f"model.config={user_files.hf_config}"],
             "data=tokens": [f"data.path={user_files.tokens}"], "data=hf": [f"data.path={user_files.dataset}"]}
    for choice in group_choices(group):
        extra = needs.get(f"{group}={choice}", needs.get(group, []))
        validate(compose_cfg([f"{group}={choice}", *extra]))


def test_defaults_are_the_cpu_tiny_run():
    cfg = validate(compose_cfg())
    names = (cfg.model.name, cfg.precision.name, cfg.parallel.name, cfg.launcher.name)
    assert names == ("tiny", "fp32", "none", "local")
    assert cfg.logger.name == "wandb" and cfg.logger.mode == "auto"


@pytest.mark.parametrize("override,needle", [
    ("train.steps=-1", "train.steps=-1"),
    ("train.grad_accum=0", "train.grad_accum=0"),
    ("precision.name=fp12", "valid choices: fp32, bf16, fp16, fp8"),
    ("train.seq_len=100000", "model.max_seq_len"),
    ("model.n_heads=5", "model.n_heads=5"),
])
def test_bad_values_name_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        validate(compose_cfg([override]))


def test_the_article_values_are_in_the_tuned_and_expandable_groups():
    cfg = validate(compose_cfg(["nccl=tuned", "allocator=expandable"]))
    assert cfg.nccl.env == {"NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "5", "NCCL_BUFFSIZE": "8388608",
                            "NCCL_ALGO": "RING", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    from ablate.allocator import alloc_conf

    assert alloc_conf(cfg.allocator) == "expandable_segments:True,max_split_size_mb:128"


@pytest.mark.parametrize("name", group_choices("sweeps"))
def test_every_sweep_file_composes_at_every_grid_point(name):
    from ablate.compose import preflight

    preflight([f"+sweeps={name}"])     # raises ConfigError on any bad point


def test_week4_lists_every_claim():
    from ablate.sweeps import expand

    assert expand(["week4"]) == ["c1_mfu", "c2_zero3", "c2_overlap", "c3_no_sync", "c4_bf16", "c5_expandable",
                                 "c6_pinned"]


@pytest.mark.parametrize("override,needle", [
    ("+train.lrr=1", "train.lrr: no such key in 'train'; valid keys: steps, "),
    ("+nope=1", "nope: no such key in 'the config'"),
    ("optim.lr=nan", "optim.lr=nan: out of range; allowed: a finite number > 0"),
    ("dataloader.num_workers=1", None),
])
def test_keys_the_schema_does_not_know_are_refused(override, needle):
    if needle is None:
        validate(compose_cfg([override]))
        return
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        validate(compose_cfg([override]))


@pytest.mark.parametrize("override,line", [
    ("train.steps=abc", "train.steps=abc: not an integer; allowed: >= 1"),
    ("train.global_batch_size=1.5", "train.global_batch_size=1.5: not an integer; allowed: >= 1; or null "
                                    "(batch_size per rank)"),
    ("optim.lr=fast", "optim.lr=fast: not a number; allowed: > 0"),
    ("launcher.wait=maybe", "launcher.wait=maybe: not a boolean; valid choices: true, false"),
    ("train.lr=0.1", "train.lr: no such key in 'train'; valid keys: steps, warmup_steps, "),
    ("trian.steps=3", "trian: no such key in 'the config'; valid keys: model, train, "),
    ("nccl.env.NCCL_DEBUG=INFO", "nccl.env.NCCL_DEBUG: not in the config yet; to add it: +nccl.env.NCCL_DEBUG=INFO"),
])
def test_a_value_of_the_wrong_kind_or_a_mistyped_key_names_what_is_valid(override, line):
    """What a command line gets wrong most (in process, ~0.1 s each): said as an out-of-range value or a `+key`
    the schema does not know is, in one line naming the key and what it may be."""
    with pytest.raises(ConfigError) as refused:
        config_of([override])
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value), str(refused.value)


def test_free_form_nodes_still_take_any_key():
    cfg = validate(compose_cfg(["+nccl.env.NCCL_DEBUG=INFO", "+launcher.additional_parameters.anything=1"]))
    assert cfg.nccl.env["NCCL_DEBUG"] == "INFO"
    with pytest.raises(ConfigError, match="sweep.anything: no such key in sweep"):   # checked: config/sweep.py
        validate(compose_cfg(["+sweep.anything=1"]))


def test_every_choice_has_one_implementation_in_its_registry():
    from ablate import launcher, logger, parallel, precision

    for group, registry in (("precision", precision.REGISTRY), ("parallel", parallel.REGISTRY),
                            ("launcher", launcher.REGISTRY), ("logger", logger.REGISTRY)):
        assert sorted(registry) == group_choices(group), group
    for name in parallel.REGISTRY:
        assert parallel.strategy_class(name).plan_bytes   # each strategy predicts its own state


def test_long_override_lists_make_folder_names_that_fit():
    from ablate.config.store import short_dirname

    assert short_dirname("parallel=ddp,train.seed=0") == "parallel=ddp,train.seed=0"
    long = ",".join([f"launcher.k{i}=1" for i in range(20)] + ["parallel=ddp", "train.seed=1"])
    cut = short_dirname(long)
    assert cut.startswith("parallel=ddp,train.seed=1_") and len(cut) <= 150
    assert cut != short_dirname(long.replace("seed=1", "seed=2"))


def numeric_fields():
    """(key, field, type) for every number in the schema, walked from AblateConfig's dataclasses."""
    import dataclasses
    import typing

    from ablate.config import AblateConfig

    out = []
    for group in dataclasses.fields(AblateConfig):
        cls = group.default_factory
        if not dataclasses.is_dataclass(cls):
            continue
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = next((t for t in (bool, int, float) if hints[f.name] in (t, typing.Optional[t])), None)
            if kind in (int, float):
                out.append((f"{group.name}.{f.name}", f, kind))
    return out


def outside(rng, kind):
    """A value just outside a declared range."""
    step = 1 if kind is int else 0.5
    if rng.low is not None:
        return rng.low if rng.low_open else rng.low - step
    return rng.high if rng.high_open else rng.high + step


def test_every_number_in_the_schema_declares_its_range():
    missing = [key for key, f, _ in numeric_fields() if "range" not in f.metadata]
    assert not missing, f"numeric fields without a range (config.num): {missing}"
    assert len(numeric_fields()) >= 50


@pytest.mark.parametrize("key,field,kind", numeric_fields(), ids=lambda v: v if isinstance(v, str) else "")
def test_an_out_of_range_number_is_refused_in_one_line(key, field, kind):
    rng = field.metadata["range"]
    bad = outside(rng, kind)
    if kind is int:
        bad = int(bad)
    with pytest.raises(ConfigError) as refused:
        validate(compose_cfg([f"{key}={bad}"]))
    message = str(refused.value)
    assert message.startswith(f"{key}=") and f"out of range; allowed: {rng}" in message, message
    assert "\n" not in message


def test_every_key_of_the_default_config_is_documented():
    """docs/config.md is what config/reference.py makes of the structured configs, and holds every leaf key of
    `python -m ablate --cfg job` with a meaning (in process, < 1 s)."""
    from omegaconf import OmegaConf

    from ablate.config import reference
    from conftest import REPO

    doc = (REPO / "docs" / "config.md").read_text()
    assert doc == reference.render(), "docs/config.md is stale: python -m ablate.config.reference > docs/config.md"

    def leaves(node, prefix=""):
        for k, v in node.items():
            if isinstance(v, dict) and v:
                yield from leaves(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    rows = {line.split("|")[1].strip(" `"): line.split("|")[4].strip() for line in doc.splitlines()
            if line.startswith("| `")}
    for key in leaves(OmegaConf.to_container(compose_cfg())):
        assert rows.get(key), f"{key}: not in docs/config.md, or without a meaning"
