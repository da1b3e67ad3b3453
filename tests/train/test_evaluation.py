"""The Evaluate callback: the validation loss is the model's loss on the next samples of the
valid split, it changes nothing of the training, a resumed run evaluates the samples the
uninterrupted one did, several ranks report the one-process value, and what cannot be
evaluated is said before launch."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from mindspore import Tensor
from runs import (
    DATA,
    QWEN3,
    QWEN3_2_LAYERS,
    arguments,
    saved_tensors,
    steps,
    train,
)

from mf_config import load_config
from mf_data.builder import build_datasets
from mf_train.checkpoint.layout import iteration_name
from mf_train.cli import run
from mf_train.evaluation import evaluation_issues
from mf_train.job import make_job_plan
from mf_train.layouts import SingleRank
from mf_train.models import build_model

VALID = (f"{DATA}split='9, 1, 0'", "train_dataset.dataloader.sizes=[4000, 40, 0]")
"""A valid split of 40 samples (a tenth of the documents) beside the training split."""
EVALUATE = "callbacks=[{type: Evaluate, interval: 2, iters: 2}]"
"""Evaluated after steps 2 and 4: each time 2 global batches of 4 samples (2 micro-batches of
2 per global batch in one process)."""


@pytest.fixture(scope="module")
def evaluated(runs) -> Path:
    return runs(QWEN3, *QWEN3_2_LAYERS, *VALID, EVALUATE)


@pytest.fixture(scope="module")
def plain(runs) -> Path:
    return runs(QWEN3, *QWEN3_2_LAYERS, *VALID)


def test_val_loss_is_the_models_loss_on_the_next_valid_samples(evaluated, data_prefix) -> None:
    """The model of each evaluated step's checkpoint, run on the valid samples read straight
    from mf-data's dataset: evaluation k reads samples 8k..8k+7, in micro-batches of 2."""
    config = load_config(QWEN3, [f"{DATA}data_path=['1','{data_prefix}']", *QWEN3_2_LAYERS,
                                 *VALID])
    valid = build_datasets(config.train_dataset.dataloader)[1]
    logged = {s["step"]: s for s in steps(evaluated)}
    assert [step for step, s in logged.items() if "val_loss" in s] == [2, 4]
    for k, step in enumerate((2, 4)):
        model = build_model(config.model)
        weights = saved_tensors(evaluated, step)
        for param in model.get_parameters():
            param.set_data(Tensor(weights[param.name]))
        losses = []
        for first in range(8 * k, 8 * k + 8, 2):
            samples = [valid[i] for i in (first, first + 1)]
            batch = [np.stack([s[name] for s in samples]) for name in
                     ("tokens", "labels", "loss_mask")]
            losses.append(float(model(Tensor(batch[0]), Tensor(batch[1]),
                                      Tensor(batch[2].astype(np.float32))).asnumpy()))
        assert logged[step]["val_loss"] == pytest.approx(np.mean(losses), rel=1e-6)
        assert logged[step]["val_ppl"] == pytest.approx(math.exp(logged[step]["val_loss"]),
                                                        rel=1e-6)


def test_evaluation_changes_nothing_of_the_training(evaluated, plain) -> None:
    """Losses, norms and every saved tensor (weights and optimizer state) bit for bit."""
    assert [(s["loss"], s["grad_norm"]) for s in steps(evaluated)] == \
        [(s["loss"], s["grad_norm"]) for s in steps(plain)]
    for step in (2, 4):
        for kind in ("model", "opt"):
            got, want = saved_tensors(evaluated, step, kind), saved_tensors(plain, step, kind)
            assert got.keys() == want.keys()
            assert all(np.array_equal(got[name], want[name]) for name in want), (step, kind)


def test_a_resumed_run_evaluates_the_samples_the_uninterrupted_one_did(
        evaluated, data_prefix, tmp_path) -> None:
    train(QWEN3, tmp_path, data_prefix, *QWEN3_2_LAYERS, *VALID, EVALUATE,
          f"checkpoint.load_path={evaluated / 'ckpt' / iteration_name(2)}")
    again = {s["step"]: s for s in steps(tmp_path)}
    assert sorted(again) == [3, 4]
    assert again[4]["val_loss"] == {s["step"]: s for s in steps(evaluated)}[4]["val_loss"]


def test_an_empty_valid_split_is_refused_in_one_line(data_prefix, tmp_path, capsys) -> None:
    status = run(arguments(QWEN3, tmp_path / "run", data_prefix, [*QWEN3_2_LAYERS, EVALUATE]))
    err = capsys.readouterr().err
    assert status != 0 and not (tmp_path / "run" / "metrics.jsonl").exists()
    lines = [line for line in err.splitlines() if "callbacks[0].type" in line]
    assert len(lines) == 1 and "valid split" in lines[0], err
    assert "Traceback" not in err


@pytest.mark.ranks
@pytest.mark.parametrize("layout", [
    pytest.param(("parallelism.data_parallel_shard_strategy=optim_grads_params",), id="fsdp"),
    pytest.param(("parallelism.pipeline_parallel=2",), id="pipeline")])
def test_two_ranks_evaluate_the_one_process_value(runs, evaluated, layout) -> None:
    two = steps(runs(QWEN3, *QWEN3_2_LAYERS, *VALID, EVALUATE, *layout, nproc=2))
    one = steps(evaluated)
    assert [s["step"] for s in two if "val_loss" in s] == [2, 4]
    assert [s.get("val_loss", 0.0) for s in two] == pytest.approx(
        [s.get("val_loss", 0.0) for s in one], rel=1e-5)
    assert [s["loss"] for s in two] == pytest.approx([s["loss"] for s in one], rel=1e-5)


def pre_launch_issues(data_prefix: str, *sets: str) -> list:
    config = load_config(QWEN3, [f"{DATA}data_path=['1','{data_prefix}']", *QWEN3_2_LAYERS,
                                 *sets])
    return evaluation_issues(config, make_job_plan(config, 1))


def test_a_valid_split_nothing_reads_is_a_warning(data_prefix) -> None:
    issues = pre_launch_issues(data_prefix, *VALID)
    assert [(i.path, i.severity) for i in issues] == [("train_dataset.dataloader.sizes",
                                                       "warning")]
    assert "Evaluate" in issues[0].message
    assert pre_launch_issues(data_prefix) == []  # the example's split: no valid samples


def test_a_layout_without_evaluation_refuses_evaluate(data_prefix, monkeypatch) -> None:
    assert pre_launch_issues(data_prefix, *VALID, EVALUATE) == []
    monkeypatch.setattr(SingleRank, "evaluates", False)
    issues = pre_launch_issues(data_prefix, *VALID, EVALUATE)
    assert [(i.path, i.severity) for i in issues] == [("callbacks[0].type", "error")]
    assert "SingleRank" in issues[0].message
