"""Sharded data parallelism (ZeRO-1, ZeRO-2, FSDP) in the estimate, against hand-computed bytes.

The tiny Qwen3 of test_estimate (h 24, a 4, g 2, d 6, f 40, V 50, untied head, float32) with
2 layers, on 4 ranks of a CPU job (S = 4, one micro-batch of 3 per rank). Its flat buffers, as
mf-parallel lays them out: each layer P_L = qkv 1152 + o 576 + norms 48 + q/k norms 12 +
gate/up 1920 + down 960 = 4668 elements, the root P_R = embedding 1200 + final norm 24 + head
1200 = 2424; this rank's slices n_L = 1167 and n_R = 606, N = 2 n_L + n_R = 2940. (A
vocabulary of 50 does not split over 4 ranks, so FSDP keeps its tables in the root unit;
`test_fsdp_keeps_the_vocabulary_tables_as_rows` takes V 48.)
"""

from __future__ import annotations

from typing import Any

import pytest
from test_estimate import PARAMS as PARAMS_ONE_LAYER
from test_estimate import config

from mf_memory.estimate import EstimateError, estimate, rank_summary
from mf_memory.runtime import CPU_RUNTIME

P_L, P_R = 4668, 2424
P = 2 * P_L + P_R
N_L, N_R = 1167, 606
N = 2 * N_L + N_R
LATE = 24 + 1200  # the root's parameters used after the layers: final norm, head


def on_ranks(strategy: str, layers: int = 2, ranks: int = 4, **changes: Any) -> Any:
    """The tiny model's estimate on `ranks` CPU ranks, sharded over all of them."""
    settings = {"model__num_hidden_layers": layers, "training__global_batch_size": 3 * ranks,
                "parallelism__data_parallel_shard_strategy": strategy,
                "context__device_target": "CPU", **changes}
    return estimate(config(**settings), world_size=ranks)


def test_zero_1_holds_whole_gradients_and_sliced_state() -> None:
    result = on_ranks("optim")
    assert (P, N) == (11_760, 2_940)
    assert result.params == 4 * P                   # whole parameters
    assert result.grads == 4 * P                    # whole gradients, reduced after backward
    assert result.optimizer == 12 * N               # moments 8 B, float32 master slice 4 B
    assert result.gathered_params == 0
    # reducing the whole gradients at first holds 4 P = 47,040 B; after backward the
    # gradient slices 4 N, then the all-gather of a layer's buffer (each tensor gathered
    # straight into the parameter's new copy, P_L), less
    assert 4 * N + 4 * P_L < 4 * P
    assert result.step == 4 * P == 47_040
    assert result.held_params == P
    assert result.total == result.backward_peak


def test_accumulating_micro_batches_holds_a_second_whole_gradient_under_zero_1_only() -> None:
    """With several micro-batches the running sum and a micro-batch's gradients are whole
    together (ZeRO-1, as replicated data parallelism); ZeRO-2 reduces each into its float32
    slices, so accumulation adds nothing there."""
    def grads(strategy: str, micro_batches: int) -> int:
        return on_ranks(strategy, training__local_batch_size=1,
                        training__global_batch_size=4 * micro_batches).grads

    assert (grads("optim", 1), grads("optim", 2)) == (4 * P, 2 * 4 * P)
    assert grads("optim_grads", 2) == grads("optim_grads", 1) < grads("optim", 1)


def test_zero_2_reduces_one_buffer_at_a_time_into_float32_slices() -> None:
    result = on_ranks("optim_grads")
    # float32 sums 4 N, the last layer's whole gradients beside the head's and final norm's
    # (kept until the root, reduced last, is complete), or at the end the root's
    assert result.grads == 4 * N + max(4 * (LATE + P_L), 4 * P_R) == 35_328
    assert (result.params, result.optimizer) == (4 * P, 12 * N)
    # the gradient slices 4 N and the all-gather of a layer's buffer into new copies P_L
    assert result.step == 4 * N + 4 * P_L == 30_432
    # with a reduce-scatter (not CPU) each buffer is flattened into a copy first
    device = on_ranks("optim_grads", context__device_target="auto")
    assert device.grads == 4 * N + max(4 * LATE + 2 * 4 * P_L, 2 * 4 * P_R) == 54_000
    # a tied head: the table's gradient from the head is held until the embedding's adds to it
    tied = on_ranks("optim_grads", model__tie_word_embeddings=True)
    n_tied = 2 * N_L + (1200 + 24) // 4
    assert tied.grads == 4 * n_tied + 4 * ((1200 + 24) + P_L)


def test_fsdp_holds_slices_and_gathers_a_unit_at_a_time() -> None:
    result = on_ranks("optim_grads_params")
    assert result.params == 4 * N                   # slices only
    assert result.grads == 35_328                   # as ZeRO-2
    assert result.optimizer == 8 * N                # the master is the slice itself
    # the root stays gathered; the `default` policy reshards layer 0 after forward and keeps
    # layer 1, so one layer at a time, each tensor gathered straight into its own memory
    assert result.gathered_params == 4 * (P_R + P_L)
    never = on_ranks("optim_grads_params", parallelism__reshard_after_forward_policy="never")
    assert never.gathered_params == 4 * (P_R + P_L + P_L)
    # no all-gather after the update: the gradient slices, then one buffer's clipped slice
    # and decayed master (the masters and moments are updated in place)
    assert result.step == 4 * N + 4 * N_L + 4 * N_L == 21_096
    assert result.held_params == N


def test_fsdp_keeps_the_vocabulary_tables_as_rows() -> None:
    """V 48 splits over 4 ranks: the embedding and the untied head are buffers of one table
    each (1152 elements, 288 per rank), never gathered, their gradients this rank's rows; the
    root is the final norm alone (24, 6 per rank)."""
    rows, root = 288, 24
    n = 2 * N_L + 2 * rows + root // 4
    result = on_ranks("optim_grads_params", model__vocab_size=48)
    assert result.params == 4 * n
    assert result.optimizer == 8 * n
    # the head's rows and the root are reduced as backward starts, so only a layer's whole
    # gradients are in flight
    assert result.grads == 4 * n + 4 * P_L
    # gathered: the root and one layer; no table
    assert result.gathered_params == 4 * (root + P_L)
    # tied: the table's rows hold the head's share of their gradient through the layers
    tied = on_ranks("optim_grads_params", model__vocab_size=48, model__tie_word_embeddings=True)
    n_tied = 2 * N_L + rows + root // 4
    assert tied.grads == 4 * n_tied + 4 * (rows + P_L)
    # tensor parallelism splits the vocabulary its own way: the tables stay in the root
    tp = on_ranks("optim_grads_params", model__vocab_size=48, ranks=8, model__seq_length=8,
                  parallelism__tensor_parallel=2)
    assert tp.gathered_params >= 4 * (2 * 48 * 24 // 2 + 24)  # the root gathered, tables too


def test_fsdp_state_is_one_process_s_divided_plus_the_buffers_in_flight() -> None:
    one = estimate(config(model__num_hidden_layers=2, context__device_target="CPU"),
                   world_size=1)
    in_flight = 4 * (LATE + P_L)
    four = on_ranks("optim_grads_params")
    assert (four.params + four.grads + four.optimizer
            == (one.params + one.grads + one.optimizer) // 4 + in_flight)
    # 8 ranks: each buffer padded to a multiple of 8 (4668 -> 584 per rank, 2424 -> 303)
    eight = on_ranks("optim_grads_params", ranks=8)
    assert eight.params + eight.grads + eight.optimizer == 16 * (2 * 584 + 303) + in_flight


def test_each_strategy_holds_less_than_the_one_before() -> None:
    totals = [on_ranks(strategy, layers=4).total
              for strategy in ("optim", "optim_grads", "optim_grads_params")]
    plain = estimate(config(model__num_hidden_layers=4, training__global_batch_size=12,
                            parallelism__data_parallel_shard=1,
                            context__device_target="CPU"), world_size=4).total
    assert plain > totals[0] > totals[1] > totals[2]


def test_16_bit_parameters_keep_float32_masters_beside_the_slices() -> None:
    bf16 = {"model__params_dtype": "bfloat16", "model__compute_dtype": "bfloat16"}
    zero = on_ranks("optim", **bf16)
    assert (zero.params, zero.optimizer) == (2 * P, N * (12 + 2))   # + the bfloat16 slices
    fsdp = on_ranks("optim_grads_params", **bf16)
    assert (fsdp.params, fsdp.optimizer) == (2 * N, N * (8 + 4))
    assert fsdp.grads == 4 * N + 2 * (LATE + P_L)   # sums in float32, whole ones in bfloat16


def test_the_optimizer_step_can_set_the_peak() -> None:
    # a large vocabulary and tiny activations: gathering the root buffer after the update
    # (ZeRO) holds more than the backward pass
    result = on_ranks("optim", model__vocab_size=5000, model__seq_length=2,
                      training__local_batch_size=1, training__global_batch_size=4)
    assert result.step_peak > result.backward_peak
    assert result.total == result.step_peak == (result.runtime + result.params + result.optimizer
                                                + result.step)


def test_pipeline_stages_accumulate_whole_gradients() -> None:
    result = estimate(config(model__num_hidden_layers=2, training__global_batch_size=12,
                             parallelism__pipeline_parallel=2,
                             parallelism__data_parallel_shard_strategy="optim_grads",
                             context__device_target="CPU"), world_size=4, stage=1)
    stage = P_L + 24 + 1200                         # layer 1, final norm, head
    # the pipeline's own backward: whole, the running sum and one micro-batch's
    assert result.grads == 2 * 4 * stage
    assert result.optimizer == 12 * (P_L // 2 + (24 + 1200) // 2)  # 2 data ranks: S = 2


def test_rank_summary() -> None:
    cfg = config(model__num_hidden_layers=2, training__global_batch_size=12,
                 context__device_target="CPU")   # FSDP over every rank by default
    assert rank_summary(cfg, 4, rank=3) == (P, N, estimate(cfg, 4).total)
    staged = config(model__num_hidden_layers=2, training__global_batch_size=6,
                    parallelism__pipeline_parallel=2)
    first, last = (rank_summary(staged, 2, rank=r) for r in (0, 1))
    assert (first.rank_params, last.rank_params) == (1200 + P_L, P_L + 24 + 1200)
    assert last.peak_bytes == estimate(staged, 2, stage=1).total
    assert rank_summary(staged, 2).peak_bytes == estimate(staged, 2).total
    with pytest.raises(EstimateError, match="rank 2 does not exist"):
        rank_summary(staged, 2, rank=2)


def test_replicated_data_parallel_updates_from_an_all_reduced_copy() -> None:
    """Replicated data parallelism sums the whole gradients into new tensors, a bucket at a
    time (each concatenated first): the update holds them beside the local ones (one process
    holds the local ones only)."""
    small = {"model__seq_length": 2, "training__local_batch_size": 1,
             "parallelism__data_parallel_shard": 1}
    four = on_ranks("optim", training__global_batch_size=4, **small)
    gate_up = 1920                                  # the largest tensor: its bucket's input
    assert four.step == 2 * 4 * P + 4 * gate_up
    assert four.total == four.step_peak == four.runtime + 4 * P + 8 * P + four.step
    one = on_ranks("optim", ranks=1, training__global_batch_size=1, **small)
    assert one.step == one.step_peak == 0 and one.grads == 4 * P


def test_the_framework_counts_in_the_budget_on_cpu_only() -> None:
    """On the CPU backend the framework's own memory (measured once) shares the process's
    memory with the tensors, on every rank."""
    device = estimate(config(), world_size=1)
    cpu = estimate(config(context__device_target="CPU"), world_size=1)
    assert device.runtime == device.runtime_built == 0
    assert (cpu.runtime_built, cpu.runtime) == CPU_RUNTIME
    assert cpu.total - device.total == CPU_RUNTIME.training
    assert on_ranks("optim").runtime == CPU_RUNTIME.training


def test_build_peak_is_the_share_plus_what_is_cut_late() -> None:
    """ZeRO builds whole parameters and sliced state; FSDP cuts each layer as it is built
    and the root unit once the model exists, so the root and one layer are whole at once."""
    zero = on_ranks("optim_grads")
    assert zero.build_peak == zero.runtime_built + 4 * P + 12 * N
    fsdp = on_ranks("optim_grads_params")
    assert 4 * (P_R + P_L) > 8 * N                    # here the whole root and layer weigh more
    assert fsdp.build_peak == fsdp.runtime_built + 4 * N + 4 * (P_R + P_L)


def test_a_tied_table_is_whole_three_times_at_the_end_of_backward() -> None:
    """The head's gradient, the embedding's dense one and their sum (V·h = 1200 each): two
    tables beside the one the whole gradients count, in one process as under ZeRO-1."""
    tied = estimate(config(model__tie_word_embeddings=True), world_size=1)
    assert tied.parameter_count == PARAMS_ONE_LAYER - 1200
    assert tied.grads == 4 * (PARAMS_ONE_LAYER - 1200) + 2 * 4 * 1200
    untied = estimate(config(), world_size=1)
    assert untied.grads == 4 * PARAMS_ONE_LAYER
