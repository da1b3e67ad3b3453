"""Reads of device tensors back to the host inside a training step (`mf_train.step.host_reads`):
counted by wrapping MindSpore's readers while the step is launched. The norm, the clip, the
skip decision, the monitors' norms and losses and the MoE routing stay on the device; a
DeepSeek-V3 MoE layer reads its chosen experts once per forward (each expert runs on a slice
of that length). The layouts on real ranks assert the same counts where they compare with one
process (runs.assert_same_run: every run of these tests counts, tests/train/conftest.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("mindspore")

import numpy as np
from mindspore import Tensor
from runs import DEEPSEEK, DEEPSEEK_3_LAYERS, QWEN3, SHORT, steps, train

from mf_train.step.host_reads import counted_reads

MONITORS = ("training.use_skip_step_on_nan=true", "monitor.train_state.local_loss=true",
            "monitor.train_state.device_loss=true", "monitor.train_state.local_norm=true",
            "monitor.train_state.device_norm=true")
"""The skip decision and every train_state value, beside the embedding health monitor (on by
default)."""


def test_the_counter_counts_each_read_once() -> None:
    values = Tensor(np.arange(3, dtype=np.float32))
    with counted_reads() as reads:
        values.asnumpy()
        float(values[1])
        values.tolist()
        np.asarray(values)
        bool(values[2] > 1)
        _ = values * 2  # no read
    assert reads.count == 5
    values.asnumpy()  # outside: not counted, and the methods are MindSpore's again
    assert reads.count == 5


def test_a_qwen3_step_reads_nothing_back(data_prefix, tmp_path) -> None:
    train(QWEN3, tmp_path, data_prefix, *SHORT, *MONITORS)
    records = steps(tmp_path)
    assert [record["host_reads"] for record in records] == [0, 0, 0, 0]
    assert records[0]["device_loss"] == pytest.approx(records[0]["loss"], rel=1e-6)
    assert records[0]["embedding_local_norm"] > 0  # read after the step


def test_a_deepseek_v3_step_reads_each_moe_layers_routing_once(data_prefix, tmp_path) -> None:
    """2 MoE layers x 2 micro-batches; the bias update and the balance loss read nothing."""
    train(DEEPSEEK, tmp_path, data_prefix, *DEEPSEEK_3_LAYERS, *MONITORS,
          "model.moe_router_bias_update_rate=0.01")
    assert [record["host_reads"] for record in steps(tmp_path)] == [4, 4, 4, 4]
