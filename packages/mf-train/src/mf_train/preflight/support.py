"""What the trainer does with every configuration field: it works, it has no effect here (a
warning, once, before anything starts), or it is refused (an error, before any rank starts).

`FIELDS` lists every field of `TrainConfig` (tests/train/test_support.py fails when a field is
added without an entry) and the component keys whose effect depends on the run. Each entry
names the modules that read the field, and the rules under which a value is refused or has no
effect, each with an example that triggers it (the tests run every example). The keys of the
open sections that are accepted but change nothing in training (Hugging Face's `use_cache`,
say) carry `no_effect` in their settings class; `support_issues` reports those too when they
are written.

`mf-train` calls `support_issues` after validating the file and working out the plan, in the
launcher, so a refusal costs seconds and no rank is started.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from mf_config import ConfigIssue, TrainConfig
from mf_config.component_settings import located_issue
from mf_config.components import KINDS, installed_entry_points, selections, settings_class
from mf_config.yaml_source import Source
from mf_data.loader_config import megatron_settings
from mf_parallel import Plan

from ..step.batch_fields import attention_fields
from .support_rules import (
    Field,
    Rule,
    Target,
    differs,
    needs,
    no_effect,
    on_cpu,
    reads,
    refused,
    value_at,
    written,
)


def _fsdp_off(_value: Any, target: Target) -> bool:
    strategy = target.config.parallelism.data_parallel_shard_strategy
    running = target.data_shard > 1 and strategy == "optim_grads_params"  # the spec's FSDP
    return target.written(("parallelism", "reshard_after_forward_policy")) and not running


def _skip_limit_set(_value: Any, target: Target) -> bool:
    """`global_norm_skip_time` written where `max_consecutive_skipped_steps` is the limit."""
    training = target.config.training
    return (target.written(("monitor", "health_checkpoint", "global_norm_skip_time"))
            and training.use_skip_step_on_nan and training.max_consecutive_skipped_steps > 0)


def _skipping_nan(_value: Any, target: Target) -> bool:
    return (target.written(("training", "max_nonfinite_steps"))
            and target.config.training.use_skip_step_on_nan)


def _model_name(target: Target) -> str:
    model = target.config.model
    return model.architecture() if model.architectures else model.model_type


def _experts_without_moe(value: Any, target: Target) -> bool:
    return value > 1 and _model_name(target) not in ("DeepseekV3ForCausalLM", "deepseek_v3")


def _dispatcher_unused(value: Any, target: Target) -> bool:
    return (target.written(("parallelism", "moe_token_dispatcher_type"))
            and target.config.parallelism.expert_parallel == 1)


def _device_size_unused(value: Any, target: Target) -> bool:
    parallelism = target.config.parallelism
    return target.written(("parallelism", "npu_nums_per_device")) and (
        parallelism.expert_parallel == 1
        or parallelism.moe_token_dispatcher_type != "alltoall_deredundancy")


def _pipeline_setting_unused(value: Any, target: Target, name: str) -> bool:
    return target.written(("parallelism", name)) and \
        target.config.parallelism.pipeline_parallel == 1


def _overlap_b_f_staged(value: Any, target: Target) -> bool:
    return bool(value) and target.config.parallelism.pipeline_parallel > 1


def _compile_blocked(value: Any, target: Target) -> bool:
    """`context.compile` asked where the decoder layers stay in PyNative (the reasons are
    `compiled_layers`'; mf-train's start-up line names the one that applies)."""
    config = target.config
    return bool(value) and (config.parallelism.context_parallel > 1 or config.swap.enable
                            or _qk_clip_on(target))


def _qk_clip_on(target: Target) -> bool:
    """Muon with `qk_clip_enabled: true` (`mf_train.optim.qk_clip`)."""
    optimizer = target.config.optimizer
    return optimizer.type in ("Muon", "muon") and optimizer.extras.get("qk_clip_enabled") is True


def _qk_clip_without_mla(_value: Any, target: Target) -> bool:
    return _qk_clip_on(target) and _model_name(target) not in ("DeepseekV3ForCausalLM",
                                                                "deepseek_v3")


def _qk_clip_with_context(_value: Any, target: Target) -> bool:
    return _qk_clip_on(target) and target.config.parallelism.context_parallel > 1


def _qk_clip_with_flash(_value: Any, target: Target) -> bool:
    try:
        flash = value_at(target.config, ("model", "use_flash_attention"))
    except KeyError:
        flash = False
    return _qk_clip_on(target) and target.device != "CPU" and bool(flash)


def _no_gradient_reduction(_value: Any, target: Target) -> bool:
    """`reduce_dtype` written where every rank is its own data-parallel group (data x context
    is 1; with expert parallelism the expert-data group is then one rank too)."""
    parallelism = target.config.parallelism
    model_ranks = parallelism.tensor_parallel * parallelism.pipeline_parallel
    return (target.written(("parallelism", "reduce_dtype"))
            and target.world_size <= model_ranks)


def _without_tensor_parallel(value: Any, target: Target) -> bool:
    return bool(value) and target.config.parallelism.tensor_parallel == 1


def _context_setting_unused(name: str) -> Callable[[Any, Target], bool]:
    return lambda _value, target: (target.written(("parallelism", name))
                                   and target.config.parallelism.context_parallel == 1)


def _gathers_keys(target: Target) -> bool:
    """Whether context parallelism all-gathers keys and values (colossal, hybrid): the ring
    part of the context group is more than one rank (as `ParallelDims.context_overlap`)."""
    parallelism = target.config.parallelism
    return parallelism.ulysses_degree() < parallelism.context_parallel


def _overlap_without_gather(value: Any, target: Target) -> bool:
    return (value and target.config.parallelism.context_parallel > 1
            and not _gathers_keys(target))


def _overlap_on_cpu(value: Any, target: Target) -> bool:
    return value and target.device == "CPU" and _gathers_keys(target)


def _p2p_overlap_on_cpu(value: Any, target: Target) -> bool:
    return value and target.device == "CPU" and target.config.parallelism.pipeline_parallel > 1


def _overlap_with_flash(value: Any, target: Target) -> bool:
    """The overlap wanted where the model's attention runs the fused kernel (not on CPU)."""
    try:
        flash = value_at(target.config, ("model", "use_flash_attention"))
    except KeyError:
        flash = False
    return value and target.device != "CPU" and bool(flash) and _gathers_keys(target)


def _ulysses_degree_unused(_value: Any, target: Target) -> bool:
    parallelism = target.config.parallelism
    return target.written(("parallelism", "ulysses_degree_in_cp")) and (
        parallelism.context_parallel == 1 or parallelism.context_parallel_method != "hybrid")


def _data_flags(target: Target) -> tuple[bool, bool, bool, bool] | None:
    """(reset_position_ids, reset_attention_mask, create_attention_mask,
    create_compressed_eod_mask) of the Megatron loader's settings; None for another loader or
    settings mf-data refuses (the validation says why)."""
    try:
        data = megatron_settings(target.config.train_dataset.dataloader).config
    except Exception:  # not the Megatron loader, or bad settings reported elsewhere
        return None
    return (data.reset_position_ids, data.reset_attention_mask, data.create_attention_mask,
            data.create_compressed_eod_mask)


def _no_document_mask(value: Any, target: Target) -> bool:
    flags = _data_flags(target)
    return bool(value) and flags is not None and not (flags[2] or flags[3])


def _causal_mask_only(value: Any, target: Target) -> bool:
    flags = _data_flags(target)
    written = target.written(("train_dataset", "dataloader", "config", "create_attention_mask"))
    return bool(value) and written and flags is not None and not (flags[1] or flags[3])


def _compact_mask_off(name: str) -> Callable[[Any, Target], bool]:
    keys = ("train_dataset", "dataloader", "config", name)

    def off(_value: Any, target: Target) -> bool:
        flags = _data_flags(target)
        return target.written(keys) and flags is not None and not flags[3]
    return off


def _columns_disagree(value: list[str], target: Target) -> bool:
    """`column_names` names a position or mask column (by MindFormers' order: tokens, labels,
    loss_mask, position_ids, then the mask) that the data settings do not make, or leaves out
    one they make: the model gets what the settings make either way."""
    flags = _data_flags(target)
    if flags is None:
        return False
    fields = attention_fields(*flags)
    mask_made = any(name in fields for name in ("actual_seq_len", "attention_mask"))
    return (len(value) > 4) != mask_made or (len(value) < 4 and "position_ids" in fields)


WITHOUT_PIPELINE = "has no effect without pipeline parallelism (pipeline_parallel is 1)"
WITHOUT_CONTEXT = "has no effect without context parallelism (context_parallel is 1)"
STREAM = "mf_train.step.micro_batches"

TRAINER = "mf_train.trainer"
WRITER = "mf_train.checkpoint.writer"
READER = "mf_train.checkpoint.reader"
LOADER = "mf_data.loader"
PROFILING = "mf_train.observe.profiling"
PROFILER_SWITCH = "profiler.enable_profiling"
SKIP_SWITCH = "training.use_skip_step_on_nan"
SKIPS = " (no step is skipped, whatever the gradient norm)"
SAVE_SWITCH = "checkpoint.enable_save"

FIELDS: dict[str, Field] = {
    # context
    "context.device_target": reads(TRAINER),
    "context.mode": reads("mf_config.rules"),
    "context.max_device_memory": reads(TRAINER, rules=(
        no_effect(on_cpu, "has no effect on the CPU backend: MindSpore's CPU memory pool "
                          "ignores the cap (measured: a 1.6 GB tensor allocates under a 1GB "
                          "cap); it is applied on Ascend and GPU",
                  {"context.max_device_memory": "1GB"}),)),
    "context.compile": reads(TRAINER, "mf_train.step.compiled_layers", rules=(
        no_effect(_compile_blocked, "has no effect here: the decoder layers stay in PyNative "
                                    "under context parallelism, activation swap or Muon's "
                                    "QK-clip (the start-up log line says why)",
                  {"context.compile": True, "swap.enable": True,
                   "swap.layer_swap": [{"layers": ["0"]}]}),)),
    # checkpoint
    "checkpoint.enable_save": reads(TRAINER, WRITER),
    "checkpoint.save_path": reads(TRAINER, WRITER),
    "checkpoint.save_max": reads(WRITER, rules=(
        needs(SAVE_SWITCH, "checkpoint.save_max", 3, why=" (nothing is saved)"),)),
    "checkpoint.save_interleaved_steps": reads(WRITER, rules=(
        needs(SAVE_SWITCH, "checkpoint.save_interleaved_steps", 10, why=" (nothing is saved)"),)),
    "checkpoint.no_save_optim": reads(TRAINER, WRITER, rules=(
        needs(SAVE_SWITCH, "checkpoint.no_save_optim", True, why=" (nothing is saved)"),)),
    "checkpoint.async_save": reads(WRITER, rules=(
        needs(SAVE_SWITCH, "checkpoint.async_save", True, why=" (nothing is saved)"),)),
    "checkpoint.prefix": reads(WRITER, rules=(
        needs(SAVE_SWITCH, "checkpoint.prefix", "run", why=" (nothing is saved)"),)),
    "checkpoint.remove_redundancy": Field(rules=(
        no_effect(lambda value, target: value is False
                  and target.written(("checkpoint", "remove_redundancy")),
                  "false has no effect: mf always writes each tensor once (each rank the "
                  "ranges it owns; a tensor several ranks hold, by the first of them)",
                  {"checkpoint.remove_redundancy": False}),)),
    "checkpoint.load_path": reads(TRAINER, READER),
    "checkpoint.load_balanced": Field(rules=(
        no_effect(differs(False), "has no effect here: each rank reads only the ranges of "
                                  "the tensors it holds, whatever layout saved them; mf "
                                  "does not read once and broadcast",
                  {"checkpoint.load_balanced": True}),)),
    "checkpoint.no_load_optim": reads(READER),
    "checkpoint.load_worker_number": reads(READER),
    "checkpoint.save_global_layout_cache": Field(rules=(
        no_effect(written("checkpoint.save_global_layout_cache"),
                  "has no effect here: mf keeps no global layout cache; each checkpoint's "
                  "common.json records where every range of every tensor lies",
                  {"checkpoint.save_global_layout_cache": True}),)),
    # training
    "training.steps": reads(TRAINER),
    "training.local_batch_size": reads("mf_parallel.batch"),
    "training.global_batch_size": reads("mf_parallel.batch", TRAINER),
    "training.max_norm": reads(TRAINER),
    "training.seed": reads(TRAINER),
    "training.deterministic": reads(TRAINER),
    "training.rampup_batch_size": reads("mf_parallel.batch"),
    "training.use_skip_step_on_nan": reads(TRAINER),
    "training.max_consecutive_skipped_steps": reads(TRAINER, rules=(
        needs(SKIP_SWITCH, "training.max_consecutive_skipped_steps", 1, why=SKIPS),)),
    "training.max_nonfinite_steps": reads(TRAINER, rules=(
        no_effect(_skipping_nan, "has no effect with training.use_skip_step_on_nan: a step "
                                 "whose gradient norm is not finite is skipped, never applied "
                                 "(training.max_consecutive_skipped_steps limits those)",
                  {"training.max_nonfinite_steps": 5, "training.use_skip_step_on_nan": True}),)),
    # parallelism
    "parallelism.data_parallel_shard": reads("mf_parallel.dims"),
    "parallelism.data_parallel_shard_strategy": reads("mf_train.layouts.sharded"),
    "parallelism.reshard_after_forward_policy": reads("mf_train.layouts.sharded", rules=(
        no_effect(_fsdp_off, "has no effect: only FSDP (data_parallel_shard_strategy "
                             "optim_grads_params over more than one rank) reshards parameters",
                  {"parallelism.reshard_after_forward_policy": "always"}),)),
    "parallelism.cpu_offload": Field(rules=(
        no_effect(differs(False), "has no effect: the trainer keeps parameters and optimizer "
                                  "state on the device", {"parallelism.cpu_offload": True}),)),
    "parallelism.disable_gradient_division": reads("mf_train.layouts.contract",
                                                   "mf_train.layouts.replicated"),
    "parallelism.tensor_parallel": reads("mf_parallel.dims", TRAINER),
    "parallelism.context_parallel": reads("mf_parallel.dims"),
    "parallelism.context_parallel_method": reads("mf_config.sections", rules=(
        no_effect(_context_setting_unused("context_parallel_method"), WITHOUT_CONTEXT,
                  {"parallelism.context_parallel_method": "ulysses"}),)),
    "parallelism.ulysses_degree_in_cp": reads("mf_config.sections", rules=(
        no_effect(_ulysses_degree_unused, "has no effect: it sets the Ulysses part of "
                                          "context_parallel_method 'hybrid' only",
                  {"parallelism.ulysses_degree_in_cp": 1}),)),
    "parallelism.context_parallel_mask_type": reads("mf_parallel.dims", rules=(
        no_effect(_context_setting_unused("context_parallel_mask_type"), WITHOUT_CONTEXT,
                  {"parallelism.context_parallel_mask_type": "full"}),)),
    "parallelism.context_parallel_async": reads("mf_parallel.dims", rules=(
        no_effect(_context_setting_unused("context_parallel_async"), WITHOUT_CONTEXT,
                  {"parallelism.context_parallel_async": True}),
        no_effect(_overlap_without_gather, "has no effect with context_parallel_method "
                                           "'ulysses': it overlaps the all-gather of keys and "
                                           "values (colossal, hybrid), and Ulysses' all-to-alls "
                                           "feed attention directly",
                  {"parallelism.context_parallel_async": True,
                   "parallelism.context_parallel": 2,
                   "parallelism.context_parallel_method": "ulysses"}, world_size=2),
        no_effect(_overlap_on_cpu, "overlaps nothing on the CPU backend: MindSpore runs a "
                                   "collective there in kernel order, on the launching thread "
                                   "(measured: starting the all-gather took the whole exchange "
                                   "and the wait none); the overlapped order still runs, as on "
                                   "Ascend and GPU, where the gather runs on the communication "
                                   "stream: attention over this rank's keys, then the others', "
                                   "merged (measured here: about 15 % more work, a lower peak)",
                  {"parallelism.context_parallel_async": True,
                   "parallelism.context_parallel": 2}, world_size=2),
        no_effect(_overlap_with_flash, "has no effect with use_flash_attention: the fused "
                                       "kernel attends to all keys at once, so the keys and "
                                       "values are gathered before it (the overlap runs the "
                                       "plain attention in two parts)",
                  {"parallelism.context_parallel_async": True,
                   "parallelism.context_parallel": 2, "model.use_flash_attention": True},
                  world_size=2, device="Ascend"),)),
    "parallelism.pipeline_parallel": reads("mf_parallel.dims"),
    **{f"parallelism.{name}": reads(module, rules=(
        no_effect(lambda v, t, name=name: _pipeline_setting_unused(v, t, name),
                  WITHOUT_PIPELINE, {f"parallelism.{name}": value}), *more))
       for name, value, module, more in (
           ("pipeline_parallel_layers_per_stage", [4], "mf_config.sections", ()),
           ("pipeline_parallel_schedule", "gpipe", "mf_parallel.plan", ()),
           ("pipeline_parallel_interleave_num", 1, "mf_parallel.plan", ()),
           ("pipeline_parallel_enable_dxdw_split", True, "mf_parallel.plan", ()),
           ("pipeline_parallel_overlap_p2p", True, "mf_train.layouts.pipelined", (
               no_effect(_p2p_overlap_on_cpu,
                         "overlaps nothing on the CPU backend: each pipeline message is "
                         "launched without waiting (on Ascend and GPU a non-blocking send and "
                         "receive on the communication stream), but MindSpore's CPU backend "
                         "runs every operation of a process in one queue, so the message "
                         "still waits for the computations queued before it (measured: an "
                         "async all-reduce beside a computation took as long as the two in "
                         "turn); the results are the same",
                         {"parallelism.pipeline_parallel_overlap_p2p": True,
                          "parallelism.pipeline_parallel": 2}, world_size=2),)))},
    "parallelism.pipeline_parallel_overlap_b_f": Field(rules=(
        no_effect(lambda v, t: _pipeline_setting_unused(v, t, "pipeline_parallel_overlap_b_f"),
                  WITHOUT_PIPELINE, {"parallelism.pipeline_parallel_overlap_b_f": True}),
        no_effect(lambda v, t: _overlap_b_f_staged(v, t) and t.device == "CPU",
                  "has no effect on the CPU backend: running one micro-batch's forward beside "
                  "another's backward needs a second compute stream, which MindSpore's CPU "
                  "backend lacks (there `mindspore.runtime.Stream()` is stream 0 and "
                  "`StreamCtx` fails); each stage runs one computation at a time",
                  {"parallelism.pipeline_parallel_overlap_b_f": True,
                   "parallelism.pipeline_parallel": 2}, world_size=2),
        no_effect(lambda v, t: _overlap_b_f_staged(v, t) and t.device != "CPU",
                  "has no effect: mf-train's pipeline schedules run one computation at a time "
                  "on each stage; the overlap of one micro-batch's forward with another's "
                  "backward on a second compute stream is not built",
                  {"parallelism.pipeline_parallel_overlap_b_f": True,
                   "parallelism.pipeline_parallel": 2}, world_size=2, device="Ascend"),)),
    "parallelism.sequence_parallel": Field(rules=(
        no_effect(_without_tensor_parallel, "has no effect without tensor parallelism "
                                            "(tensor_parallel is 1); with it, sequence "
                                            "parallelism is always on",
                  {"parallelism.sequence_parallel": True}),)),
    "parallelism.expert_parallel": reads("mf_parallel.dims", rules=(
        refused(_experts_without_moe,
                "is {value}, but the model has no routed experts to split (expert parallelism "
                "applies to mixture-of-experts models such as DeepSeek-V3); set it to 1",
                {"parallelism.expert_parallel": 2}, world_size=2),)),
    "parallelism.npu_nums_per_device": reads("mf_parallel.dims", rules=(
        no_effect(_device_size_unused,
                  "has no effect: it groups the ranks of an expert group into devices for "
                  "moe_token_dispatcher_type 'alltoall_deredundancy' with expert_parallel > 1 "
                  "only", {"parallelism.npu_nums_per_device": 1}),)),
    "parallelism.moe_token_dispatcher_type": reads(TRAINER, rules=(
        no_effect(_dispatcher_unused, "has no effect without expert parallelism "
                                      "(expert_parallel is 1): every expert is on every rank",
                  {"parallelism.moe_token_dispatcher_type": "alltoall_deredundancy",
                   "parallelism.npu_nums_per_device": 1}),)),
    "parallelism.param_dtype": Field(rules=(
        no_effect(differs("float32"), "has no effect: parameters are kept in "
                                      "model.params_dtype and computed in model.compute_dtype; "
                                      "set those", {"parallelism.param_dtype": "bfloat16"}),)),
    "parallelism.reduce_dtype": reads("mf_train.layouts.contract", rules=(
        no_effect(_no_gradient_reduction, "has no effect: no gradient is reduced over "
                                          "data-parallel ranks (data x context parallel "
                                          "size 1)",
                  {"parallelism.reduce_dtype": "float16"}),)),
    # optimizer and learning rate
    "optimizer.type": reads("mf_train.optim"),
    "optimizer.betas": reads("mf_train.optim.base"),
    "optimizer.eps": reads("mf_train.optim.base"),
    "optimizer.weight_decay": reads("mf_train.optim.adamw"),
    **{f"optimizer.{name}": reads("mf_train.optim.base", rules=(
        needs("optimizer.weight_decay", f"optimizer.{name}", ["norm"], off=0,
              why=" (no parameter decays)"),))
       for name in ("weight_decay_include", "weight_decay_exclude")},
    # (Muon's keys; an open section's key is checked only when it is written)
    "optimizer.qk_clip_enabled": reads("mf_train.optim.qk_clip", rules=(
        refused(_qk_clip_without_mla,
                "is true, but QK-clip rescales each attention head's own query and key "
                "weights, which multi-head latent attention (DeepSeek-V3) has: Qwen3 "
                "normalises each head's query and key after the projection (q_norm, k_norm, "
                "one weight shared by every head), so no weight scales one head's logits; "
                "set false", {"optimizer.type": "Muon", "optimizer.qk_clip_enabled": True}),
        refused(_qk_clip_with_context,
                "is true, but under context parallelism each rank attends over parts of the "
                "keys, where no head's largest logit is recorded; set false, or "
                "parallelism.context_parallel: 1",
                {"optimizer.type": "Muon", "optimizer.qk_clip_enabled": True,
                 "parallelism.context_parallel": 2}, world_size=2,
                config="deepseek_v3_tiny.yaml"),
        refused(_qk_clip_with_flash,
                "is true, but the fused attention kernel (model.use_flash_attention) does not "
                "give the logits QK-clip reads; set model.use_flash_attention: false",
                {"optimizer.type": "Muon", "optimizer.qk_clip_enabled": True,
                 "model.use_flash_attention": True}, config="deepseek_v3_tiny.yaml",
                device="Ascend"))),
    "optimizer.qk_clip_threshold": reads("mf_train.optim.qk_clip", rules=(
        no_effect(lambda _value, target: not _qk_clip_on(target),
                  "has no effect: optimizer.qk_clip_enabled is false",
                  {"optimizer.type": "Muon", "optimizer.qk_clip_threshold": 50}),)),
    "lr_scheduler.type": reads("mf_train.optim.lr_schedules"),
    "lr_scheduler.learning_rate": reads("mf_train.optim.lr_schedules"),
    # data
    "train_dataset.dataloader.type": reads("mf_train.step.micro_batches"),
    "train_dataset.dataloader.shuffle": reads(LOADER),
    "train_dataset.dataloader.column_names": reads(LOADER, rules=(
        no_effect(_columns_disagree, "lists {value}, but mf-train takes each sample's fields "
                                     "by name as the data settings make them, not by these "
                                     "names: position_ids with reset_position_ids, the "
                                     "document mask with create_compressed_eod_mask (compact) "
                                     "or reset_attention_mask and create_attention_mask "
                                     "(dense); otherwise positions run through the sequence "
                                     "and attention is causal",
                  {"train_dataset.dataloader.column_names":
                   ["input_ids", "labels", "loss_mask", "position_ids", "attention_mask"]}),)),
    "train_dataset.dataloader.python_multiprocessing": reads(LOADER),
    "train_dataset.drop_remainder": reads(LOADER),
    "train_dataset.num_parallel_workers": reads(LOADER),
    "train_dataset.prefetch_size": reads(LOADER),
    "train_dataset.numa_enable": Field(rules=(
        no_effect(differs(False), "has no effect: mf-data pins its threads to no NUMA node",
                  {"train_dataset.numa_enable": True}),)),
    "train_dataset.dataloader.config.reset_attention_mask": reads(STREAM, rules=(
        no_effect(_no_document_mask, "has no effect: no document mask is built "
                                     "(create_attention_mask and create_compressed_eod_mask "
                                     "are both false), so packed documents attend to each "
                                     "other; set one of them",
                  {"train_dataset.dataloader.config.reset_attention_mask": True,
                   "train_dataset.dataloader.config.create_attention_mask": False}),)),
    "train_dataset.dataloader.config.reset_position_ids": reads("mf_data.gpt_dataset", STREAM),
    "train_dataset.dataloader.config.create_attention_mask": reads(STREAM, rules=(
        no_effect(_causal_mask_only, "has no effect on training without "
                                     "reset_attention_mask: the mask would be the causal one "
                                     "the models apply anyway, so mf-train does not carry it",
                  {"train_dataset.dataloader.config.create_attention_mask": True}),)),
    "train_dataset.dataloader.config.create_compressed_eod_mask": reads(STREAM),
    **{f"train_dataset.dataloader.config.{name}": Field(reads=("mf_data.loader_config",), rules=(
        no_effect(_compact_mask_off(name), "has no effect: it sizes the compact document mask, "
                                           "which create_compressed_eod_mask: false does not "
                                           "build",
                  {f"train_dataset.dataloader.config.{name}": 64}),))
       for name in ("eod_pad_length", "compressed_eod_mask_length")},
    # model
    "model.model_type": reads("mf_train.models"),
    "model.architectures": reads("mf_train.models"),
    "model.moe_router_bias_update_rate": Field(rules=(
        # (an open section's key is checked only when it is written)
        no_effect(lambda _value, t: not t.config.model.extras.get(
                      "moe_router_enable_expert_bias", True),
                  "has no effect: model.moe_router_enable_expert_bias is false (the expert "
                  "bias is not updated)", {"model.moe_router_enable_expert_bias": False,
                                           "model.moe_router_bias_update_rate": 0.01},
                  config="deepseek_v3_tiny.yaml"),)),
    # monitoring
    "monitor.train_state.local_norm": reads("mf_train.monitor.train_state"),
    "monitor.train_state.local_loss": reads("mf_train.monitor.train_state"),
    "monitor.train_state.device_norm": reads("mf_train.monitor.train_state"),
    "monitor.train_state.device_loss": reads("mf_train.monitor.train_state"),
    "monitor.moe_monitor.save_tokens_per_expert_interval": reads("mf_train.monitor.moe"),
    "monitor.moe_monitor.target_layers": reads("mf_train.monitor.moe", rules=(
        needs("monitor.moe_monitor.save_tokens_per_expert_interval",
              "monitor.moe_monitor.target_layers", [1], off=None,
              why=" (the MoE monitor records nothing)"),)),
    "monitor.health_checkpoint.embedding_local_norm_threshold": reads("mf_train.monitor.health"),
    "monitor.health_checkpoint.global_norm_skip_threshold": reads(TRAINER, rules=(
        needs(SKIP_SWITCH, "monitor.health_checkpoint.global_norm_skip_threshold", 0.5,
              why=SKIPS),)),
    "monitor.health_checkpoint.global_norm_skip_time": reads(TRAINER, rules=(
        needs(SKIP_SWITCH, "monitor.health_checkpoint.global_norm_skip_time", 3, why=SKIPS),
        no_effect(_skip_limit_set, "has no effect: training.max_consecutive_skipped_steps is "
                                   "above 0 and is the limit of skipped steps in a row",
                  {"monitor.health_checkpoint.global_norm_skip_time": 3, SKIP_SWITCH: True,
                   "training.max_consecutive_skipped_steps": 2}),)),
    "monitor.tensorboard.output_dir": reads("mf_train.monitor.tensorboard"),
    "monitor.tensorboard.log_interval": reads("mf_train.monitor.tensorboard"),
    "monitor.tensorboard.queue_size": reads("mf_train.monitor.tensorboard"),
    # profiler
    "profiler.enable_profiling": reads(PROFILING),
    **{f"profiler.{name}": reads(PROFILING, rules=(
        needs(PROFILER_SWITCH, f"profiler.{name}", value),))
       for name, value in (("start_step", 1), ("end_step", 1), ("output_path", "prof"),
                           ("profiler_rank", [0]), ("profile_memory", True),
                           ("profile_cpu", True))},
    "profiler.profiler_level": reads(PROFILING, rules=(
        needs(PROFILER_SWITCH, "profiler.profiler_level", 1),
        no_effect(lambda value, t: t.config.profiler.enable_profiling and t.device == "CPU"
                  and value != 0, "has no effect on the CPU backend: its profiler records "
                                  "every host operator at any level",
                  {"profiler.enable_profiling": True, "profiler.profiler_level": 1}))),
    "profiler.mstx": reads(PROFILING, rules=(
        no_effect(lambda value, t: value and t.device != "Ascend", "has no effect here: mstx "
                  "markers exist on Ascend only", {"profiler.mstx": True}),)),
    "profiler.with_stack": reads(PROFILING, rules=(
        no_effect(lambda value, t: (t.written(("profiler", "with_stack")) and value
                                    and t.device != "Ascend"),
                  "has no effect here: MindSpore collects Python call stacks on Ascend only",
                  {"profiler.with_stack": True}),)),
    # memory
    "recompute.mode": reads("mf_memory.recompute"),
    "recompute.full_recompute_layer": reads("mf_memory.recompute"),
    "recompute.select_module": reads("mf_memory.recompute"),
    "recompute_comm.enable": reads("mf_memory.recompute", rules=(
        no_effect(_without_tensor_parallel, "has no effect without tensor parallelism "
                                            "(tensor_parallel is 1): there is no tensor-"
                                            "parallel communication to recompute",
                  {"recompute_comm.enable": True,
                   "recompute_comm.select_module": {"attention.qkv": ["0"]}}),)),
    "recompute_comm.select_module": reads("mf_memory.recompute", rules=(
        no_effect(lambda value, t: value is not None and not t.config.recompute_comm.enable,
                  "has no effect: recompute_comm.enable is false",
                  {"recompute_comm.select_module": {"attention.qkv": ["0"]}}),)),
    "swap.enable": reads("mf_memory.swap"),
    **{f"swap.{name}": reads("mf_memory.swap", rules=(
        needs("swap.enable", f"swap.{name}", value),))
       for name, value in (("default_prefetch", 1), ("layer_swap", [{"layers": ["0"]}]),
                           ("op_swap", [{"op_name": "attention", "layers": ["0"]}]))},
    "swap.layer_swap[].layers": reads("mf_memory.swap"),
    "swap.op_swap[].op_name": reads("mf_memory.swap"),
    "swap.op_swap[].layers": reads("mf_memory.swap"),
    "callbacks": reads(TRAINER),
    "callbacks[].type": reads("mf_train.observe.callbacks"),
}


def launch_issues(config: TrainConfig, plan: Plan, device: str,
                  source: Source | None = None) -> list[ConfigIssue]:
    """What the launcher says of a configuration before any rank starts, beyond validation:
    the rules of `FIELDS` on this plan and backend (errors for what is refused, warnings for
    what has no effect), and the global batch each step really uses.

    Args:
        config: the validated configuration.
        plan: its parallel plan on the job's ranks.
        device: the backend it runs on (`context.device_target` resolved).
        source: locates each issue.

    Returns:
        Every such issue, errors and warnings.
    """
    return support_issues(Target(config, plan.dims.world_size, device, source,
                                 plan.dims.data_shard)) + _batch_warnings(plan, source)


def _batch_warnings(plan: Plan, source: Source | None) -> list[ConfigIssue]:
    """The batch actually used, when `global_batch_size` is not a multiple of data_parallel x
    local_batch_size. On one data-parallel rank validation has said it already (mf-config
    warns whenever the global batch is not a multiple of local_batch_size)."""
    if plan.batch.data_parallel == 1:
        return []
    return [located_issue(("training", "global_batch_size"), warning, "warning", source)
            for warning in plan.batch.warnings()]


def support_issues(target: Target) -> list[ConfigIssue]:
    """Errors for what the trainer refuses, warnings for what has no effect here: the rules
    of `FIELDS`, and the written keys of open sections whose settings say `no_effect`."""
    issues = [_issue(target, path, rule) for path, field in FIELDS.items()
              if "[]" not in path for rule in field.rules if _applies(target, path, rule)]
    return issues + _inert_keys(target)


def _applies(target: Target, path: str, rule: Rule) -> bool:
    try:
        value = value_at(target.config, tuple(path.split(".")))
    except KeyError:  # an open section's key that is not written
        return False
    return rule.applies(value, target)


def _issue(target: Target, path: str, rule: Rule) -> ConfigIssue:
    keys = tuple(path.split("."))
    message = rule.message.format(value=value_at(target.config, keys))
    severity = "error" if rule.refuse else "warning"
    if target.source is not None:
        return target.source.issue(keys, message, severity)
    return ConfigIssue(path, message, severity=severity)


def _inert_keys(target: Target) -> list[ConfigIssue]:
    """Written keys of open sections that their component accepts but does not use."""
    issues = []
    for selection in selections(target.config):
        cls = settings_class(selection.kind, selection.type_name) \
            if selection.type_name else None
        if cls is None:
            continue
        for a in attrs.fields(cls):
            reason = a.metadata.get("no_effect")
            if reason and a.name in selection.section.extras:
                where = (*selection.path, a.name)
                message = f"has no effect: {reason}"
                issues.append(target.source.issue(where, message, "warning")
                              if target.source is not None
                              else ConfigIssue(".".join(map(str, where)), message,
                                               severity="warning"))
    return issues


def support_table() -> str:
    """The refused and no-effect settings as a Markdown table (the guide's
    docs/train-yaml.md shows it; a test keeps the two equal). Each message is shown with its
    example's value."""
    rows = ["| setting | for example | here | what mf-train says |", "|---|---|---|---|"]
    for path, field in FIELDS.items():
        for rule in field.rules:
            value = rule.example.get(path, "...")
            what = "refused" if rule.refuse else "no effect"
            example = ", ".join(f"{key.rsplit('.', 1)[-1]}: {json.dumps(item)}"
                                for key, item in rule.example.items())
            if rule.world_size > 1:
                example += f" ({rule.world_size} ranks)"
            if rule.config != "qwen3_tiny.yaml":
                example += f" in {rule.config}"
            if rule.device != "CPU":
                example += f" on {rule.device}"
            rows.append(f"| `{path}` | `{example}` | {what} | "
                        f"{rule.message.format(value=value)} |")
    for kind, name, key, reason in _no_effect_keys():
        rows.append(f"| `{key}` ({kind} {name}) | written | no effect | {reason} |")
    return "\n".join(rows)


def _no_effect_keys() -> list[tuple[str, str, str, str]]:
    """(kind, type, key, reason) of every component key marked `no_effect`, one type name
    per settings class."""
    found, classes = [], set()
    for kind in KINDS:
        for entry in installed_entry_points(kind):
            cls = entry.load()
            if cls in classes:
                continue
            classes.add(cls)
            found += [(KINDS[kind], entry.name, a.name, a.metadata["no_effect"])
                      for a in attrs.fields(cls) if a.metadata.get("no_effect")]
    return found
