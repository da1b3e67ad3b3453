"""Property-based tests of mf-config.

- `valid_configs()` generates configurations that satisfy every type and value rule (built from
  the section classes: their field types, `Literal` choices and bounds, plus the cross-field rules
  of `rules.py`), with extra keys, nested mappings included, in every open section. They load, and
  dumping `to_dict()` as YAML and loading it again gives the same `TrainConfig`.
- `mutated_configs()` breaks such configurations at random: values of other types, deleted and
  unknown keys, nulls, wrong nesting, shared (aliased) subtrees. Loading one either succeeds or
  raises `ConfigError` whose issues all say where and what, whether it comes as data
  (`TrainConfig.from_dict`) or as YAML text (`load_text`).

Bugs these properties found are pinned by regression tests at the end of this file.
"""

from __future__ import annotations

import copy
import functools
import itertools
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import attrs
import jsonschema
import pytest
import yaml
from conftest import skeleton
from hypothesis import event, given, settings
from hypothesis import strategies as st

from mf_config import ConfigError, OpenSection, TrainConfig, load_config
from mf_config.errors import format_path
from mf_config.schema import json_schema
from mf_config.sections import (
    REQUIRED_SECTIONS,
    CallbackConfig,
    CheckpointConfig,
    ContextConfig,
    DataloaderConfig,
    LrSchedulerConfig,
    ModelConfig,
    MoeMonitorConfig,
    MonitorConfig,
    OptimizerConfig,
    ParallelismConfig,
    ProfilerConfig,
    RecomputeCommConfig,
    RecomputeConfig,
    SwapConfig,
    TrainDatasetConfig,
    TrainingConfig,
    declared_fields,
)
from mf_config.validate import config_from_source
from mf_config.yaml_source import dump_text, load_text

# Valid configurations may carry fields that are ignored with a ConfigWarning (a layer list with
# another recompute mode, sequence_parallel: False with tensor parallelism): expected here.
pytestmark = pytest.mark.filterwarnings("ignore::mf_config.ConfigWarning")

PROPERTY = settings(max_examples=150, deadline=None)
SKELETON = skeleton()
SCHEMA_VALIDATOR = jsonschema.Draft202012Validator(json_schema())
OMIT = object()
"""Drawn instead of a value: leave the key out."""

# ---------------------------------------------------------------------------------------------
# Scalars and free-form YAML values
# ---------------------------------------------------------------------------------------------

NUMBER_LIKE_TEXT = ["1e5", "1.5e5", "-.5", ".5e5", "1_0e1", "._", "1.e-5", "+1E3"]
"""Strings the loader reads as floats when unquoted: a dump must quote them."""
TRICKY_TEXT = st.sampled_from([
    "", " ", "None", "none", "null", "Null", "~", "true", "False", "yes", "no", "on", "off", "y",
    "12", "-3", "0x1F", "0o17", "0b101", "1_000", "1:30", "2024-01-01", "2001-12-14 21:59:43.10",
    "<<", "=", "- a", "a: b", "a:b", "#x", "x #y", "'q'", '"q"', "[1, 2]", "{a: 1}", "*a", "&a",
    "!t", "!!str", "%YAML", "@x", "`x", "|", ">", "?", "\t", "\n", "a\nb", " lead", "trail ",
    "é", "中文", "\u2028", "\x85", "\ufeff", ".inf", "-.inf", ".nan", "0-3", "4,4,3,3",
])
IDENTIFIER = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
TEXT = st.one_of(st.text(max_size=16), TRICKY_TEXT, st.sampled_from(NUMBER_LIKE_TEXT))
NON_BLANK_TEXT = st.one_of(IDENTIFIER, st.text(min_size=1, max_size=16), TRICKY_TEXT).filter(
    lambda s: bool(s.strip()))
FINITE = st.floats(allow_nan=False)  # infinities are fine in free-form values: `.inf` reloads
YAML_KEY = st.one_of(IDENTIFIER, TEXT, st.integers(-5, 10**12), st.booleans(), st.none(),
                     FINITE)
YAML_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(), FINITE, TEXT)


@functools.cache
def yaml_values(depth: int = 3, keys: st.SearchStrategy[Any] = YAML_KEY) -> st.SearchStrategy[Any]:
    """Any value YAML can hold (no NaN), nested at most `depth` containers deep."""
    if depth == 0:
        return YAML_SCALAR
    inner = yaml_values(depth - 1, keys)
    return st.one_of(YAML_SCALAR, st.lists(inner, max_size=3),
                     st.dictionaries(keys, inner, max_size=3))


@functools.cache
def extras_for(cls: type, reserved: tuple[str, ...] = ()) -> st.SearchStrategy[dict[Any, Any]]:
    """Undeclared keys of an open section, with any values (nested mappings included)."""
    taken = set(declared_fields(cls)) | set(reserved)
    # An extra key must be a string; keys inside an extra value may be anything YAML allows.
    keys = st.one_of(IDENTIFIER, TEXT, st.just("extras")).filter(lambda k: k not in taken)
    return st.dictionaries(keys, yaml_values(2), max_size=4)


# ---------------------------------------------------------------------------------------------
# Valid configurations
# ---------------------------------------------------------------------------------------------

def _field(cls: type, name: str) -> attrs.Attribute:  # type: ignore[type-arg]
    return attrs.fields_dict(cls)[name]


def choices(cls: type, name: str) -> tuple[Any, ...]:
    """The values of a `Literal` field (or of the `Literal` inside `X | None`)."""
    t = _field(cls, name).type
    if typing.get_origin(t) is not Literal:
        (t,) = [a for a in typing.get_args(t) if typing.get_origin(a) is Literal]
    return typing.get_args(t)


def default(cls: type, name: str) -> Any:
    return getattr(cls(), name)


def for_type(t: Any, bounds: Any) -> st.SearchStrategy[Any]:
    """Well-typed values within the declared bounds, for a field without cross-field rules."""
    return _for_type(t, tuple(sorted((k, v) for k, v in bounds.items() if k in BOUNDS)))


BOUNDS = ("gt", "ge", "le")


@functools.cache  # building and validating strategies is most of the cost: build each once
def _for_type(t: Any, bound_items: tuple[tuple[str, float], ...]) -> st.SearchStrategy[Any]:
    bounds = dict(bound_items)
    origin = typing.get_origin(t)
    if t is bool:
        return st.booleans()
    if t is int:
        low = bounds["gt"] + 1 if "gt" in bounds else bounds.get("ge", -1000)
        return st.integers(low, int(bounds.get("le", 2**40)))
    if t is float:
        low = bounds.get("gt", bounds.get("ge", -1e9))
        high = bounds.get("le", 1e12)
        floats = st.floats(low, high, exclude_min="gt" in bounds, allow_nan=False)
        ints = st.integers(int(low) + 1, int(min(high, 10**6)))  # an int is a fine float
        return st.one_of(floats, ints) if int(low) + 1 <= min(high, 10**6) else floats
    if t is str:
        return TEXT
    if t is type(None):
        return st.none()
    if origin is Literal:
        return st.sampled_from(typing.get_args(t))
    if origin is list:
        return st.lists(for_type(typing.get_args(t)[0], bounds), max_size=4)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(for_type(a, bounds) for a in typing.get_args(t)))
    if attrs.has(t):
        return section(t)
    raise NotImplementedError(f"no strategy for {t!r}: give the field an explicit one")


@st.composite
def section(draw: st.DrawFn, cls: type, special: dict[str, Any] | None = None,
            extras: st.SearchStrategy[dict[Any, Any]] | None = None) -> dict[Any, Any]:
    """A section as YAML data. A field of `special` takes that strategy (or value), is written
    when it differs from the default and otherwise sometimes; the other fields are drawn from
    their type and bounds, and sometimes left out."""
    special = special or {}
    data: dict[Any, Any] = {}
    for name in declared_fields(cls):
        if name in special:
            rule = special[name]
            value = draw(rule) if isinstance(rule, st.SearchStrategy) else rule
            if value is OMIT or (_same(value, default(cls, name)) and draw(st.booleans())):
                continue
            data[name] = value
        elif draw(st.booleans()):
            a = _field(cls, name)
            data[name] = draw(for_type(a.type, a.metadata))
    if extras is not None:
        assert issubclass(cls, OpenSection)
        data.update(draw(extras))
    return data


def _same(value: Any, default_value: Any) -> bool:
    return type(value) is type(default_value) and value == default_value


@functools.cache
def layer_specs(num_layers: int | None) -> st.SearchStrategy[list[Any]]:
    return _layer_specs(num_layers)


@st.composite
def _layer_specs(draw: st.DrawFn, num_layers: int | None) -> list[Any]:
    """A non-empty, strictly ascending, non-overlapping list of layer specs below num_layers,
    written in every accepted form: '5', ' 0-3 ', '2-2', or an int."""
    limit = 100 if num_layers is None else num_layers
    assert limit >= 1
    specs: list[Any] = []
    start = draw(st.integers(0, limit - 1))
    while start < limit:
        end = draw(st.integers(start, min(limit - 1, start + 5)))
        form = draw(st.sampled_from(["single", "range", "padded", "int"]))
        if start != end or form == "range":
            text = f"{start}-{end}"
            specs.append(f" {text} " if form == "padded" else text)
        elif form == "int":
            specs.append(start)
        else:
            specs.append(f" {start}" if form == "padded" else str(start))
        if draw(st.booleans()):
            break
        start = end + 1 + draw(st.integers(0, 3))
    return specs


@functools.cache
def module_specs(num_layers: int | None) -> st.SearchStrategy[dict[str, list[Any]]]:
    return st.dictionaries(NON_BLANK_TEXT, layer_specs(num_layers), min_size=1, max_size=3)


def stage_counts(draw: st.DrawFn, chunks: int, layers: int | None) -> Any:
    """`pipeline_parallel_layers_per_stage`: `chunks` positive counts adding up to `layers`,
    as a list or as a string such as "4,4,3,3" or "[4, 4]"."""
    if layers is None:
        counts = draw(st.lists(st.integers(1, 8), min_size=chunks, max_size=chunks))
    else:
        cuts = sorted(draw(st.sets(st.integers(1, layers - 1), min_size=chunks - 1,
                                   max_size=chunks - 1))) if chunks > 1 else []
        bounds = [0, *cuts, layers]
        counts = [b - a for a, b in itertools.pairwise(bounds)]
    form = draw(st.sampled_from(["list", "string", "spaced", "brackets"]))
    if form == "list":
        return counts
    separator = ", " if form == "spaced" else ","
    text = separator.join(str(c) for c in counts)
    return f"[{text}]" if form == "brackets" else text


@st.composite
def valid_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A configuration that satisfies every rule; optional sections are sometimes left out."""
    # model: the layer count that the layer specs, stages and swap rules read
    layer_key = draw(st.sampled_from([None, "num_hidden_layers", "num_layers"]))
    hidden = draw(st.integers(1, 40)) if layer_key else None
    mtp_key = draw(st.sampled_from([None, "mtp_num_layers", "num_nextn_predict_layers"]))
    mtp = draw(st.integers(0, 3)) if mtp_key and hidden else 0
    num_layers = None if hidden is None else hidden + mtp
    swap_on = draw(st.booleans()) and (num_layers is None or num_layers >= 2)

    # parallelism
    pp = 1 if swap_on else draw(st.integers(1, 4))
    interleave = draw(st.integers(1, 3))
    schedules = choices(ParallelismConfig, "pipeline_parallel_schedule")
    schedule = "interleaved_1f1b" if interleave > 1 else draw(st.sampled_from(schedules))
    cp = draw(st.integers(1, 12))
    method = draw(st.sampled_from(choices(ParallelismConfig, "context_parallel_method")))
    divisors = [d for d in range(1, cp + 1) if cp % d == 0]
    ulysses = draw(st.sampled_from(divisors)) if method == "hybrid" else draw(
        st.one_of(st.just(OMIT), st.none(), st.sampled_from(divisors)))
    npu = draw(st.integers(1, 16))
    dispatcher = draw(st.sampled_from(choices(ParallelismConfig, "moe_token_dispatcher_type")))
    ep = draw(st.integers(npu if dispatcher == "alltoall_deredundancy" else 1, 32))
    chunks = pp * interleave
    stages: Any = OMIT
    if (hidden is None or hidden >= chunks) and draw(st.booleans()):
        stages = stage_counts(draw, chunks, hidden)
    parallelism = draw(section(ParallelismConfig, {
        "data_parallel_shard": st.one_of(st.just(-1), st.integers(1, 4096)),
        "pipeline_parallel": pp,
        "pipeline_parallel_interleave_num": interleave,
        "pipeline_parallel_schedule": schedule,
        "pipeline_parallel_layers_per_stage": stages,
        "context_parallel": cp,
        "context_parallel_method": method,
        "ulysses_degree_in_cp": ulysses,
        "npu_nums_per_device": npu,
        "moe_token_dispatcher_type": dispatcher,
        "expert_parallel": ep,
    }))

    reserved = ("num_hidden_layers", "num_layers", "mtp_num_layers", "num_nextn_predict_layers",
                "n_routed_experts")
    names = st.one_of(NON_BLANK_TEXT, st.none(), st.just(""), st.just(OMIT))
    model_type, architectures = draw(names), draw(names)
    if not (isinstance(model_type, str) and model_type) and not (
            isinstance(architectures, str) and architectures):
        model_type = draw(NON_BLANK_TEXT)
    model = draw(section(ModelConfig, {"model_type": model_type,
                                       "architectures": architectures},
                         extras_for(ModelConfig, reserved)))
    if layer_key:
        model[layer_key] = hidden
    if mtp_key and hidden:
        model[mtp_key] = mtp
    if draw(st.booleans()):
        model["n_routed_experts"] = ep * draw(st.integers(1, 8))

    # training
    global_batch = draw(st.integers(1, 4096))
    rampup: Any = OMIT
    if draw(st.booleans()):
        increment = draw(st.integers(1, 64))
        start = global_batch - increment * draw(st.integers(0, (global_batch - 1) // increment))
        rampup = [start, increment, draw(st.integers(0, 10**9))]
    training = draw(section(TrainingConfig, {
        "global_batch_size": global_batch,
        "local_batch_size": st.integers(1, global_batch),
        "rampup_batch_size": st.one_of(st.just(rampup), st.none()),
    }))

    loader = draw(section(DataloaderConfig, {
        "type": NON_BLANK_TEXT,
        "column_names": st.lists(TEXT, min_size=1, max_size=5, unique=True),
    }, extras_for(DataloaderConfig)))
    data: dict[str, Any] = {
        "model": model,
        "train_dataset": draw(section(TrainDatasetConfig, {"dataloader": loader})),
        "training": training,
        "parallelism": parallelism,
    }

    optional: dict[str, Any] = {
        "context": lambda: draw(section(ContextConfig, {
            "mode": 1,
            "max_device_memory": st.one_of(
                st.none(), st.from_regex(r"[0-9]{1,4}(\.[0-9]{1,3})?GB", fullmatch=True)),
        })),
        "checkpoint": lambda: draw(section(CheckpointConfig)),
        "optimizer": lambda: draw(section(OptimizerConfig, {
            "betas": st.lists(st.one_of(st.floats(0, 1, exclude_max=True), st.just(0)),
                              min_size=2, max_size=2),
        }, extras_for(OptimizerConfig))),
        # keys beyond the declared ones need a type (a constant rate reads none of them)
        "lr_scheduler": lambda: draw(section(LrSchedulerConfig, {"type": NON_BLANK_TEXT},
                                             extras_for(LrSchedulerConfig))),
        "monitor": lambda: monitor_section(draw, num_layers),
        "profiler": lambda: profiler_section(draw),
        "recompute": lambda: recompute_section(draw, num_layers),
        "recompute_comm": lambda: recompute_comm_section(draw, num_layers),
        "swap": lambda: swap_section(draw, num_layers, swap_on),
        "callbacks": lambda: draw(st.lists(st.builds(
            lambda type_, extra: {"type": type_, **extra},
            NON_BLANK_TEXT, extras_for(CallbackConfig, ("type",))), max_size=3)),
    }
    for name, build in optional.items():
        if (name == "swap" and swap_on) or draw(st.booleans()):
            data[name] = build()
    if draw(st.booleans()):  # the order of sections in a file does not matter
        data = dict(draw(st.permutations(list(data.items()))))
    return data


def monitor_section(draw: st.DrawFn, num_layers: int | None) -> dict[str, Any]:
    top = 10**6 if num_layers is None else num_layers - 1
    target_layers = st.one_of(st.none(), st.integers(1, 1000),
                              st.lists(st.integers(0, top), max_size=4))
    return draw(section(MonitorConfig, {
        "moe_monitor": section(MoeMonitorConfig, {"target_layers": target_layers}),
    }))


def profiler_section(draw: st.DrawFn) -> dict[str, Any]:
    start = draw(st.integers(1, 10**6))
    return draw(section(ProfilerConfig, {
        "start_step": start,
        "end_step": st.integers(start, 10**6 + 1),
        "profiler_rank": st.one_of(st.none(), st.lists(st.integers(0, 4096), max_size=4)),
    }))


def recompute_section(draw: st.DrawFn, num_layers: int | None) -> dict[str, Any]:
    mode = draw(st.sampled_from(choices(RecomputeConfig, "mode")))
    # Given with another mode, a layer list or module map is ignored with a warning: still valid.
    full = layer_specs(num_layers) if mode == "full" else st.one_of(
        st.just(OMIT), st.none(), layer_specs(num_layers))
    select = module_specs(num_layers) if mode == "select" else st.one_of(
        st.just(OMIT), st.none(), module_specs(num_layers))
    return draw(section(RecomputeConfig, {
        "mode": mode, "full_recompute_layer": full, "select_module": select}))


def recompute_comm_section(draw: st.DrawFn, num_layers: int | None) -> dict[str, Any]:
    enable = draw(st.booleans())
    select = module_specs(num_layers) if enable else st.one_of(
        st.just(OMIT), st.none(), module_specs(num_layers))
    return draw(section(RecomputeCommConfig, {"enable": enable, "select_module": select}))


def swap_section(draw: st.DrawFn, num_layers: int | None, enable: bool) -> dict[str, Any]:
    layer_swap = st.lists(st.fixed_dictionaries({"layers": layer_specs(num_layers)}),
                          max_size=2)
    op_swap = st.lists(st.fixed_dictionaries(
        {"op_name": NON_BLANK_TEXT, "layers": layer_specs(num_layers)}), max_size=2)
    entries = {"layer_swap": draw(st.one_of(st.just(OMIT), st.none(), layer_swap)),
               "op_swap": draw(st.one_of(st.just(OMIT), st.none(), op_swap))}
    if enable and not any(isinstance(v, list) and v for v in entries.values()):
        entries["layer_swap"] = draw(st.lists(
            st.fixed_dictionaries({"layers": layer_specs(num_layers)}), min_size=1, max_size=2))
    top = 10**6 if num_layers is None or not enable else num_layers - 1
    return draw(section(SwapConfig, {
        "enable": enable, "default_prefetch": st.integers(1, top), **entries}))


def dump(data: Any) -> str:
    """YAML text of plain data, as `mf-config show` writes it."""
    return dump_text(data)


OPEN_SECTIONS = {"model": ("model",), "optimizer": ("optimizer",),
                 "lr_scheduler": ("lr_scheduler",),
                 "dataloader": ("train_dataset", "dataloader")}


def _at(data: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        data = data.get(key, {}) if isinstance(data, dict) else {}
    return data


# ---------------------------------------------------------------------------------------------
# (a) valid configurations load, and dump then load is the identity
# ---------------------------------------------------------------------------------------------

@PROPERTY
@given(valid_configs())
def test_valid_configs_load_and_round_trip_through_yaml(data: dict[str, Any]) -> None:
    before = copy.deepcopy(data)
    config = TrainConfig.from_dict(data)
    assert data == before, "from_dict changed its input"

    # Extra keys of every open section are kept exactly as written.
    for name, path in OPEN_SECTIONS.items():
        section_data = _at(data, path)
        section_obj = config.train_dataset.dataloader if name == "dataloader" else getattr(
            config, name)
        written = {k: v for k, v in section_data.items()
                   if k not in declared_fields(type(section_obj))}
        assert section_obj.extras == written
        for key, value in written.items():
            assert section_obj[key] == value
    assert len(config.callbacks) == len(data.get("callbacks", []))
    for item, callback in zip(data.get("callbacks", []), config.callbacks, strict=True):
        assert callback.type == item["type"]
        assert callback.extras == {k: v for k, v in item.items() if k != "type"}

    plain = config.to_dict()
    assert TrainConfig.from_dict(copy.deepcopy(plain)) == config

    text = dump(plain)
    source = load_text(text, "dumped.yaml")
    assert source.data == plain
    again = TrainConfig.from_dict(source.data)
    assert again == config
    assert again.to_dict() == plain
    assert dump(again.to_dict()) == text

    # The schema accepts whatever the loader accepts.
    assert not list(SCHEMA_VALIDATOR.iter_errors(data))
    assert not list(SCHEMA_VALIDATOR.iter_errors(plain))


@settings(PROPERTY, max_examples=40)
@given(valid_configs())
def test_valid_configs_round_trip_through_a_file(tmp_path_factory: pytest.TempPathFactory,
                                                 data: dict[str, Any]) -> None:
    config = TrainConfig.from_dict(data)
    path = tmp_path_factory.mktemp("roundtrip") / "train.yaml"
    path.write_text(dump(config.to_dict()), encoding="utf-8")
    assert load_config(path) == config
    assert load_config(path).to_dict() == config.to_dict()


def test_valid_configs_cover_the_rules() -> None:
    """The generator reaches the interesting corners (not only the defaults)."""
    seen: set[str] = set()

    @settings(max_examples=150, deadline=None, database=None, derandomize=True)
    @given(valid_configs())
    def collect(data: dict[str, Any]) -> None:
        config = TrainConfig.from_dict(data)
        p = config.parallelism
        flags = {
            "pipeline": p.pipeline_parallel > 1,
            "interleaved": p.pipeline_parallel_interleave_num > 1,
            "stages": p.pipeline_parallel_layers_per_stage is not None,
            "hybrid": p.context_parallel_method == "hybrid",
            "deredundancy": p.moe_token_dispatcher_type == "alltoall_deredundancy",
            "full": config.recompute.mode == "full",
            "select": config.recompute.mode == "select",
            "comm": config.recompute_comm.enable,
            "swap": config.swap.enable,
            "rampup": config.training.rampup_batch_size is not None,
            "callbacks": bool(config.callbacks),
            "layers": config.model.layer_count() is not None,
            "nested extras": any(isinstance(v, dict) for v in config.model.extras.values()),
        }
        seen.update(name for name, on in flags.items() if on)

    collect()
    assert seen == {"pipeline", "interleaved", "stages", "hybrid", "deredundancy", "full",
                    "select", "comm", "swap", "rampup", "callbacks", "layers", "nested extras"}


# ---------------------------------------------------------------------------------------------
# (b) broken configurations: ConfigError, never another exception
# ---------------------------------------------------------------------------------------------

def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every position in the data (not the root), outermost first."""
    found = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(
        node, list) else ()
    for key, value in items:
        found.append((*path, key))
        found += _paths(value, (*path, key))
    return found


def _parent(data: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        data = data[key]
    return data


def _other_type(value: Any) -> st.SearchStrategy[Any]:
    """A YAML value of another type than `value` (a string where a number goes, and so on)."""
    if isinstance(value, bool):
        return st.one_of(st.integers(0, 1), st.sampled_from(["true", "True", "yes"]))
    if isinstance(value, (int, float)):
        return st.one_of(st.just(str(value)), st.just(not value), st.just(float(value) + 0.5),
                         st.just([value]), st.just({"value": value}))
    if isinstance(value, str):
        return st.one_of(st.integers(), st.floats(), st.just([value]), st.just(len(value)))
    if value is None:
        return st.sampled_from(["null", "None", "~", 0, [], {}])
    return st.one_of(YAML_SCALAR, st.just(str(value)))


MUTATIONS = ("replace", "other_type", "delete", "add_key", "null", "wrap_list", "wrap_map",
             "unwrap", "move", "alias", "special")
SPECIAL_VALUES = st.sampled_from([
    0, -1, -(2**63), 2**64, 0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e308, True,
    False, "", " ", "0", "1", "-1", "1e5", "None", "full2", "auto", "float32", "0-3", "3-0", "-1",
    "5-", "a-b", "1,2", [], {}, [None], [[]], [{}], {"": None}, {None: None}, {1: 2},
])


@st.composite
def mutated_configs(draw: st.DrawFn) -> dict[Any, Any]:
    """A valid configuration (or the spec's skeleton) broken in one to four places."""
    data = copy.deepcopy(draw(st.one_of(valid_configs(), st.just(SKELETON))))
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(data)
        kind = draw(st.sampled_from(MUTATIONS))
        if kind == "add_key" or not paths:
            mappings = [p for p in [(), *paths] if isinstance(_at_path(data, p), dict)]
            target = _at_path(data, draw(st.sampled_from(mappings)))
            target[draw(YAML_KEY)] = draw(yaml_values(2))
            continue
        path = draw(st.sampled_from(paths))
        parent, key = _parent(data, path), path[-1]
        value = parent[key]
        if kind == "replace":
            parent[key] = draw(yaml_values(2))
        elif kind == "other_type":
            parent[key] = draw(_other_type(value))
        elif kind == "special":
            parent[key] = copy.deepcopy(draw(SPECIAL_VALUES))
        elif kind == "delete":
            del parent[key]
        elif kind == "null":
            parent[key] = None
        elif kind == "wrap_list":
            parent[key] = [value]
        elif kind == "wrap_map":
            parent[key] = {draw(YAML_KEY): value}
        elif kind == "unwrap":
            if isinstance(value, dict) and value:
                parent[key] = next(iter(value.values()))
            elif isinstance(value, list) and value:
                parent[key] = value[0]
            else:
                parent[key] = {}
        elif kind in ("move", "alias"):
            # Put the subtree (or, for alias, the same object: a YAML anchor) somewhere else.
            homes = [p for p in [(), *paths] if isinstance(_at_path(data, p), dict)
                     and p[: len(path)] != path]
            home = _at_path(data, draw(st.sampled_from(homes)))
            if kind == "move":
                del parent[key]
                home[key] = value
            else:
                home[draw(YAML_KEY)] = value
    return data


def _at_path(data: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        data = data[key]
    return data


YAML_LINE_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")


def _check_issues(exc: ConfigError, file: str | None, data: Any = None,
                  text: str | None = None) -> None:
    assert exc.errors, "a ConfigError with no issue"
    assert str(exc).splitlines()[0].startswith(f"{len(exc.errors)} problem")
    for issue in exc.errors:
        assert isinstance(issue.path, str)
        assert isinstance(issue.message, str) and issue.message.strip(), issue
        assert issue.severity == "error"
        assert issue.file == file
        assert str(issue).startswith(file or "<config>")
        if text is None:  # from data: every issue names where, no line
            assert issue.line is None
            tops = [format_path((key,)) for key in [*data, *REQUIRED_SECTIONS]]
            assert any(issue.path == top or issue.path.startswith((f"{top}.", f"{top}["))
                       for top in tops), (issue, tops)
        else:  # from text: an issue with a path has a line inside the text
            if issue.path:
                assert issue.line is not None, issue
            if issue.line is not None:
                # Lines as YAML counts them (NEL, LS and PS break lines too); +2: an error at
                # the end of a text without a final line break is reported by libyaml on the
                # line after the last one (`[` gives line 2).
                assert 1 <= issue.line <= len(YAML_LINE_BREAK.findall(text)) + 2, (issue, text)


@PROPERTY
@given(mutated_configs())
def test_broken_data_raises_config_error_only(data: dict[Any, Any]) -> None:
    try:
        TrainConfig.from_dict(copy.deepcopy(data))
    except ConfigError as exc:
        event("ConfigError")
        _check_issues(exc, None, data=data)
    else:
        event("loaded")
        assert not list(SCHEMA_VALIDATOR.iter_errors(data)), "the schema rejects a valid config"


@PROPERTY
@given(mutated_configs())
def test_broken_yaml_text_raises_config_error_only(data: dict[Any, Any]) -> None:
    text = dump(data)
    try:
        config_from_source(load_text(text, "broken.yaml"))
    except ConfigError as exc:
        event("ConfigError")
        _check_issues(exc, "broken.yaml", text=text)


YAML_TOKENS = st.sampled_from([
    "model", "training", "train_dataset", "steps", "type", "a", "x", ":", ": ", "- ", "-", "\n",
    "\n  ", "\n    ", "  ", "\t", "[", "]", "{", "}", ", ", "&a ", "*a", "&b ", "*b", "<<: ",
    "? ", "'", '"', "# c", "|", ">", "---", "...", "%YAML 1.1\n", "%TAG ! tag:x,2000:\n",
    "!!str ", "!!int ", "!!float ", "!!bool ", "!!null ", "!!map ", "!!seq ", "!!binary ",
    "!!timestamp ", "!!set ", "!!omap ", "!!python/object:os.system ", "!local ", "~", "null",
    "true", "no", "0", "-1", "1e5", "1.e-5", ".inf", ".nan", "0x1F", "0o7", "0b_", "0x_", "._",
    "1:30", "2001-12-14", "=", "\u00e9", "\ufeff", "\x00", "\x85",
])


@settings(PROPERTY, max_examples=600)  # cheap: about 1 ms an example
@given(st.one_of(
    st.lists(YAML_TOKENS, max_size=30).map("".join),
    st.builds(lambda text, at, junk: text[:at] + junk + text[at:],
              st.just(dump(SKELETON)), st.integers(0, len(dump(SKELETON))),
              st.lists(YAML_TOKENS, min_size=1, max_size=4).map("".join)),
))
def test_arbitrary_yaml_text_raises_config_error_only(text: str) -> None:
    try:
        config_from_source(load_text(text, "any.yaml"))
    except ConfigError as exc:
        _check_issues(exc, "any.yaml", text=text)


# ---------------------------------------------------------------------------------------------
# Regression tests for bugs the properties above found
# ---------------------------------------------------------------------------------------------

def _skeleton_with(**changes: Any) -> dict[Any, Any]:
    data = copy.deepcopy(SKELETON)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value
    return data


@pytest.mark.parametrize("text", [
    "a: 0b_", "a: 0x_", "a: !!int x", "a: !!int ''", "a: !!float x",
    "a: !!timestamp x",
    pytest.param("a: " + "1" * 5000, id="a: 5000-digit int"),  # int() stops at 4300 digits
])
def test_bad_scalars_raise_config_error(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(text, "t.yaml")
    assert info.value.errors[0].line == 1


@pytest.mark.parametrize(("section", "key", "path"), [
    (None, None, "[None]"), (None, 1.5, "[1.5]"), (None, True, "[True]"),
    ("training", 1.5, "training[1.5]"), ("training", None, "training[None]"),
    ("model", 7, "model[7]"),
])
def test_keys_that_are_not_strings_are_reported(section: str | None, key: Any,
                                                path: str) -> None:
    """Found by the mutations above (format_path crashed on them before d14e321)."""
    data = copy.deepcopy(SKELETON)
    (data if section is None else data[section])[key] = 1
    text = dump(data)
    with pytest.raises(ConfigError) as info:
        config_from_source(load_text(text, "t.yaml"))
    [issue] = info.value.errors
    assert issue.path == path
    expected = "mapping keys must be strings" if section == "model" else (
        "Unknown configuration keys")
    assert expected in issue.message
    assert issue.line is not None
    first_line = yaml.safe_dump({key: 1}).splitlines()[0]
    assert text.splitlines()[issue.line - 1].lstrip() == first_line, (issue, text)


def _load_text_or_override(text: str, how: str, tmp_path: Path) -> None:
    """Read YAML value `text` from a file (under key `a` of the skeleton) or a --set override."""
    if how == "file":
        load_text(f"a: {text}\n", "t.yaml")
    else:
        path = tmp_path / "t.yaml"
        path.write_text(dump(SKELETON), encoding="utf-8")
        load_config(path, overrides=[f"model.a={text}"])


@pytest.mark.parametrize("how", ["file", "override"])
def test_recursive_alias_raises_config_error(how: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        _load_text_or_override("&x [*x]", how, tmp_path)


@pytest.mark.parametrize("how", ["file", "override"])
def test_unhashable_key_raises_config_error(how: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        _load_text_or_override("{!!set a: 1}", how, tmp_path)


@pytest.mark.parametrize("prefix", NUMBER_LIKE_TEXT)
def test_number_like_strings_survive_a_dump(prefix: str) -> None:
    config = TrainConfig.from_dict(_skeleton_with(checkpoint__prefix=prefix))
    assert config.checkpoint.prefix == prefix
    again = TrainConfig.from_dict(load_text(dump(config.to_dict())).data)
    assert again.checkpoint.prefix == prefix
