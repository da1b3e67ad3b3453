"""The optimizer step: accumulation equals one big batch, clipping follows its formula,
non-finite or spiking norms skip the update."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import Tensor
from regression_model import Regression, batch

from mf_config import OptimizerConfig
from mf_train.layouts import MicroBatch, SingleRank
from mf_train.layouts.gradient_norm import OwnedNorm, clip_coefficient, update_kept
from mf_train.optim import build_optimizer
from mf_train.trainer import TrainStep

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")


def global_norm(grads: list[Tensor]) -> Tensor:
    """The norm every layout takes, on one process: every element owned, no all-reduce."""
    return OwnedNorm([True] * len(grads))(grads)


def make(max_norm: float = 1e9, skip: float | None = None) -> TrainStep:
    model = Regression()
    optimizer = build_optimizer(OptimizerConfig(weight_decay=0.0), [("w", model.w)])
    return TrainStep(SingleRank(model, optimizer), max_norm=max_norm, skip_threshold=skip)


def test_two_micro_batches_equal_one_batch_of_both() -> None:
    a, b = batch(1), batch(2)
    both = MicroBatch(np.concatenate([a.tokens, b.tokens]), np.concatenate([a.labels, b.labels]))
    split, whole = make(), make()
    out_split = split([a, b], lr=0.1)
    out_whole = whole([both], lr=0.1)
    assert out_split.loss == pytest.approx(out_whole.loss, rel=1e-6)
    assert out_split.grad_norm == pytest.approx(out_whole.grad_norm, rel=1e-6)
    np.testing.assert_allclose(split.layout.model.w.asnumpy(), whole.layout.model.w.asnumpy(),
                               rtol=1e-6)
    assert out_split.tokens == 16 and not out_split.skipped


def test_clipping_formula() -> None:
    grads = [Tensor(np.array([3.0, 4.0], np.float32)), Tensor(np.array([12.0], np.float32))]
    norm = global_norm(grads)
    assert norm.shape == () and float(norm.asnumpy()) == pytest.approx(13.0)
    assert float(clip_coefficient(norm, max_norm=1.0).asnumpy()) == \
        pytest.approx(1.0 / (13.0 + 1e-6), rel=1e-7)
    assert float(clip_coefficient(norm, max_norm=20.0).asnumpy()) == 1.0
    assert math.isnan(float(clip_coefficient(Tensor(math.nan, ms.float32), 1.0).asnumpy()))
    kept = [bool(update_kept(Tensor(value, ms.float32), 10.0).asnumpy())
            for value in (9.0, 10.0, 11.0, math.inf, math.nan)]
    assert kept == [True, True, False, False, False]


def test_the_norm_of_large_and_small_gradients_equals_numpy() -> None:
    """Large gradients are summed as the trace of a 32-row Gram matrix, others as one
    `[1, n] @ [n, 1]` product (sizes below 2**16 or not a multiple of 32)."""
    rng = np.random.default_rng(4)
    shapes = [(1024, 96), (2**16 + 1,), (333, 7), (64,), (2, 4096, 8)]
    grads = [rng.standard_normal(shape).astype(np.float32) * scale
             for shape, scale in zip(shapes, (1.0, 3.0, 0.5, 10.0, 1e-3), strict=True)]
    want = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
    got = float(global_norm([Tensor(g) for g in grads]).asnumpy())
    assert got == pytest.approx(want, rel=1e-6)
    for g in grads:  # each alone, so no path hides behind a larger one
        alone = float(global_norm([Tensor(g)]).asnumpy())
        assert alone == pytest.approx(float(np.linalg.norm(g.astype(np.float64))), rel=1e-6)


def test_clipped_step_moves_less() -> None:
    free, clip = make(), make(max_norm=1e-3)
    before = free.layout.model.w.asnumpy().copy()
    free([batch(3)], lr=0.1)
    clip([batch(3)], lr=0.1)
    # AdamW normalises the step size, so compare the first moments instead: clipped ones are
    # max_norm / norm times smaller
    m_free = free.layout.optimizer.state_dict()["adam_m.w"]
    m_clip = clip.layout.optimizer.state_dict()["adam_m.w"]
    ratio = np.abs(m_clip).sum() / np.abs(m_free).sum()
    outcome_norm = float(global_norm([Tensor(m_free / 0.1)]).asnumpy())  # (1 - beta1) = 0.1
    assert ratio == pytest.approx(1e-3 / outcome_norm, rel=1e-3)
    assert not np.array_equal(before, clip.layout.model.w.asnumpy())


def test_spike_and_nan_skip_the_update() -> None:
    step = make(skip=1e-3)
    before = step.layout.model.w.asnumpy().copy()
    outcome = step([batch(4)], lr=0.1)
    assert outcome.skipped and outcome.grad_norm > 1e-3
    np.testing.assert_array_equal(step.layout.model.w.asnumpy(), before)
    assert step.layout.optimizer.global_step == 0
    assert not any(value.any() for key, value in step.layout.optimizer.state_dict().items()
                   if key.startswith("adam_"))  # the moments untouched (still zero)
    nan = make(skip=1e9)
    nan.layout.model.w.set_data(Tensor(np.full((4, 3), np.nan, np.float32)))
    outcome = nan([batch(4)], lr=0.1)
    assert outcome.skipped and math.isnan(outcome.grad_norm)
