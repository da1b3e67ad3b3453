"""Value rules: what a well-typed configuration must also satisfy.

Types are the converter's job; this module checks values and how fields fit together, all
before any model or device is touched. Each rule names the sections it reads and is skipped
when one of them failed to structure (its errors are already reported). Bounds declared on the
fields (`gt`, `ge`, `le` metadata) are checked generically (`bounds`); the rest are written
out below.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import attrs

from .bounds import bound_problems, raw_bound_problems
from .errors import ConfigIssue, MappingKey, Path
from .layer_spec import LayerSpec, ids_text, order_problems
from .sections import REQUIRED_SECTIONS, TrainConfig
from .yaml_source import Source

if TYPE_CHECKING:
    from .model_shape import ModelSettings, ModelShape


@dataclass
class Check:
    """What a rule sees: the structured config, where values came from, what failed."""

    config: TrainConfig
    source: Source
    failed: set[str] = field(default_factory=set)
    issues: list[ConfigIssue] = field(default_factory=list)
    shape: ModelShape | None = None
    """The model's shape from its declared settings, when an installed package declares them."""
    model: ModelSettings | None = None
    """The model's declared settings (with `layer_modules`), when a package declares them."""

    def error(self, path: Path, message: str) -> None:
        self.issues.append(self.source.issue(path, message))

    def warn(self, path: Path, message: str) -> None:
        self.issues.append(self.source.issue(path, message, "warning"))

    def written(self, *path: str) -> bool:
        """Whether the user wrote this path (in the file or an override)."""
        return self.source.written(path)

    def num_layers(self) -> int | None:
        """Layers a layer spec may name (decoder plus multi-token prediction), when known."""
        if self.shape is not None:
            return self.shape.layer_count
        return None if "model" in self.failed else self.config.model.layer_count()

    def decoder_layers(self) -> int | None:
        """Decoder layers (what pipeline stages hold), when known."""
        if self.shape is not None:
            return self.shape.num_layers
        if "model" in self.failed:
            return None
        return self.config.model.decoder_layer_count()


Rule = Callable[[Check], None]
_RULES: list[tuple[tuple[str, ...], Rule]] = []


def rule(*sections: str) -> Callable[[Rule], Rule]:
    """Register a rule that reads `sections` of the config."""

    def register(fn: Rule) -> Rule:
        _RULES.append((sections, fn))
        return fn

    return register


def run_rules(config: TrainConfig, source: Source, failed: set[str],
              shape: ModelShape | None = None,
              model: ModelSettings | None = None) -> list[ConfigIssue]:
    """Every value-rule problem and warning of a structured config (`shape` and `model`: the
    model's, from its declared settings, when known)."""
    check = Check(config, source, failed, shape=shape, model=model)
    for name, a in attrs.fields_dict(TrainConfig).items():
        if name in failed:
            found = raw_bound_problems(a.type, source.data.get(name), (name,))
        else:
            found = bound_problems(getattr(config, name), (name,))
        for where, message in found:
            check.error(where, message)
    for sections, fn in _RULES:
        if not failed.intersection(sections):
            fn(check)
    return check.issues


@rule()
def required_sections(check: Check) -> None:
    data = check.source.data
    for name in REQUIRED_SECTIONS:
        if name not in data:
            check.error((name,), f"the {name} section is required")
    model, dataset = data.get("model"), data.get("train_dataset")
    if isinstance(model, dict) and not (model.get("model_type") or model.get("architectures")):
        check.error(("model",), "the model section needs model_type or architectures "
                    "(for example model_type: qwen3)")
    if isinstance(dataset, dict):
        loader = dataset.get("dataloader")
        if not isinstance(loader, dict) or not loader.get("type"):
            check.error(("train_dataset", "dataloader", "type"), "a data loader type is required "
                        "(for example BlendedMegatronDatasetDataLoader)")


@rule("context")
def context_rules(check: Check) -> None:
    context = check.config.context
    if context.mode == 0:
        check.error(("context", "mode"), "graph mode (0) is not supported: mf trains in "
                    "PyNative mode; set mode: 1")
    elif context.mode != 1:
        check.error(("context", "mode"), f"must be 1 (PyNative), got {context.mode}")
    memory = context.max_device_memory
    if memory is not None and not re.fullmatch(r"\d+(\.\d+)?GB", memory):
        check.error(("context", "max_device_memory"),
                    f"must be a size in GB such as \"59GB\", got {memory!r}")


@rule("training")
def training_rules(check: Check) -> None:
    training = check.config.training
    if training.local_batch_size > training.global_batch_size > 0:
        check.error(("training", "local_batch_size"),
                    f"local_batch_size ({training.local_batch_size}) exceeds global_batch_size "
                    f"({training.global_batch_size}); one micro-batch cannot be larger than the "
                    "global batch")
    gbs, lbs = training.global_batch_size, training.local_batch_size
    if gbs >= lbs > 0 and gbs % lbs:
        check.warn(("training", "global_batch_size"),
                   f"{gbs} is not a multiple of local_batch_size ({lbs}), so not of "
                   f"data_parallel x local_batch_size either: each step rounds it down to a "
                   f"multiple of that, {gbs // lbs * lbs} samples on one data-parallel rank; "
                   "give a multiple of local_batch_size x data_parallel")
    rampup = training.rampup_batch_size
    if rampup is None:
        return
    path = ("training", "rampup_batch_size")
    if len(rampup) != 3:
        check.error(path, "must be [start_global_batch_size, increment, rampup_samples], "
                    f"got {len(rampup)} values")
        return
    start, increment, samples = rampup
    for index, (value, name, least) in enumerate(
            [(start, "start_global_batch_size", 1), (increment, "increment", 1),
             (samples, "rampup_samples", 0)]):
        if value < least:
            check.error((*path, index), f"{name} must be >= {least}, got {value}")
    if start > 0 and increment > 0:
        if start > training.global_batch_size:
            check.error((*path, 0), f"start_global_batch_size ({start}) exceeds "
                        f"global_batch_size ({training.global_batch_size})")
        elif (training.global_batch_size - start) % increment:
            check.error((*path, 1), f"global_batch_size - start_global_batch_size "
                        f"({training.global_batch_size - start}) is not a multiple of the "
                        f"increment ({increment})")


@rule("parallelism")
def parallelism_rules(check: Check) -> None:
    p = check.config.parallelism
    section = "parallelism"
    if p.data_parallel_shard == 0 or p.data_parallel_shard < -1:
        check.error((section, "data_parallel_shard"),
                    f"must be -1 (shard over all data-parallel ranks) or >= 1, "
                    f"got {p.data_parallel_shard}")
    if (p.moe_token_dispatcher_type == "alltoall_deredundancy"
            and p.expert_parallel < p.npu_nums_per_device):
        check.error((section, "expert_parallel"),
                    f"moe_token_dispatcher_type 'alltoall_deredundancy' needs expert_parallel >= "
                    f"npu_nums_per_device, got {p.expert_parallel} < {p.npu_nums_per_device}")
    ulysses = p.ulysses_degree_in_cp
    if ulysses is not None and ulysses >= 1 and p.context_parallel % ulysses:
        check.error((section, "ulysses_degree_in_cp"),
                    f"must divide context_parallel ({p.context_parallel}), got {ulysses}")
    if p.context_parallel_method == "hybrid" and ulysses is None:
        check.error((section, "ulysses_degree_in_cp"),
                    "is required when context_parallel_method is 'hybrid'")
    if p.tensor_parallel > 1 and check.written(section, "sequence_parallel") \
            and not p.sequence_parallel:
        check.warn((section, "sequence_parallel"),
                   "sequence parallelism is always on with tensor_parallel > 1; "
                   "sequence_parallel: False is ignored")
    if p.pipeline_parallel_interleave_num > 1 and \
            p.pipeline_parallel_schedule != "interleaved_1f1b":
        check.error((section, "pipeline_parallel_schedule"),
                    f"pipeline_parallel_interleave_num {p.pipeline_parallel_interleave_num} needs "
                    f"the 'interleaved_1f1b' schedule, got {p.pipeline_parallel_schedule!r}")


@rule("parallelism", "model")
def layers_per_stage_rules(check: Check) -> None:
    p = check.config.parallelism
    path = ("parallelism", "pipeline_parallel_layers_per_stage")
    if p.pipeline_parallel_layers_per_stage is None:
        return
    try:
        counts = p.layers_per_stage()
    except ValueError:
        check.error(path, "must be a list of layer counts or a string such as \"4,4,3,3\", "
                    f"got {p.pipeline_parallel_layers_per_stage!r}")
        return
    assert counts is not None
    for index, count in enumerate(counts):
        if count < 1:
            check.error((*path, index), f"every stage needs at least one layer, got {count}")
    chunks = p.pipeline_parallel * p.pipeline_parallel_interleave_num
    if len(counts) != chunks:
        check.error(path, f"needs one entry per stage and model chunk: pipeline_parallel "
                    f"({p.pipeline_parallel}) x pipeline_parallel_interleave_num "
                    f"({p.pipeline_parallel_interleave_num}) = {chunks}, got {len(counts)}")
    layers = check.decoder_layers()
    if layers is not None and sum(counts) != layers:
        check.error(path, f"the stages hold {sum(counts)} layers, but the model has {layers}; "
                    "every layer must be placed exactly once")


@rule("parallelism", "model")
def expert_parallel_rules(check: Check) -> None:
    experts = check.shape.routed_experts if check.shape is not None else \
        check.config.model.extras.get("n_routed_experts")
    ep = check.config.parallelism.expert_parallel
    if type(experts) is int and experts > 0 and experts % ep:
        check.error(("parallelism", "expert_parallel"),
                    f"must divide model.n_routed_experts ({experts}), got {ep}")


@rule("optimizer")
def optimizer_rules(check: Check) -> None:
    betas = check.config.optimizer.betas
    path = ("optimizer", "betas")
    if len(betas) != 2:
        check.error(path, f"must be two coefficients [beta1, beta2], got {len(betas)}")
    for index, beta in enumerate(betas):
        if not 0 <= beta < 1:
            check.error((*path, index), f"must be in [0, 1), got {beta}")


@rule("train_dataset")
def dataset_rules(check: Check) -> None:
    names = check.config.train_dataset.dataloader.column_names
    path = ("train_dataset", "dataloader", "column_names")
    if not names:
        check.error(path, "must name at least one column")
    for index, name in enumerate(names):
        if name in names[:index]:
            check.error((*path, index), f"column {name!r} is listed twice")


@rule("model")
def model_rules(check: Check) -> None:
    architectures = check.config.model.architectures
    if isinstance(architectures, list) and len(architectures) != 1:
        check.error(("model", "architectures"), "must name one model class (a string, or a "
                    f"list of one as in Hugging Face's config.json), got {architectures}")
    extras = check.config.model.extras
    for name, least in (("num_hidden_layers", 1), ("num_layers", 1), ("mtp_num_layers", 0),
                        ("num_nextn_predict_layers", 0)):
        value = extras.get(name)
        if name in extras and (type(value) is not int or value < least):
            check.error(("model", name), f"must be an integer >= {least}, got {value!r}")


@rule("monitor")
def monitor_rules(check: Check) -> None:
    targets = check.config.monitor.moe_monitor.target_layers
    path = ("monitor", "moe_monitor", "target_layers")
    if isinstance(targets, int) and targets <= 0:
        check.error(path, f"an integer target_layers must be > 0, got {targets}")
    if isinstance(targets, list):
        num_layers = check.num_layers()
        for index, layer in enumerate(targets):
            if layer < 0:
                check.error((*path, index), f"must be a layer id >= 0, got {layer}")
            elif num_layers is not None and layer >= num_layers:
                check.error((*path, index), f"layer {layer} does not exist; the model has "
                            f"{num_layers} layers")
    moe_monitor_layer_warnings(check)


def moe_monitor_layer_warnings(check: Check) -> None:
    """Target layers of the MoE monitor that have no router (a dense model, or the first
    `first_k_dense_replace` layers) give no counts: said before launch, not when the monitor
    first fires."""
    monitor = check.config.monitor.moe_monitor
    shape = check.shape
    if monitor.save_tokens_per_expert_interval is None or shape is None:
        return
    path = ("monitor", "moe_monitor", "save_tokens_per_expert_interval")
    if shape.routed_experts is None:
        check.warn(path, "the model has no mixture-of-experts layers, so the MoE monitor "
                   "records nothing; remove monitor.moe_monitor")
        return
    dense = 0 if shape.experts is None else shape.experts.first_dense_layers
    targets = monitor.target_layers
    chosen = (range(targets) if isinstance(targets, int)
              else targets if isinstance(targets, list) else [])
    listed = sorted({layer for layer in chosen if 0 <= layer < dense})
    if listed:
        check.warn(("monitor", "moe_monitor", "target_layers"),
                   f"layer{'s' if len(listed) > 1 else ''} {', '.join(map(str, listed))} "
                   f"{'are' if len(listed) > 1 else 'is'} dense (the first {dense} layers, "
                   "first_k_dense_replace): no router, so no tokens per expert; the MoE "
                   f"layers are {dense} to {shape.num_layers - 1}")


@rule("profiler")
def profiler_rules(check: Check) -> None:
    profiler = check.config.profiler
    if 0 < profiler.end_step < profiler.start_step:
        check.error(("profiler", "start_step"),
                    "start_step must be less than or equal to end_step, but got "
                    f"{profiler.start_step} and {profiler.end_step}")
    for index, rank in enumerate(profiler.profiler_rank or []):
        if rank < 0:
            check.error(("profiler", "profiler_rank", index), f"must be a rank >= 0, got {rank}")


def _check_specs(check: Check, specs: list[LayerSpec], path: Path) -> None:
    if not specs:
        check.error(path, "must list at least one layer spec, such as ['0-3']")
    for index, message in order_problems(specs, check.num_layers()):
        check.error((*path, index), message)


def _check_module_specs(check: Check, modules: dict[str, list[LayerSpec]], path: Path) -> None:
    for module, specs in modules.items():
        if not module.strip():
            check.error((*path, MappingKey(module)), "a module path must not be empty")
        _check_specs(check, specs, (*path, MappingKey(module)))


@rule("recompute")
def recompute_rules(check: Check) -> None:
    recompute = check.config.recompute
    full, select = recompute.full_recompute_layer, recompute.select_module
    if recompute.mode == "full" and not full:
        check.error(("recompute", "full_recompute_layer"),
                    "mode 'full' needs a non-empty list of layer specs, such as ['0-3']")
    if recompute.mode == "select" and not select:
        check.error(("recompute", "select_module"), "mode 'select' needs a mapping of module "
                    "path to layer specs, such as {attention: ['0-1']}")
    if full:
        _check_specs(check, full, ("recompute", "full_recompute_layer"))
        if recompute.mode != "full":
            check.warn(("recompute", "full_recompute_layer"),
                       f"ignored because mode is {recompute.mode!r}, not 'full'")
    if select:
        _check_module_specs(check, select, ("recompute", "select_module"))
        if recompute.mode != "select":
            check.warn(("recompute", "select_module"),
                       f"ignored because mode is {recompute.mode!r}, not 'select'")


@rule("recompute_comm")
def recompute_comm_rules(check: Check) -> None:
    comm = check.config.recompute_comm
    if comm.enable and not comm.select_module:
        check.error(("recompute_comm", "select_module"), "enable: True needs a mapping of "
                    "communication module path to layer specs, such as {attention.qkv: ['0-3']}")
    if comm.select_module:
        _check_module_specs(check, comm.select_module, ("recompute_comm", "select_module"))


@rule("recompute", "recompute_comm", "swap", "model")
def module_path_rules(check: Check) -> None:
    """Module paths of the lists that are applied (recompute select mode, communication
    recompute, swap), against the modules the model declares for the layers each entry names
    (`ModelSettings.layer_modules`): a misspelt path fails here, not after the model is
    built."""
    config = check.config
    if config.recompute.mode == "select":
        for module, specs in (config.recompute.select_module or {}).items():
            _check_module_path(check, module, specs, ("recompute", "select_module",
                                                      MappingKey(module)))
    if config.recompute_comm.enable:
        for module, specs in (config.recompute_comm.select_module or {}).items():
            _check_module_path(check, module, specs, ("recompute_comm", "select_module",
                                                      MappingKey(module)))
    if config.swap.enable:
        for index, op in enumerate(config.swap.op_swap or []):
            _check_module_path(check, op.op_name, op.layers, ("swap", "op_swap", index,
                                                              "op_name"))


def _check_module_path(check: Check, module: str, specs: list[LayerSpec], path: Path) -> None:
    """One error for `module` when a layer `specs` name lacks it: which layers, the first
    part of the path that is missing, what is there instead."""
    layers = check.num_layers()
    if check.model is None or layers is None or not all(module.split(".")):
        return
    missing: dict[tuple[str, str, tuple[str, ...]], list[int]] = {}
    for index in sorted({i for spec in specs for i in spec.layers() if 0 <= i < layers}):
        declared = check.model.layer_modules(index)
        absent = None if declared is None else _missing_part(module, declared)
        if absent is not None:
            missing.setdefault(absent, []).append(index)
    for (inside, part, children), indices in missing.items():
        close = difflib.get_close_matches(part, children, n=1, cutoff=0.6)
        suggestion = f"{inside}.{close[0]}" if inside and close else close[0] if close else ""
        hint = f"; did you mean {suggestion!r}?" if close else ""
        shown = ", ".join(children[:12]) + (", ..." if len(children) > 12 else "")
        there = f"a layer's modules: {shown}" if not inside else f"{inside!r} has {shown}"
        check.error(path, f"layer{'s' if len(indices) > 1 else ''} {ids_text(indices)} of the "
                    f"model {'have' if len(indices) > 1 else 'has'} no module {module!r} "
                    f"({there}){hint}")


def _missing_part(module: str, declared: frozenset[str]) -> tuple[str, str, tuple[str, ...]] \
        | None:
    """(the part of `module` that exists, the first part that does not, the names under the
    existing part), or None when `module` is declared or lies below a declared module that
    declares no sub-module (where parallelism may add communication cells)."""
    parts = module.split(".")
    for end in range(1, len(parts) + 1):
        prefix = ".".join(parts[:end])
        if prefix in declared:
            continue
        inside = ".".join(parts[:end - 1])
        children = tuple(sorted(name[len(inside) + 1:] if inside else name for name in declared
                                if name.count(".") == end - 1
                                and (not inside or name.startswith(inside + "."))))
        if inside and not children:
            return None  # below a module without declared sub-modules
        return inside, parts[end - 1], children
    return None


@rule("swap")
def swap_rules(check: Check) -> None:
    swap = check.config.swap
    for index, entry in enumerate(swap.layer_swap or []):
        _check_specs(check, entry.layers, ("swap", "layer_swap", index, "layers"))
    for index, op in enumerate(swap.op_swap or []):
        if not op.op_name.strip():
            check.error(("swap", "op_swap", index, "op_name"),
                        "must name a module, such as 'attention'")
        _check_specs(check, op.layers, ("swap", "op_swap", index, "layers"))
    if not swap.enable:
        return
    if not swap.layer_swap and not swap.op_swap:
        check.error(("swap", "enable"), "swap is enabled but neither layer_swap nor op_swap "
                    "lists anything to offload")
    num_layers = check.num_layers()
    if num_layers == 1:
        check.error(("swap", "default_prefetch"), "a one-layer model has no layer to prefetch "
                    "from; swap needs at least two layers")
    elif num_layers is not None and swap.default_prefetch > num_layers - 1:
        check.error(("swap", "default_prefetch"), f"must be in [1, {num_layers - 1}] "
                    f"(num_layers - 1), got {swap.default_prefetch}")


@rule("swap", "parallelism")
def swap_pipeline_rule(check: Check) -> None:
    pp = check.config.parallelism.pipeline_parallel
    if check.config.swap.enable and pp > 1:
        check.error(("swap", "enable"), f"swap cannot be combined with pipeline parallelism "
                    f"(pipeline_parallel is {pp}); disable one of them")


@rule("callbacks")
def callback_rules(check: Check) -> None:
    for index, callback in enumerate(check.config.callbacks):
        if not (callback.type or "").strip():
            check.error(("callbacks", index, "type"),
                        "every callback needs a non-empty type naming a registered callback")

