"""No field is silently ignored: every configuration field has an entry in `support.FIELDS`
(read by named modules, or refused, or said to have no effect), every component key is read
or marked `no_effect`, and every rule does what it says on its own example."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import attrs
import pytest

pytest.importorskip("mindspore")

from mf_config import ConfigError, TrainConfig
from mf_config.cli import main as validate
from mf_config.components import KINDS, settings_class
from mf_config.components import installed_entry_points as entry_points
from mf_config.sections import Section, declared_fields
from mf_config.validate import check_source, config_from_source, load_source
from mf_train.launch.cli import run
from mf_train.preflight.job import (
    BACKENDS,
    check_support,
    device_issues,
    installed_backends,
    make_job_plan,
)
from mf_train.preflight.support import FIELDS, launch_issues, support_issues, support_table
from mf_train.preflight.support_rules import Rule, Target
from mf_train.preflight.validation import pre_launch_issues

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "qwen3_tiny.yaml"


def declared_paths(cls: type = TrainConfig, prefix: str = "") -> set[str]:
    """Every declared field of the configuration, as `section.field` (`swap.layer_swap[].layers`
    for the fields of list items)."""
    paths = set()
    for a in attrs.fields(cls):
        if a.metadata.get("extras"):
            continue
        item = _list_item(a.type)
        if _is_section(a.type):
            paths |= declared_paths(a.type, f"{prefix}{a.name}.")
        elif item is not None:  # the list, and the fields of its items
            paths |= {prefix + a.name, *declared_paths(item, f"{prefix}{a.name}[].")}
        else:
            paths.add(prefix + a.name)
    return paths


def _is_section(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, Section)


def _list_item(t: Any) -> type | None:
    """The section class of a `list[Section]` (or `list[Section] | None`) field, else None."""
    for candidate in (t, *getattr(t, "__args__", ())):
        inner = getattr(candidate, "__args__", ())
        if getattr(candidate, "__origin__", None) is list and inner and _is_section(inner[0]):
            return inner[0]
    return None


def test_every_declared_field_has_an_entry() -> None:
    declared = declared_paths()
    assert len(declared) > 90
    missing = sorted(declared - FIELDS.keys())
    assert missing == [], f"fields nobody reads, warns about or refuses: {missing}"


def test_every_entry_is_a_field_or_a_component_key() -> None:
    declared = declared_paths()
    for path in FIELDS.keys() - declared:
        *section, key = path.split(".")
        if section == ["model"]:  # a key of DeepSeek-V3's settings that depends on another
            assert key in attrs.fields_dict(settings_class("models", "deepseek_v3")), path
            continue
        if section == ["optimizer"]:  # a key of Muon's settings that depends on the run
            assert key in attrs.fields_dict(settings_class("optimizers", "Muon")), path
            continue
        assert ".".join(section) == "train_dataset.dataloader.config", path
        settings = settings_class("dataloaders", "BlendedMegatronDatasetDataLoader")
        dataset = attrs.fields_dict(settings)["config"].type.__args__[0]
        assert key in declared_fields(dataset), path


def test_every_entry_says_what_happens() -> None:
    assert [path for path, field in FIELDS.items() if not field.reads and not field.rules] == []


def source_of(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    return Path(spec.origin).read_text(encoding="utf-8")


@pytest.mark.parametrize(("path", "module"), [
    (path, module) for path, field in FIELDS.items() for module in field.reads])
def test_the_named_modules_read_the_field(path: str, module: str) -> None:
    name = path.rsplit(".", 1)[-1]
    assert re.search(rf"\.{name}\b", source_of(module)), f"{module} does not read .{name}"


def component_fields() -> list[tuple[str, type, str]]:
    return [(f"{kind}:{entry.name}", entry.load(), a.name)
            for kind in KINDS for entry in entry_points(kind)
            for a in attrs.fields(entry.load())]


SETTINGS_READERS = {
    "Qwen3Settings": ("mf_train.models.qwen3", "mf_train.settings.qwen3"),
    "DeepseekV3Settings": ("mf_train.models.deepseek_v3", "mf_train.settings.deepseek_v3"),
    "AdamWSettings": (),
    "MuonSettings": ("mf_train.optim.muon", "mf_train.optim.qk_clip"),
    "MegatronLoaderSettings": ("mf_data.builder", "mf_data.loader_config"),
    "MegatronDatasetSettings": ("mf_data.builder", "mf_data.loader_config"),
    "WandbSettings": ("mf_train.monitor.wandb",),
    "EvaluateSettings": ("mf_train.observe.evaluation",),
}
"""Where each component's settings are read (the settings module counts: its checks refuse
values, its `shape()` feeds the plan); the schedules are read in mf_train.optim.lr_schedules."""


def readers_of(cls: type) -> tuple[str, ...]:
    if cls.__module__ == "mf_train.settings.lr_schedules":
        return ("mf_train.optim.lr_schedules", "mf_train.settings.lr_schedules")
    return SETTINGS_READERS[cls.__name__]


def settings_classes() -> list[type]:
    classes = {entry.load() for kind in KINDS for entry in entry_points(kind)}
    loader = settings_class("dataloaders", "BlendedMegatronDatasetDataLoader")
    classes.add(attrs.fields_dict(loader)["config"].type.__args__[0])
    return sorted(classes, key=lambda cls: cls.__name__)


@pytest.mark.parametrize("cls", settings_classes(), ids=lambda cls: cls.__name__)
def test_every_component_key_is_read_or_has_no_effect(cls: type) -> None:
    """A key is read where its component is built (`.name` outside its declaration), refused
    at anything but a neutral value (a `Literal` of one), or marked `no_effect`."""
    sources = "\n".join(_without_fields(source_of(module)) for module in readers_of(cls))
    unread = [a.name for a in attrs.fields(cls)
              if not a.metadata.get("no_effect") and not _single_choice(a)
              and f"train_dataset.dataloader.config.{a.name}" not in FIELDS
              and not re.search(rf"\.{a.name}\b|[\"']{a.name}[\"']", sources)]
    assert unread == [], f"{cls.__name__}: keys nobody reads: {unread}"


def _without_fields(source: str) -> str:
    """The source without the lines declaring fields (`name: type = setting(`)."""
    return re.sub(r"^\s+\w+: [^=\n]+ = (setting|size)\(.*$", "", source, flags=re.M)


def _single_choice(a: Any) -> bool:
    """A key that accepts one value only (the neutral one): `Literal[x]`, or ge == le."""
    if "ge" in a.metadata and a.metadata.get("le") == a.metadata["ge"]:
        return True
    return str(a.type).startswith("typing.Literal") and len(a.type.__args__) == 1


# --- every rule on its example -----------------------------------------------------------


def rules() -> list[Any]:
    return [pytest.param(path, rule, id=f"{path}-{index}") for path, field in FIELDS.items()
            for index, rule in enumerate(field.rules)]


def target_of(overrides: dict[str, Any], world_size: int = 1,
              example: Path = EXAMPLE, device: str = "CPU") -> Target:
    sets = [f"{key}={json.dumps(value)}" for key, value in overrides.items()]
    source = load_source(example, sets)
    config = config_from_source(source)
    plan = make_job_plan(config, world_size, source)
    return Target(config, world_size, device, source, plan.dims.data_shard)


def test_the_example_triggers_no_rule() -> None:
    assert support_issues(target_of({})) == []


@pytest.mark.parametrize(("path", "rule"), rules())
def test_each_rule_applies_to_its_example(path: str, rule: Rule) -> None:
    example = EXAMPLE.parent / rule.config
    target = target_of(rule.example, rule.world_size, example, rule.device)
    issues = [issue for issue in support_issues(target) if issue.path == path]
    assert len(issues) == 1, (path, support_issues(target))
    (issue,) = issues
    assert issue.severity == ("error" if rule.refuse else "warning")
    assert rule.message.split("{")[0] in issue.message
    assert issue.file == str(example)


def test_written_keys_that_change_nothing_are_named() -> None:
    target = target_of({"model.use_cache": True, "model.bos_token_id": 1})
    assert [str(issue) for issue in support_issues(target)] == [
        f"{EXAMPLE} (--set model.bos_token_id=1): model.bos_token_id: warning: has no effect: "
        "token ids belong to the tokenizer and the data",
        f"{EXAMPLE} (--set model.use_cache=true): model.use_cache: warning: has no effect: "
        "training keeps no key/value cache"]


def test_refusals_come_before_any_rank_starts(tmp_path: Path, capsys) -> None:
    """Expert parallelism for a model without routed experts, on 2 ranks: refused by the
    launcher; no rank log is written."""
    status = run(["--config", str(EXAMPLE), "--output-dir", str(tmp_path / "out"),
                  "--set", "parallelism.expert_parallel=2", "--nproc", "2"])
    err = capsys.readouterr().err
    assert status == 2
    assert (f"{EXAMPLE} (--set parallelism.expert_parallel=2): parallelism.expert_parallel: "
            "is 2, but the model has no routed experts to split") in err
    assert "starting 2 ranks" not in err
    assert not (tmp_path / "out" / "logs").exists()


def test_the_launcher_says_what_has_no_effect_once(data_prefix, tmp_path: Path, capsys,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The warnings reach the user from the launcher, before msrun is started."""
    import mf_train.launch.cli

    def no_ranks(*args: Any, **kwargs: Any) -> None:
        print("msrun would start here", flush=True)

    monkeypatch.setattr(mf_train.launch.cli, "run_ranks", no_ranks)
    status = run(["--config", str(EXAMPLE), "--output-dir", str(tmp_path / "out"),
                  "--set", "parallelism.cpu_offload=true", "--nproc", "2",
                  "--set", f"train_dataset.dataloader.config.data_path=['1','{data_prefix}']"])
    captured = capsys.readouterr()
    assert status == 0 and "msrun would start here" in captured.out
    assert captured.err.count("parallelism.cpu_offload: warning: has no effect") == 1


def launcher_lines(config: TrainConfig, source: Any, world_size: int,
                   device: str) -> list[str]:
    """What mf-train's launcher says of a valid configuration before it starts a rank: the
    warnings `check_support` returns, or the errors it raises (on a backend this MindSpore
    lacks, `support.launch_issues`, which `check_support` adds to the device's own check)."""
    plan = make_job_plan(config, world_size, source)
    if device not in installed_backends():
        return [str(issue) for issue in launch_issues(config, plan, device, source)]
    try:
        return [str(issue) for issue in check_support(config, plan, device, source)]
    except ConfigError as exc:
        return [str(issue) for issue in exc.errors]


@pytest.mark.parametrize(("path", "rule"), rules())
def test_validate_says_what_the_launcher_says(path: str, rule: Rule, capsys) -> None:
    """`mf-config validate --nproc N` on each rule's example prints the configuration's own
    issues, then the launcher's lines for that example on N ranks, word for word."""
    example = EXAMPLE.parent / rule.config
    sets = [f"{key}={json.dumps(value)}" for key, value in rule.example.items()]
    if rule.device != "CPU":
        sets.append(f"context.device_target={rule.device}")
    status = validate(["validate", str(example), "--nproc", str(rule.world_size),
                       *(arg for item in sets for arg in ("--set", item))])
    printed = capsys.readouterr().err.splitlines()
    source = load_source(example, sets)
    config, own = check_source(source)
    said = launcher_lines(config, source, rule.world_size, rule.device)
    assert any(f" {path}: " in line for line in said)
    assert printed == [str(issue) for issue in own] + said
    assert status == (1 if rule.refuse else 0)


def test_validate_of_auto_checks_for_cpu_and_says_so_where_it_matters() -> None:
    """`auto` is resolved by MindSpore when mf-train starts; validation checks the CPU and
    adds a note only when another backend would hear something else."""
    def issues(*sets: str) -> list[tuple[str, str]]:
        source = load_source(EXAMPLE, ["context.device_target=auto", *sets])
        return [(issue.path, issue.severity) for issue in
                pre_launch_issues(check_source(source)[0], source, 1)]

    assert issues() == []
    assert issues("parallelism.cpu_offload=true") == [("parallelism.cpu_offload", "warning")]
    assert issues("context.max_device_memory=1GB") == [
        ("context.max_device_memory", "warning"), ("context.device_target", "note")]


def test_the_guide_lists_what_has_no_effect_and_what_is_refused() -> None:
    readme = (ROOT / "docs" / "train-yaml.md").read_text(encoding="utf-8")
    assert support_table() in readme, "regenerate the table: print(support_table())"


# --- what MindSpore and the batch sizes allow, said before any rank starts ----------------


def test_a_device_this_mindspore_cannot_run_is_refused() -> None:
    """From the plugins MindSpore loaded at import (`installed_backends`): no device is
    initialised to find out."""
    import mindspore

    source = load_source(EXAMPLE, ["context.device_target=GPU"])
    config = config_from_source(source)
    [issue] = device_issues(config, "GPU", source, backends=("CPU",))
    assert (issue.path, issue.origin) == ("context.device_target",
                                          "--set context.device_target=GPU")
    assert issue.message == (
        f"GPU is not available to this MindSpore ({mindspore.__version__}): its GPU plugin did "
        "not load (an installation without GPU support, or the GPU's drivers are missing); it "
        "runs on CPU here: set device_target to CPU or auto, or install MindSpore for GPU")
    assert device_issues(config, "GPU", source, backends=("GPU", "CPU")) == []
    auto = config_from_source(load_source(EXAMPLE, ["context.device_target=auto"]))
    assert device_issues(auto, "GPU", source, backends=("CPU",)) == []
    assert "CPU" in installed_backends()


@pytest.mark.parametrize("nproc", [[], ["--nproc", "2"]], ids=["one process", "launcher"])
def test_mf_train_refuses_a_missing_backend_before_starting(nproc: list[str], tmp_path: Path,
                                                            capsys) -> None:
    missing = [name for name in BACKENDS if name not in installed_backends()]
    if not missing:
        pytest.skip("this MindSpore runs on every backend")
    status = run(["--config", str(EXAMPLE), "--output-dir", str(tmp_path / "out"),
                  "--set", f"context.device_target={missing[0]}", *nproc])
    err = capsys.readouterr().err
    assert status == 2
    assert (f"{EXAMPLE} (--set context.device_target={missing[0]}): context.device_target: "
            f"{missing[0]} is not available to this MindSpore") in err
    assert "Traceback" not in err and "starting 2 ranks" not in err
    assert not (tmp_path / "out").exists()


def test_a_global_batch_rounded_down_over_data_parallel_ranks_is_said(
        data_prefix, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """6 samples a step in micro-batches of 2 on 2 data-parallel ranks: each step uses 4.
    mf-config cannot know the data-parallel size; the launcher says it, once, before msrun."""
    import mf_train.launch.cli

    monkeypatch.setattr(mf_train.launch.cli, "run_ranks", lambda *args, **kwargs: None)
    status = run(["--config", str(EXAMPLE), "--output-dir", str(tmp_path / "out"),
                  "--set", "training.global_batch_size=6", "--nproc", "2",
                  "--set", f"train_dataset.dataloader.config.data_path=['1','{data_prefix}']"])
    err = capsys.readouterr().err
    assert status == 0
    assert err.count(
        f"{EXAMPLE} (--set training.global_batch_size=6): training.global_batch_size: warning: "
        "global_batch_size 6 is not a multiple of data_parallel (2) x local_batch_size (2); "
        "each step uses 1 accumulation steps, an effective global batch of 4") == 1


def test_the_trainer_gets_the_batch_warning_to_log(tmp_path: Path) -> None:
    source = load_source(EXAMPLE, ["training.global_batch_size=6"])
    config = config_from_source(source)
    warnings = check_support(config, make_job_plan(config, 2, source), "CPU", source)
    assert [issue.path for issue in warnings] == ["training.global_batch_size"]
    on_one = check_support(config, make_job_plan(config, 1, source), "CPU", source)
    assert on_one == []  # 6 divides by 2: nothing to say on one process
