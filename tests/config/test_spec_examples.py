"""Every YAML example of the spec loads: the skeleton as it is, each section example merged in."""

from __future__ import annotations

import copy

import pytest
from conftest import ROOT_SHARED_SPEC, SPEC, skeleton, spec_yaml_blocks, valid

from mf_config import LayerSpec, load_config
from mf_config.yaml_source import load_text

BLOCKS = spec_yaml_blocks()


def test_the_spec_has_the_examples_we_expect() -> None:
    assert len(BLOCKS) == 16
    sections = [next(iter(load_text(block).data)) for block in BLOCKS[1:]]
    assert sections == [
        "checkpoint", "training", "parallelism", "optimizer", "lr_scheduler", "train_dataset",
        "model", "monitor", "profiler", "recompute", "recompute", "recompute_comm", "swap",
        "swap", "callbacks",
    ]


def test_skeleton_loads_as_written(tmp_path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(BLOCKS[0], encoding="utf-8")
    config = load_config(path)
    assert config.training.global_batch_size == 8
    assert config.optimizer.eps == 1e-8 and isinstance(config.optimizer.eps, float)
    assert config.lr_scheduler.learning_rate == 1e-5
    assert config.lr_scheduler.warmup_ratio == 0
    assert config.model.model_type == "deepseek_v3"
    assert config.model.num_hidden_layers == 12
    assert config.train_dataset.dataloader.config["data_path"] == [
        "1", "/path/megatron_data_text_document"]
    assert config.monitor.moe_monitor.target_layers == [0, 1, 2]
    assert config.recompute.mode == "None"
    assert config.callbacks == []


@pytest.mark.parametrize("index", range(1, len(BLOCKS)))
def test_section_example_merged_into_skeleton(index: int) -> None:
    example = load_text(BLOCKS[index]).data
    data = skeleton()
    data.update(copy.deepcopy(example))
    config = valid(data)
    (name,) = example
    _assert_kept(config.to_dict()[name], example[name], name)


def _assert_kept(effective, written, where: str) -> None:
    """Every value the example wrote is in the effective config, unchanged."""
    if isinstance(written, dict):
        for key, value in written.items():
            assert key in effective, f"{where}.{key} missing"
            _assert_kept(effective[key], value, f"{where}.{key}")
    else:
        assert effective == written, (where, effective, written)


def test_recompute_examples_parse_layer_specs() -> None:
    full = load_text(BLOCKS[10]).data
    select = load_text(BLOCKS[11]).data
    assert valid({**skeleton(), **full}).recompute.full_recompute_layer == [LayerSpec(0, 3)]
    config = valid({**skeleton(), **select})
    assert config.recompute.select_module == {"attention": [LayerSpec(0, 1)],
                                              "mlp": [LayerSpec(2, 2)]}


def test_swap_examples() -> None:
    config = valid({**skeleton(), **load_text(BLOCKS[14]).data})
    assert [(op.op_name, op.layers) for op in config.swap.op_swap] == [
        ("attention", [LayerSpec(0, 0)]), ("mlp", [LayerSpec(1, 1)])]


def test_callback_example_keeps_extra_field() -> None:
    config = valid({**skeleton(), **load_text(BLOCKS[15]).data})
    assert config.callbacks[0].type == "MyCustomCallback"
    assert config.callbacks[0].log_interval == 10
    assert config.callbacks[0]["log_interval"] == 10


@pytest.mark.skipif(not ROOT_SHARED_SPEC.exists(), reason="../shared is not beside the checkout")
def test_spec_copy_is_current() -> None:
    assert SPEC.read_text(encoding="utf-8") == ROOT_SHARED_SPEC.read_text(encoding="utf-8")
