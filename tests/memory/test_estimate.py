"""The memory estimator against hand-computed figures for a tiny decoder.

The tiny model (h 24, a 4, g 2, d 6, f 40, V 50, b 3, S 7: T = 21 tokens) was run once under
`mindspore.saved_tensors_hooks`; the tensors it saved for backward, per layer, in elements:
input norm x, x^2, x̂ 3 x 504 + rsqrt 21; qkv input 504; q norm 3 x 504 + 84; k norm 3 x 252 + 42;
rotated q 504; repeated k and v 504 each; probabilities 3 x 4 x 7 x 7 = 588; context 504;
post norm 3 x 504 + 21; MLP input 504; gate, silu, up, product 4 x 840. Sum 12,432.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mf_config import ConfigError, TrainConfig
from mf_memory.estimate import estimate, parse_memory
from mf_memory.model_shape import EstimateError, parameter_count, shape_of
from mf_parallel import PlanError

LAYER = 12_432  # elements one layer saves per micro-batch (see the module docstring)
ATTENTION_INTERNALS = 504 + (3 * 504 + 84) + (3 * 252 + 42) + 504 + 2 * 504 + 588 + 504
LAYER_INPUT = 21 * 24  # T_sp x h
OUTPUT = (3 * 504 + 21) + 504 + 3 * 21 * 50  # final norm, head input, logits/log-probs/probs
IDS = 21
WORKING_LOSS = 2 * 21 * 50  # gradients of the log-probabilities and logits
WORKING_ATTENTION = 2 * 588  # gradients of the probabilities and scores
PARAMS = 1200 + 1152 + 576 + 48 + 12 + 1920 + 960 + 24 + 1200  # one layer, untied

BASE: dict[str, Any] = {
    "model": {"model_type": "qwen3", "vocab_size": 50, "hidden_size": 24,
              "intermediate_size": 40, "num_hidden_layers": 1, "num_attention_heads": 4,
              "num_key_value_heads": 2, "seq_length": 7},
    "train_dataset": {"dataloader": {"type": "Mock"}},
    "training": {"local_batch_size": 3, "global_batch_size": 3},
}


def config(**changes: Any) -> TrainConfig:
    """BASE with `section__key=value` changes (model__num_hidden_layers=2)."""
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        section, key = path.split("__")
        data.setdefault(section, {})[key] = value
    return TrainConfig.from_dict(data)


def test_one_layer_matches_the_saved_tensors_and_parameters() -> None:
    result = estimate(config(), world_size=1)
    assert result.parameter_count == PARAMS == 7092
    assert [la.full for la in result.layer_activations] == [4 * LAYER]
    assert result.working == 4 * WORKING_LOSS
    assert result.activations == 4 * (LAYER + IDS + WORKING_LOSS)
    assert result.logits == 4 * OUTPUT
    assert (result.params, result.grads, result.optimizer) == (4 * PARAMS, 4 * PARAMS,
                                                               8 * PARAMS)
    assert result.total == 16 * PARAMS + 4 * (LAYER + IDS + WORKING_LOSS + OUTPUT)


def test_flash_attention_and_a_first_stage_change_the_working_memory() -> None:
    cfg = config(model__num_hidden_layers=2, parallelism__pipeline_parallel=2,
                 training__global_batch_size=6)
    assert estimate(cfg, world_size=2, stage=0).working == 4 * WORKING_ATTENTION
    flash = config(model__num_hidden_layers=2, parallelism__pipeline_parallel=2,
                   training__global_batch_size=6, model__use_flash_attention=True)
    assert estimate(flash, world_size=2, stage=0).working == 0


def test_parameter_count_matches_the_reference_decoder() -> None:
    pytest.importorskip("mindspore")
    decoder_model = pytest.importorskip("decoder_model")
    model = decoder_model.DecoderModel(vocab_size=50, hidden_size=24, intermediate_size=40,
                                       num_layers=3, num_heads=4, num_kv_heads=2,
                                       seq_length=7)
    actual = sum(p.size for p in model.trainable_params())
    shape = shape_of(config(model__num_hidden_layers=3).model)
    assert parameter_count(shape) == actual


def test_tensor_parallel_splits_matrices_and_keeps_norms() -> None:
    result = estimate(config(parallelism__tensor_parallel=2, model__seq_length=8), world_size=2)
    sharded = (1152 + 576 + 1920 + 960 + 1200 + 1200) // 2
    assert result.params == 4 * (sharded + 48 + 12 + 24)
    # T = 24, T_sp = 12: norms on 12 tokens; gathered linear inputs 24 x 24; 2 heads, 1 kv
    # head, f 20: q norm rows 48, k norm rows 24, q/k/v/context 288, probs 24 x 2 x 8
    layer = (2 * (3 * 288 + 12) + 2 * 576 + (3 * 288 + 48) + (3 * 144 + 24)
             + 4 * 288 + 384 + 4 * 24 * 20)
    assert layer == 7728
    assert [la.full for la in result.layer_activations] == [4 * layer]
    comm = estimate(config(parallelism__tensor_parallel=2, model__seq_length=8,
                           recompute_comm__enable=True,
                           recompute_comm__select_module={"attention.qkv": ["0"]}),
                    world_size=2)
    assert comm.layer_activations[0].full == 4 * (layer - 288)  # qkv input stays T_sp x h


def test_full_recompute_keeps_the_layer_input_and_rebuilds_one_layer() -> None:
    result = estimate(config(model__num_hidden_layers=2, recompute__mode="full",
                             recompute__full_recompute_layer=["0"]), world_size=1)
    assert [la.kept for la in result.layer_activations] == [4 * LAYER_INPUT, 4 * LAYER]
    assert result.transient == 4 * LAYER
    assert result.activations == 4 * (LAYER_INPUT + LAYER + IDS + LAYER + WORKING_LOSS)


def test_select_recompute_drops_the_module_internals() -> None:
    result = estimate(config(recompute__mode="select",
                             recompute__select_module={"attention": ["0"]}), world_size=1)
    kept = LAYER - ATTENTION_INTERNALS + LAYER_INPUT
    assert result.layer_activations[0].kept == 4 * kept
    assert result.transient == 4 * ATTENTION_INTERNALS
    mlp = estimate(config(recompute__mode="select", recompute__select_module={"mlp": ["0"]}),
                   world_size=1)
    assert mlp.layer_activations[0].kept == 4 * (LAYER - (504 + 4 * 840) + LAYER_INPUT)


def test_swap_offloads_layers_and_prefetches() -> None:
    result = estimate(config(model__num_hidden_layers=3, swap__enable=True,
                             swap__default_prefetch=2,
                             swap__layer_swap=[{"layers": ["0-1"]}]), world_size=1)
    assert [la.kept for la in result.layer_activations] == [0, 0, 4 * LAYER]
    assert result.transient == 2 * 4 * LAYER
    op = estimate(config(model__num_hidden_layers=2, swap__enable=True,
                         swap__op_swap=[{"op_name": "attention", "layers": ["0"]}]),
                  world_size=1)
    assert op.layer_activations[0].kept == 4 * (LAYER - ATTENTION_INTERNALS)


@pytest.mark.parametrize(("schedule", "split", "expected"), [
    ("1f1b", False, [2, 1]), ("gpipe", False, [4, 4]),
    ("1f1b", True, [2, 2]),  # ZB-H1: the last stage keeps one input for a later W
])
def test_pipeline_micro_batches_in_flight(schedule: str, split: bool,
                                          expected: list[int]) -> None:
    cfg = config(model__num_hidden_layers=4, parallelism__pipeline_parallel=2,
                 parallelism__pipeline_parallel_schedule=schedule,
                 parallelism__pipeline_parallel_enable_dxdw_split=split,
                 training__global_batch_size=12)
    first, last = (estimate(cfg, world_size=2, stage=s) for s in (0, 1))
    assert [first.in_flight, last.in_flight] == expected
    assert first.layers == (0, 1) and last.layers == (2, 3)
    # in-flight inputs (token ids, hidden states), then the one chunk a backward recomputes
    assert first.activations == expected[0] * 4 * IDS + 4 * (2 * LAYER + IDS) + \
        4 * WORKING_ATTENTION
    assert last.activations == expected[1] * 4 * LAYER_INPUT + 4 * 2 * LAYER + \
        4 * WORKING_LOSS
    assert (first.logits, last.logits) == (0, 4 * OUTPUT)
    assert first.params == 4 * (1200 + 2 * (PARAMS - 2 * 1200 - 24))  # embedding, 2 layers
    assert estimate(cfg, world_size=2).total == max(first.total, last.total)


def test_an_interleaved_stage_holds_one_chunk_at_a_time() -> None:
    cfg = config(model__num_hidden_layers=4, parallelism__pipeline_parallel=2,
                 parallelism__pipeline_parallel_schedule="interleaved_1f1b",
                 parallelism__pipeline_parallel_interleave_num=2,
                 training__global_batch_size=12)
    first = estimate(cfg, world_size=2, stage=0)
    # Megatron's warm-up: 2 (p - 1) + (v - 1) p = 4 forwards ahead, then one more in flight
    assert first.layers == (0, 2) and first.in_flight == 5
    assert first.activations == 5 * 4 * LAYER_INPUT + 4 * (LAYER + IDS) + first.working


def test_flash_attention_and_context_parallel() -> None:
    flash = estimate(config(model__use_flash_attention=True), world_size=1)
    assert flash.layer_activations[0].full == 4 * (LAYER - 588 - 2 * 504 + 2 * 252 + 84)
    cfg = config(model__seq_length=8, parallelism__context_parallel=2,
                 parallelism__context_parallel_mask_type="full")
    # T = 3 x 8 / 2 = 12 local tokens; probabilities 12 queries x 8 keys x 4 heads
    layer = (2 * (3 * 288 + 12) + 2 * 288 + (3 * 288 + 48) + (3 * 144 + 24)
             + 4 * 288 + 12 * 4 * 8 + 4 * 480)
    assert estimate(cfg, world_size=2).layer_activations[0].full == 4 * layer


def test_verdict() -> None:
    total = estimate(config(), world_size=1).total
    assert parse_memory("58GB") == 58 * 1024**3 and parse_memory("1024MB") == 1024**3
    fits = estimate(config(context__max_device_memory="1GB"), world_size=1)
    assert fits.fits is True and fits.headroom == 1024**3 - total
    tight = estimate(config(context__max_device_memory="0.0001GB"), world_size=1)
    assert tight.fits is False and tight.headroom == int(0.0001 * 1024**3) - total
    assert estimate(config(), world_size=1).fits is None


def test_errors_name_the_field() -> None:
    unknown = {"model_type": "mystery", "num_hidden_layers": 2, "seq_length": 8}
    with pytest.raises(EstimateError, match=r"no installed package declares the settings of "
                                            r"model type 'mystery', so its shape is unknown; "
                                            r"declared: .*qwen3"):
        estimate(TrainConfig.from_dict({**BASE, "model": unknown}), world_size=1)
    # the model's own settings are checked when the file is loaded, with their paths
    data = copy.deepcopy(BASE)
    del data["model"]["hidden_size"]
    with pytest.raises(ConfigError, match=r"model\.hidden_size: required"):
        TrainConfig.from_dict(data)
    with pytest.raises(ConfigError, match=r"model\.num_key_value_heads: 2 is not divisible by "
                                          r"parallelism\.tensor_parallel \(4\)"):
        config(parallelism__tensor_parallel=4, model__seq_length=8)
    with pytest.raises(PlanError, match="not divisible"):
        estimate(config(parallelism__tensor_parallel=2, model__seq_length=8), world_size=3)
    with pytest.raises(EstimateError, match=r"parse|size"):
        parse_memory("lots")


def test_bfloat16_adds_a_master_copy() -> None:
    computed = estimate(config(model__compute_dtype="bfloat16"), world_size=1)
    assert (computed.params, computed.optimizer) == (4 * PARAMS, 8 * PARAMS)  # float32 kept
    assert computed.layer_activations[0].full == 2 * LAYER
    result = estimate(config(model__compute_dtype="bfloat16", model__params_dtype="bfloat16"),
                      world_size=1)
    assert (result.params, result.optimizer) == (2 * PARAMS, 12 * PARAMS)
    assert result.layer_activations[0].full == 2 * LAYER
