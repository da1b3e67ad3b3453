"""Every value rule, its path and its message; types; open and closed sections; required parts."""

from __future__ import annotations

import pytest
from conftest import assert_only_problem, patched, problems, skeleton, valid, with_sections

from mf_config import ConfigError, LayerSpec, TrainConfig

# (dotted path to set, value, path of the error, fragments the message must contain)
SINGLE_ERRORS = [
    # types: bool is not an int, strings are never numbers, null only where admitted
    ("training.steps", True, "training.steps", "expected an integer, got True (a boolean)"),
    ("training.steps", "10", "training.steps", "expected an integer, got '10' (a string)"),
    ("training.steps", 10.0, "training.steps", "expected an integer, got 10.0 (a number)"),
    ("training.max_norm", "1.0", "training.max_norm", "expected a number, got '1.0'"),
    ("training.max_norm", True, "training.max_norm", "expected a number, got True"),
    ("training.max_norm", float("nan"), "training.max_norm", "expected a finite number"),
    ("training.deterministic", 1, "training.deterministic", "expected true or false, got 1"),
    ("training.deterministic", "yes please", "training.deterministic", "expected true or false"),
    ("checkpoint.save_path", None, "checkpoint.save_path", "expected a string, got null"),
    ("checkpoint.prefix", ["a"], "checkpoint.prefix", "expected a string, got a list"),
    ("optimizer.betas", "0.9", "optimizer.betas", "expected a list of numbers, got '0.9'"),
    ("optimizer.betas", [0.9, "x"], "optimizer.betas[1]", "expected a number, got 'x'"),
    ("optimizer.weight_decay_exclude", ["norm", 3], "optimizer.weight_decay_exclude[1]",
     "expected a string, got 3"),
    ("training", 5, "training", "expected a mapping of TrainingConfig fields, got 5"),
    ("monitor", None, "monitor", "got null (omit the section to use its defaults)"),
    ("callbacks", {"type": "X"}, "callbacks", "expected a list, got a mapping"),
    # closed sections
    ("training.stepz", 3, "training.stepz",
     "Unknown configuration keys for TrainingConfig: ['stepz']; did you mean 'steps'?"),
    ("monitor.moe_monitor.interval", 3, "monitor.moe_monitor.interval",
     "Unknown configuration keys for MoeMonitorConfig: ['interval']; allowed keys: "
     "save_tokens_per_expert_interval, target_layers"),
    ("monitr", {}, "monitr", "Unknown configuration keys for TrainConfig: ['monitr']; "
     "did you mean 'monitor'?"),
    ("train_dataset.shuffle", True, "train_dataset.shuffle", "Unknown configuration keys for "
     "TrainDatasetConfig: ['shuffle']"),
    # context
    ("context.mode", 0, "context.mode", "graph mode (0) is not supported"),
    ("context.mode", 2, "context.mode", "must be 1 (PyNative), got 2"),
    ("context.device_target", "cpu", "context.device_target",
     "must be one of 'auto', 'CPU', 'GPU', 'Ascend'; got 'cpu'"),
    ("context.max_device_memory", "59G", "context.max_device_memory", "such as \"59GB\""),
    # checkpoint
    ("checkpoint.save_max", 0, "checkpoint.save_max", "must be >= 1, got 0"),
    ("checkpoint.save_interleaved_steps", 0, "checkpoint.save_interleaved_steps", ">= 1"),
    ("checkpoint.load_worker_number", 0, "checkpoint.load_worker_number", ">= 1"),
    # training
    ("training.global_batch_size", 0, "training.global_batch_size", "must be positive, got 0"),
    ("training.local_batch_size", -1, "training.local_batch_size", "must be positive, got -1"),
    ("training.steps", 0, "training.steps", "must be positive"),
    ("training.max_norm", 0, "training.max_norm", "must be positive, got 0"),
    ("training.max_norm", -1.0, "training.max_norm", "must be positive, got -1.0"),
    ("training.seed", -1, "training.seed", "must be >= 0"),
    ("training.local_batch_size", 16, "training.local_batch_size",
     "local_batch_size (16) exceeds global_batch_size (8)"),
    ("training.max_consecutive_skipped_steps", -1, "training.max_consecutive_skipped_steps",
     ">= 0"),
    ("training.max_nonfinite_steps", 0, "training.max_nonfinite_steps", ">= 1"),
    ("training.rampup_batch_size", [2, 2], "training.rampup_batch_size",
     "[start_global_batch_size, increment, rampup_samples], got 2 values"),
    ("training.rampup_batch_size", [0, 2, 100], "training.rampup_batch_size[0]",
     "start_global_batch_size must be >= 1, got 0"),
    ("training.rampup_batch_size", [2, 0, 100], "training.rampup_batch_size[1]",
     "increment must be >= 1, got 0"),
    ("training.rampup_batch_size", [2, 2, -1], "training.rampup_batch_size[2]",
     "rampup_samples must be >= 0, got -1"),
    ("training.rampup_batch_size", [16, 2, 10], "training.rampup_batch_size[0]",
     "start_global_batch_size (16) exceeds global_batch_size (8)"),
    ("training.rampup_batch_size", [2, 4, 10], "training.rampup_batch_size[1]",
     "(6) is not a multiple of the increment (4)"),
    ("training.rampup_batch_size", [2, "2", 10], "training.rampup_batch_size[1]",
     "expected an integer"),
    # parallelism
    ("parallelism.tensor_parallel", 0, "parallelism.tensor_parallel", "must be >= 1, got 0"),
    ("parallelism.pipeline_parallel", -1, "parallelism.pipeline_parallel", ">= 1"),
    ("parallelism.context_parallel", 0, "parallelism.context_parallel", ">= 1"),
    ("parallelism.expert_parallel", 0, "parallelism.expert_parallel", ">= 1"),
    ("parallelism.data_parallel_shard", 0, "parallelism.data_parallel_shard",
     "must be -1 (shard over all data-parallel ranks) or >= 1, got 0"),
    ("parallelism.data_parallel_shard", -2, "parallelism.data_parallel_shard", "got -2"),
    ("parallelism.reshard_after_forward_policy", "sometimes",
     "parallelism.reshard_after_forward_policy", "'always', 'never', 'default'; got 'sometimes'"),
    ("parallelism.moe_token_dispatcher_type", "allgather",
     "parallelism.moe_token_dispatcher_type", "'alltoall', 'alltoall_deredundancy'"),
    ("parallelism.data_parallel_shard_strategy", "params",
     "parallelism.data_parallel_shard_strategy", "'optim', 'optim_grads', 'optim_grads_params'"),
    ("parallelism.pipeline_parallel_schedule", "zero_bubble",
     "parallelism.pipeline_parallel_schedule", "'gpipe', '1f1b', 'interleaved_1f1b'"),
    ("parallelism.context_parallel_method", "ring", "parallelism.context_parallel_method",
     "'colossal', 'ulysses', 'hybrid'"),
    ("parallelism.context_parallel_mask_type", "eod", "parallelism.context_parallel_mask_type",
     "'causal', 'full'"),
    ("parallelism.param_dtype", "fp32", "parallelism.param_dtype",
     "'float32', 'bfloat16', 'float16'"),
    ("parallelism.reduce_dtype", "int8", "parallelism.reduce_dtype", "'float32'"),
    ("parallelism.ulysses_degree_in_cp", 0, "parallelism.ulysses_degree_in_cp", ">= 1"),
    ("parallelism.pipeline_parallel_interleave_num", 2, "parallelism.pipeline_parallel_schedule",
     "pipeline_parallel_interleave_num 2 needs the 'interleaved_1f1b' schedule, got '1f1b'"),
    # optimizer and scheduler
    ("optimizer.betas", [0.9], "optimizer.betas", "must be two coefficients"),
    ("optimizer.betas", [0.9, 1.0], "optimizer.betas[1]", "must be in [0, 1), got 1.0"),
    ("optimizer.eps", 0, "optimizer.eps", "must be positive"),
    ("optimizer.weight_decay", -0.1, "optimizer.weight_decay", "must be >= 0"),
    ("lr_scheduler.learning_rate", -1e-5, "lr_scheduler.learning_rate", "must be >= 0"),
    # data
    ("train_dataset.dataloader.column_names", [], "train_dataset.dataloader.column_names",
     "must name at least one column"),
    ("train_dataset.dataloader.column_names", ["input_ids", "labels", "input_ids"],
     "train_dataset.dataloader.column_names[2]", "column 'input_ids' is listed twice"),
    ("train_dataset.num_parallel_workers", 0, "train_dataset.num_parallel_workers", ">= 1"),
    ("train_dataset.prefetch_size", 0, "train_dataset.prefetch_size", ">= 1"),
    ("train_dataset.dataloader.type", None, "train_dataset.dataloader.type",
     "a data loader type is required"),
    # model
    ("model.num_hidden_layers", "12", "model.num_hidden_layers",
     "must be an integer >= 1, got '12'"),
    ("model.num_hidden_layers", 0, "model.num_hidden_layers", ">= 1, got 0"),
    ("model.mtp_num_layers", -1, "model.mtp_num_layers", ">= 0, got -1"),
    # monitor
    ("monitor.moe_monitor.save_tokens_per_expert_interval", 0,
     "monitor.moe_monitor.save_tokens_per_expert_interval", "must be positive, got 0"),
    ("monitor.moe_monitor.target_layers", 0, "monitor.moe_monitor.target_layers",
     "an integer target_layers must be > 0, got 0"),
    ("monitor.moe_monitor.target_layers", [0, -1], "monitor.moe_monitor.target_layers[1]",
     "must be a layer id >= 0, got -1"),
    ("monitor.moe_monitor.target_layers", [0, 12], "monitor.moe_monitor.target_layers[1]",
     "layer 12 does not exist; the model has 12 layers"),
    ("monitor.moe_monitor.target_layers", "0-2", "monitor.moe_monitor.target_layers",
     "expected an integer or a list of integers or null, got '0-2'"),
    ("monitor.train_state.device_norm", 1, "monitor.train_state.device_norm",
     "expected true or false or a string or a list of strings, got 1"),
    ("monitor.health_checkpoint.global_norm_skip_threshold", 0,
     "monitor.health_checkpoint.global_norm_skip_threshold", "must be positive"),
    ("monitor.tensorboard.log_interval", 0, "monitor.tensorboard.log_interval", ">= 1"),
    # profiler (checked even while profiling is off)
    ("profiler.start_step", 0, "profiler.start_step", "must be positive, got 0"),
    ("profiler.end_step", -3, "profiler.end_step", "must be positive"),
    ("profiler.profiler_level", 3, "profiler.profiler_level", "must be one of 0, 1, 2; got 3"),
    ("profiler.profiler_rank", [0, -1], "profiler.profiler_rank[1]", "must be a rank >= 0"),
    # callbacks
    ("callbacks", [{"log_interval": 3}], "callbacks[0].type", "every callback needs a non-empty"),
    ("callbacks", [{"type": "A"}, {"type": ""}], "callbacks[1].type", "non-empty type"),
    ("callbacks", [{"type": 3}], "callbacks[0].type", "expected a string or null, got 3"),
]


@pytest.mark.parametrize(("path", "value", "error_path", "fragment"), SINGLE_ERRORS,
                         ids=[f"{case[0]}={case[1]!r}" for case in SINGLE_ERRORS])
def test_single_error(path: str, value: object, error_path: str, fragment: str) -> None:
    data = skeleton()
    if "." in path:
        data = patched(path, value, data)
    else:
        data[path] = value
    assert_only_problem(data, error_path, fragment)


def test_profiler_start_after_end_uses_the_anchors_words() -> None:
    data = patched("profiler", {"start_step": 5, "end_step": 3})
    assert_only_problem(data, "profiler.start_step", "start_step must be less than or equal to "
                        "end_step, but got 5 and 3")


def test_int_is_accepted_where_a_float_is_expected() -> None:
    config = valid(patched("training.max_norm", 2))
    assert config.training.max_norm == 2.0 and type(config.training.max_norm) is float


def test_null_where_the_type_admits_it() -> None:
    config = valid(patched("profiler.output_path", None))
    assert config.profiler.output_path is None


@pytest.mark.parametrize("section", ["model", "train_dataset", "training"])
def test_required_sections(section: str) -> None:
    assert_only_problem(with_sections(**{section: None}), section,
                        f"the {section} section is required")


def test_model_needs_a_type_or_architecture() -> None:
    data = with_sections(model={"hidden_size": 8})
    assert_only_problem(data, "model", "needs model_type or architectures")
    valid(with_sections(model={"architectures": "Qwen3ForCausalLM"}))


def test_lr_scheduler_can_be_omitted() -> None:
    config = valid(with_sections(lr_scheduler=None))
    assert config.lr_scheduler.type is None and config.lr_scheduler.learning_rate == 1e-5


def test_every_problem_is_reported_at_once() -> None:
    data = skeleton()
    data["training"] = {"steps": "10", "global_batch_size": 0, "stepz": 1}
    data["profiler"] = {"start_step": 5, "end_step": 3}
    data["recompute"] = {"mode": "select", "select_module": {"mlp": ["4-2"]}}
    data["callbacks"] = [{"type": ""}]
    data["bogus"] = 1
    assert sorted(path for path, _ in problems(data)) == sorted([
        "training.steps", "training.global_batch_size", "training.stepz", "profiler.start_step",
        'recompute.select_module["mlp"][0]', "callbacks[0].type", "bogus"])


# ---------------------------------------------------------------- open sections and extras


def test_extras_are_kept_readable_and_round_tripped() -> None:
    data = patched("model.rope_scaling", {"type": "yarn", "factor": 4.0, "nested": {"a": [1]}})
    config = valid(data)
    assert config.model.rope_scaling == {"type": "yarn", "factor": 4.0, "nested": {"a": [1]}}
    assert config.model["rope_scaling"]["factor"] == 4.0
    assert config.model["model_type"] == "deepseek_v3"
    assert "rope_scaling" in config.model and "nothing" not in config.model
    assert config.model.get("nothing", 7) == 7
    assert config.train_dataset.dataloader.sizes == [1000, 0, 0]
    assert config.lr_scheduler.warmup_ratio == 0
    again = TrainConfig.from_dict(config.to_dict())
    assert again == config
    assert again.to_dict()["model"]["rope_scaling"] == data["model"]["rope_scaling"]


def test_extras_do_not_alias_the_input() -> None:
    data = patched("model.rope_scaling", {"factor": 4.0})
    config = TrainConfig.from_dict(data)
    data["model"]["rope_scaling"]["factor"] = 1.0
    assert config.model.rope_scaling["factor"] == 4.0


def test_missing_extra_is_an_attribute_error_naming_it() -> None:
    config = valid(skeleton())
    with pytest.raises(AttributeError, match="ModelConfig has no field or extra key 'hiden'"):
        _ = config.model.hiden


# ---------------------------------------------------------------- parallelism combinations


def test_alltoall_deredundancy_needs_enough_experts() -> None:
    data = patched("parallelism.moe_token_dispatcher_type", "alltoall_deredundancy")
    assert_only_problem(data, "parallelism.expert_parallel",
                        "needs expert_parallel >= npu_nums_per_device, got 1 < 8")
    data["parallelism"].update(expert_parallel=8, npu_nums_per_device=8)
    data["model"]["n_routed_experts"] = 16
    valid(data)


def test_expert_parallel_divides_routed_experts() -> None:
    data = patched("model.n_routed_experts", 6)
    data["parallelism"]["expert_parallel"] = 4
    assert_only_problem(data, "parallelism.expert_parallel",
                        "must divide model.n_routed_experts (6), got 4")


def test_ulysses_degree_divides_context_parallel() -> None:
    data = patched("parallelism.context_parallel", 4)
    data["parallelism"]["ulysses_degree_in_cp"] = 3
    assert_only_problem(data, "parallelism.ulysses_degree_in_cp",
                        "must divide context_parallel (4), got 3")
    data["parallelism"]["ulysses_degree_in_cp"] = 2
    valid(data)


def test_hybrid_context_parallel_needs_ulysses_degree() -> None:
    data = patched("parallelism.context_parallel_method", "hybrid")
    assert_only_problem(data, "parallelism.ulysses_degree_in_cp", "is required when")


def test_sequence_parallel_false_with_tensor_parallel_is_a_warning() -> None:
    data = patched("parallelism.tensor_parallel", 2)
    assert problems(data, "warning") == []
    data["parallelism"]["sequence_parallel"] = False
    assert problems(data) == []
    (warning,) = problems(data, "warning")
    assert warning[0] == "parallelism.sequence_parallel"
    assert "always on with tensor_parallel > 1" in warning[1]
    with pytest.warns(UserWarning, match="sequence_parallel: False is ignored"):
        valid(data)


def test_a_global_batch_local_batches_do_not_divide_is_a_warning() -> None:
    """The spec: the global batch is rounded down to a multiple of data_parallel x
    local_batch_size, with no error; said at validation, whatever the data-parallel size."""
    data = patched("training.local_batch_size", 2, patched("training.global_batch_size", 3))
    assert problems(data) == []
    assert problems(data, "warning") == [(
        "training.global_batch_size",
        "3 is not a multiple of local_batch_size (2), so not of data_parallel x "
        "local_batch_size either: each step rounds it down to a multiple of that, 2 samples "
        "on one data-parallel rank; give a multiple of local_batch_size x data_parallel")]
    assert problems(patched("training.global_batch_size", 4, data), "warning") == []


@pytest.mark.parametrize(("layout", "interleave", "error"), [
    ([6, 6], 1, None),
    ("6, 6", 1, None),
    ("[3,3,3,3]", 2, None),
    ([6, 5], 1, "the stages hold 11 layers, but the model has 12"),
    ([4, 4, 4], 1, "one entry per stage and model chunk: pipeline_parallel (2) x "
                   "pipeline_parallel_interleave_num (1) = 2, got 3"),
    ([12, 0], 1, "every stage needs at least one layer, got 0"),
    ("six,six", 1, "must be a list of layer counts or a string such as"),
])
def test_pipeline_layers_per_stage(layout, interleave, error) -> None:
    data = patched("parallelism.pipeline_parallel", 2)
    data["parallelism"]["pipeline_parallel_layers_per_stage"] = layout
    data["parallelism"]["pipeline_parallel_interleave_num"] = interleave
    if interleave > 1:
        data["parallelism"]["pipeline_parallel_schedule"] = "interleaved_1f1b"
    if error is None:
        config = valid(data)
        assert sum(config.parallelism.layers_per_stage()) == 12
    else:
        found = problems(data)
        assert len(found) == 1 and found[0][0].startswith(
            "parallelism.pipeline_parallel_layers_per_stage"), found
        assert error in found[0][1]


def test_the_spec_parallelism_example_is_accepted() -> None:
    """The anchor rejects it (tensor_parallel 2 without sequence_parallel: True)."""
    data = patched("parallelism", {"tensor_parallel": 2, "pipeline_parallel": 2,
                                   "expert_parallel": 8, "npu_nums_per_device": 8,
                                   "moe_token_dispatcher_type": "alltoall_deredundancy"})
    assert valid(data).parallelism.sequence_parallel is False


# ---------------------------------------------------------------- recompute, comm, swap


def test_recompute_null_mode_says_to_write_none() -> None:
    message = assert_only_problem(patched("recompute.mode", None), "recompute.mode")
    assert "write the string \"None\"" in message


def test_recompute_mode_must_be_known() -> None:
    assert_only_problem(patched("recompute.mode", "full2"), "recompute.mode",
                        "must be one of 'None', 'full', 'select'; got 'full2'")


@pytest.mark.parametrize(("section", "path", "fragment"), [
    ({"mode": "full"}, "recompute.full_recompute_layer", "mode 'full' needs a non-empty list"),
    ({"mode": "full", "full_recompute_layer": []}, "recompute.full_recompute_layer",
     "mode 'full' needs"),
    ({"mode": "select"}, "recompute.select_module", "mode 'select' needs a mapping"),
    ({"mode": "select", "select_module": {"mlp": []}}, 'recompute.select_module["mlp"]',
     "must list at least one layer spec"),
    ({"mode": "full", "full_recompute_layer": ["0-3", "2"]}, "recompute.full_recompute_layer[1]",
     "'2' overlaps '0-3'"),
    ({"mode": "full", "full_recompute_layer": ["2-3", "0"]}, "recompute.full_recompute_layer[1]",
     "'0' comes before '2-3'"),
    ({"mode": "full", "full_recompute_layer": ["0-3", "3-5"]},
     "recompute.full_recompute_layer[1]", "'3-5' overlaps '0-3'"),
    ({"mode": "full", "full_recompute_layer": ["5", "1"]}, "recompute.full_recompute_layer[1]",
     "strictly ascending"),
    ({"mode": "full", "full_recompute_layer": ["10-12"]}, "recompute.full_recompute_layer[0]",
     "'10-12' names layer 12, but the model has 12 layers (valid layer ids are 0 to 11)"),
    ({"mode": "full", "full_recompute_layer": [-3]}, "recompute.full_recompute_layer[0]",
     "a layer number must be >= 0, got -3"),
    ({"mode": "full", "full_recompute_layer": ["0 to 3"]}, "recompute.full_recompute_layer[0]",
     "'0 to 3' is not a layer spec"),
    ({"mode": "select", "select_module": {"mlp": ["0", "4-2"]}},
     'recompute.select_module["mlp"][1]', "range start must be <= end, got '4-2'"),
    ({"mode": "select", "select_module": ["mlp"]}, "recompute.select_module",
     "expected a mapping or null, got a list"),
    ({"mode": "select", "select_module": {"mlp": "0-3"}}, 'recompute.select_module["mlp"]',
     "expected a list of layer specs"),
])
def test_recompute_problems(section, path, fragment) -> None:
    assert_only_problem(patched("recompute", section), path, fragment)


def test_layer_specs_are_parsed_and_count_mtp_layers() -> None:
    data = patched("recompute", {"mode": "full", "full_recompute_layer": [" 0-3 ", 5, "12"]})
    data["model"]["num_nextn_predict_layers"] = 1
    assert valid(data).recompute.full_recompute_layer == [
        LayerSpec(0, 3), LayerSpec(5, 5), LayerSpec(12, 12)]


def test_layer_specs_are_checked_without_a_layer_count_for_order_only() -> None:
    data = patched("recompute", {"mode": "full", "full_recompute_layer": ["0-99"]})
    del data["model"]["num_hidden_layers"]
    valid(data)


def test_recompute_lists_ignored_by_the_mode_are_warnings() -> None:
    data = patched("recompute", {"mode": "full", "full_recompute_layer": ["0"],
                                 "select_module": {"mlp": ["1"]}})
    assert problems(data) == []
    assert problems(data, "warning") == [
        ("recompute.select_module", "ignored because mode is 'full', not 'select'")]


def test_recompute_comm() -> None:
    assert_only_problem(patched("recompute_comm", {"enable": True}),
                        "recompute_comm.select_module", "enable: True needs a mapping")
    data = patched("recompute_comm", {"enable": True,
                                      "select_module": {"attention.qkv": ["0-3", "2"]}})
    assert_only_problem(data, 'recompute_comm.select_module["attention.qkv"][1]',
                        "'2' overlaps '0-3'")


@pytest.mark.parametrize(("section", "path", "fragment"), [
    ({"enable": True, "default_prefetch": 12, "layer_swap": [{"layers": ["0"]}]},
     "swap.default_prefetch", "must be in [1, 11] (num_layers - 1), got 12"),
    ({"enable": True, "default_prefetch": 0, "layer_swap": [{"layers": ["0"]}]},
     "swap.default_prefetch", "must be >= 1, got 0"),
    ({"enable": True}, "swap.enable", "neither layer_swap nor op_swap"),
    ({"enable": True, "layer_swap": [{}]}, "swap.layer_swap[0].layers",
     "must list at least one layer spec"),
    ({"enable": True, "layer_swap": [{"layers": ["0"], "layer": 1}]},
     "swap.layer_swap[0].layer", "Unknown configuration keys for LayerSwap: ['layer']"),
    ({"enable": True, "layer_swap": ["0-1"]}, "swap.layer_swap[0]",
     "expected a mapping of LayerSwap fields, got '0-1'"),
    ({"enable": True, "op_swap": [{"layers": ["0"]}]}, "swap.op_swap[0].op_name",
     "must name a module"),
    ({"enable": True, "op_swap": [{"op_name": "mlp", "layers": ["0", "0"]}]},
     "swap.op_swap[0].layers[1]", "'0' overlaps '0'"),
    ({"enable": False, "layer_swap": [{"layers": ["20"]}]}, "swap.layer_swap[0].layers[0]",
     "names layer 20"),
])
def test_swap_problems(section, path, fragment) -> None:
    assert_only_problem(patched("swap", section), path, fragment)


def test_swap_prefetch_range_is_checked_only_when_enabled() -> None:
    valid(patched("swap.default_prefetch", 40))


def test_swap_and_pipeline_parallelism_do_not_mix() -> None:
    data = patched("swap", {"enable": True, "layer_swap": [{"layers": ["0-1"]}]})
    data["parallelism"]["pipeline_parallel"] = 2
    assert_only_problem(data, "swap.enable", "swap cannot be combined with pipeline parallelism")


def test_a_one_layer_model_cannot_swap() -> None:
    data = patched("swap", {"enable": True, "layer_swap": [{"layers": ["0"]}]})
    data["model"]["num_hidden_layers"] = 1
    data["monitor"]["moe_monitor"]["target_layers"] = [0]
    assert_only_problem(data, "swap.default_prefetch", "a one-layer model has no layer")


def test_from_dict_raises_config_error_with_every_issue() -> None:
    data = patched("training.steps", 0)
    data["profiler"] = {"profiler_level": 7}
    with pytest.raises(ConfigError) as exc:
        TrainConfig.from_dict(data)
    assert sorted(issue.path for issue in exc.value.errors) == ["profiler.profiler_level",
                                                                 "training.steps"]
    assert isinstance(exc.value, ValueError)
    assert "2 problems in the configuration" in str(exc.value)


def test_num_layers_extra_key_is_readable_and_counts() -> None:
    data = with_sections(model={"model_type": "qwen3", "num_layers": 4})
    data["monitor"]["moe_monitor"]["target_layers"] = [0]
    data["recompute"] = {"mode": "full", "full_recompute_layer": ["4"]}
    config_problems = problems(data)
    assert config_problems == [("recompute.full_recompute_layer[0]",
                                "'4' names layer 4, but the model has 4 layers "
                                "(valid layer ids are 0 to 3)")]
    data["recompute"]["full_recompute_layer"] = ["3"]
    config = valid(data)
    assert config.model.num_layers == 4 and config.model.layer_count() == 4


def test_keys_that_are_not_strings_get_readable_paths() -> None:
    data = skeleton()
    data["training"][None] = 1
    data["model"][3] = "x"
    found = problems(data)
    assert ("training[None]", "Unknown configuration keys for TrainingConfig: [None]; allowed "
            "keys: steps, local_batch_size, global_batch_size, max_norm, seed, deterministic, "
            "rampup_batch_size, use_skip_step_on_nan, max_consecutive_skipped_steps, "
            "max_nonfinite_steps") in found
    assert ("model[3]", "mapping keys must be strings, got 3 (an integer)") in found


@pytest.mark.parametrize(("data", "kind"), [([], "a list"), (None, "NoneType"), ("x", "str")])
def test_from_dict_of_something_else_is_a_config_error(data, kind) -> None:
    with pytest.raises(ConfigError) as exc:
        TrainConfig.from_dict(data)
    (issue,) = exc.value.errors
    assert issue.message == f"the configuration must be a mapping of sections, got {kind}"
