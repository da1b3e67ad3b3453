"""The Evaluate callback: the validation loss is the model's loss on the next samples of the
valid split (the test loss, on the test split's first samples after the last step), it
changes nothing of the training, a resumed run evaluates the samples the uninterrupted one
did, every layout reports the one-process value (its runs are tests/train/matrix_runs.py's,
in the msrun jobs the compiled layouts' test shares), and what cannot be evaluated is said
before launch."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from matrix_runs import (
    COMPILED_EVALUATED,
    EVALUATE,
    EVALUATED,
    MATRIX,
    RESUMED,
    with_evaluate,
)
from mindspore import Tensor
from runs import (
    DATA,
    PREFIXES,
    QWEN3,
    QWEN3_2_LAYERS,
    ROOT,
    arguments,
    assert_same_pieces,
    saved_tensors,
    steps,
    train,
)
from session_files import session_directory, shared_directory

from mf_config import load_config
from mf_data.builder import build_datasets
from mf_train.checkpoint.layout import iteration_name
from mf_train.launch.cli import run
from mf_train.launch.summary import summary_lines
from mf_train.layouts import SingleRank
from mf_train.models import build_model
from mf_train.observe.evaluation import evaluation_issues
from mf_train.preflight.job import make_job_plan

VALID = (f"{DATA}split='9, 1, 0'", "train_dataset.dataloader.sizes=[4000, 40, 0]")
"""A valid split of 40 samples (a tenth of the documents) beside the training split."""

TESTED = EVALUATE.replace("iters: 1}", "iters: 1, test: true}")
"""`EVALUATE` with the test split evaluated after the last step."""


@pytest.fixture(scope="module")
def evaluated(matrix_runs) -> Path:
    """The 2-layer tiny Qwen3 on one process with Evaluate (matrix_runs.with_evaluate: after steps
    2 and 4, one global batch of 4 samples, 2 micro-batches of 2)."""
    return matrix_runs("single", "evaluated")


@pytest.fixture(scope="module")
def plain(matrix_runs) -> Path:
    """The same run without Evaluate."""
    return matrix_runs("single", "pynative")


def model_loss(config, output: Path, step: int, samples: list[dict]) -> float:
    """The mean loss of the model of `output`'s step-`step` checkpoint over `samples` in
    micro-batches of 2 (mf's model on one process, fed straight from mf-data's dataset)."""
    model = build_model(config.model)
    weights = saved_tensors(output, step)
    for param in model.get_parameters():
        param.set_data(Tensor(weights[param.name]))
    losses = []
    for first in range(0, len(samples), 2):
        batch = [np.stack([s[name] for s in samples[first:first + 2]]) for name in
                 ("tokens", "labels", "loss_mask")]
        losses.append(float(model(Tensor(batch[0]), Tensor(batch[1]),
                                  Tensor(batch[2].astype(np.float32))).asnumpy()))
    return float(np.mean(losses))


def test_val_loss_is_the_models_loss_on_the_next_valid_samples(evaluated, data_prefix) -> None:
    """The model of each evaluated step's checkpoint, run on the valid samples read straight
    from mf-data's dataset: evaluation k reads samples 4k..4k+3, in micro-batches of 2."""
    config = load_config(QWEN3, [*QWEN3_2_LAYERS, *with_evaluate(data_prefix)])
    valid = build_datasets(config.train_dataset.dataloader)[1]
    logged = {s["step"]: s for s in steps(evaluated)}
    assert [step for step, s in logged.items() if "val_loss" in s] == [2, 4]
    assert not any("test_loss" in s for s in logged.values())
    for k, step in enumerate((2, 4)):
        want = model_loss(config, evaluated, step, [valid[i] for i in range(4 * k, 4 * k + 4)])
        assert logged[step]["val_loss"] == pytest.approx(want, rel=1e-6)
        assert logged[step]["val_ppl"] == pytest.approx(math.exp(logged[step]["val_loss"]),
                                                        rel=1e-6)


@pytest.fixture(scope="session")
def held_out_prefix(tmp_path_factory) -> str:
    """The demo's held-out corpus (examples/data/make_corpus.py --valid: the docstrings of
    Python's built-ins) preprocessed: text the tiny corpus does not hold."""

    def make(directory: Path) -> None:
        directory.mkdir(parents=True)
        subprocess.run([sys.executable, str(ROOT / "examples" / "data" / "make_corpus.py"),
                        str(directory / "docs.jsonl"), "--valid",
                        str(directory / "held_out.jsonl")], check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "mf_data", "preprocess", "--input",
                        str(directory / "held_out.jsonl"), "--output-prefix",
                        str(directory / "held_out_text_document")], check=True,
                       capture_output=True)

    made = shared_directory(session_directory(tmp_path_factory) / "held_out", make)
    return str(made / "held_out_text_document")


def with_test_split(prefix: str, test_prefix: str) -> tuple[str, ...]:
    """`with_evaluate` and a test split of 24 samples of the corpus at `test_prefix`,
    evaluated after the last step (`test: true`)."""
    return (*with_evaluate(prefix), f"{DATA}test_data_path=['1','{test_prefix}']",
            "train_dataset.dataloader.sizes=[4000, 40, 24]", TESTED)


def test_the_test_split_is_evaluated_after_the_last_step(runs, evaluated, plain, data_prefix,
                                                         held_out_prefix) -> None:
    """test_loss on the last step only: the final model's loss on the test split's first
    global batch; the training and the validation losses as without it."""
    sets = (*QWEN3_2_LAYERS, *with_test_split(data_prefix, held_out_prefix))
    tested = runs(QWEN3, *sets)
    config = load_config(QWEN3, list(sets))
    test = build_datasets(config.train_dataset.dataloader)[2]
    logged = steps(tested)
    assert [s["step"] for s in logged if "test_loss" in s] == [4]
    want = model_loss(config, tested, 4, [test[i] for i in range(4)])
    assert logged[-1]["test_loss"] == pytest.approx(want, rel=1e-6)
    assert logged[-1]["test_ppl"] == pytest.approx(math.exp(want), rel=1e-6)
    assert [(s["loss"], s.get("val_loss")) for s in logged] == \
        [(s["loss"], s.get("val_loss")) for s in steps(evaluated)]
    assert [s["loss"] for s in logged] == [s["loss"] for s in steps(plain)]
    head = summary_lines(tested, tested / "ckpt", tested / "tensorboard", 1.0)[0]
    shown = re.search(r"; test_loss (\S+) \(test_ppl \S+, step 4\)", head)
    assert shown and float(shown[1]) == pytest.approx(want, abs=1e-6), head


def test_a_resumed_run_evaluates_the_samples_the_uninterrupted_one_did(
        evaluated, data_prefix, tmp_path) -> None:
    train(QWEN3, tmp_path, data_prefix, *QWEN3_2_LAYERS, *with_evaluate(data_prefix),
          f"checkpoint.load_path={evaluated / 'ckpt' / iteration_name(2)}")
    again = {s["step"]: s for s in steps(tmp_path)}
    assert sorted(again) == [3, 4]
    assert again[4]["val_loss"] == {s["step"]: s for s in steps(evaluated)}[4]["val_loss"]


@pytest.mark.parametrize(("with_data", "where", "split"), [
    (lambda prefix: (EVALUATE,), "callbacks[0].type", "the valid split"),
    (lambda prefix: (*with_evaluate(prefix), TESTED), "callbacks[0].test", "the test split")],
    ids=["valid", "test"])
def test_an_empty_split_is_refused_in_one_line(data_prefix, tmp_path, capsys, with_data,
                                               where: str, split: str) -> None:
    status = run(arguments(QWEN3, tmp_path / "run", data_prefix,
                           [*QWEN3_2_LAYERS, *with_data(data_prefix)]))
    err = capsys.readouterr().err
    assert status != 0 and not (tmp_path / "run" / "metrics.jsonl").exists()
    lines = [line for line in err.splitlines() if where in line]
    assert len(lines) == 1 and split in lines[0], err
    assert "Traceback" not in err


def assert_evaluated_like_one_process(matrix_runs, name: str, evaluated: str, plain: str
                                      ) -> None:
    """The `evaluated` run of layout `name` reports val_loss after steps 2 and 4 within 1e-5
    of one process's, and trains bit for bit as its `plain` run: losses, norms and every
    rank's saved pieces (weights and optimizer state)."""
    config, _, _, nproc = MATRIX[name]
    on, off = matrix_runs(name, evaluated), matrix_runs(name, plain)
    got, one = steps(on), steps(matrix_runs(name, "one evaluated"))
    assert [s["step"] for s in got if "val_loss" in s] == [2, 4]
    assert [s.get("val_loss", 0.0) for s in got] == pytest.approx(
        [s.get("val_loss", 0.0) for s in one], abs=1e-5)
    assert [(s["loss"], s["grad_norm"]) for s in got] == \
        [(s["loss"], s["grad_norm"]) for s in steps(off)]
    for step in (2, 4):
        assert_same_pieces(on, off, nproc, PREFIXES[config], rel=0, step=step)


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=[pytest.mark.ranks] if MATRIX[name][3] > 1 else [])
    for name in MATRIX if name in EVALUATED])
def test_every_layout_evaluates_the_one_process_value_and_trains_alike(matrix_runs,
                                                                      name) -> None:
    """val_loss within 1e-5 of one process's; the training losses, norms and every rank's
    saved pieces (weights and optimizer state) bit for bit those of the run without it."""
    assert_evaluated_like_one_process(matrix_runs, name, "evaluated", "pynative")


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=[pytest.mark.ranks] if MATRIX[name][3] > 1 else [])
    for name in MATRIX if name in COMPILED_EVALUATED])
def test_a_compiled_layout_evaluates_the_one_process_value_and_trains_alike(matrix_runs,
                                                                           name) -> None:
    """Under `context.compile` too: val_loss within 1e-5 of one process's (PyNative), and the
    training and saved pieces bit for bit those of the compiled run without `Evaluate`."""
    assert_evaluated_like_one_process(matrix_runs, name, "compiled evaluated", "compiled")


@pytest.mark.ranks
def test_a_resumed_layout_evaluates_the_samples_the_uninterrupted_one_did(matrix_runs) -> None:
    """Each rank's place in the valid split comes back from the checkpoint."""
    resumed, whole = matrix_runs(RESUMED, "resumed"), matrix_runs(RESUMED, "evaluated")
    again = {s["step"]: s for s in steps(resumed)}
    assert sorted(again) == [3, 4]
    assert again[4]["val_loss"] == {s["step"]: s for s in steps(whole)}[4]["val_loss"]


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


def test_a_test_split_nothing_reads_is_a_warning(data_prefix, held_out_prefix) -> None:
    tested = with_test_split(data_prefix, held_out_prefix)
    assert pre_launch_issues(data_prefix, *tested) == []
    issues = pre_launch_issues(data_prefix, *tested, EVALUATE)
    assert [(i.path, i.severity) for i in issues] == [
        ("train_dataset.dataloader.config.test_data_path", "warning")]
    assert "test: true" in issues[0].message
