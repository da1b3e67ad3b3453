"""A run resuming a checkpoint compares its configuration with the one saved beside it:
another model is refused before anything is built, listing every difference; other changes
are listed in one warning, the learning-rate schedule stretched by a new step count said so;
the same configuration resumes without a word about it. A resume from an earlier step than
metrics.jsonl records marks the records it supersedes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("mindspore")

from runs import QWEN3, QWEN3_2_LAYERS, arguments, steps

from mf_train.launch.cli import run
from mf_train.monitor.metrics import read_steps


@pytest.fixture
def finished(runs, tmp_path) -> Path:
    """A copy of the 2-layer tiny Qwen3's finished 4-step run, its checkpoints inside."""
    copy = tmp_path / "run"
    shutil.copytree(runs(QWEN3, *QWEN3_2_LAYERS), copy)
    return copy


def again(output: Path, prefix: str, *sets: str) -> list[str]:
    return arguments(QWEN3, output, prefix, [*QWEN3_2_LAYERS, *sets])


def test_another_model_is_refused_with_every_difference(data_prefix, finished,
                                                        capsys) -> None:
    capsys.readouterr()
    assert run(again(finished, data_prefix, "model.intermediate_size=96",
                     "model.rms_norm_eps=0.001")) == 2
    err = capsys.readouterr().err
    saved = finished / "ckpt" / "iteration_00000004"
    assert err.splitlines()[-1] == (
                   f"mf-train: {saved} was saved by a run with another model; a resumed run "
                   "cannot change it (model.intermediate_size: 64 -> 96; model.rms_norm_eps: "
                   "1e-06 -> 0.001): resume with the saved model settings "
                   f"({saved}/config.yaml has them), or start a new run")
    assert len(steps(finished)) == 4


def test_other_changes_are_listed_and_applied(data_prefix, finished, capsys) -> None:
    capsys.readouterr()
    assert run(again(finished, data_prefix, "training.steps=6",
                     "monitor.tensorboard.log_interval=2")) == 0
    err = capsys.readouterr().err
    assert (f"mf-train: resuming {finished / 'ckpt' / 'iteration_00000004'} at step 4 with "
            "settings changed from the run that saved it, applied from here: "
            "monitor.tensorboard.log_interval: 1 -> 2; training.steps: 4 -> 6 (the "
            "learning-rate schedule follows training.steps: it is now 6 steps long, so the "
            "rates from step 5 on differ from the saved run's)\n") in err
    assert [s["step"] for s in steps(finished)] == [1, 2, 3, 4, 5, 6]


def test_the_same_configuration_resumes_without_a_list(data_prefix, finished,
                                                       capsys) -> None:
    capsys.readouterr()
    assert run(again(finished, data_prefix, "training.steps=5")) == 0
    assert "changed from the run that saved it" in capsys.readouterr().err
    capsys.readouterr()
    assert run(again(finished, data_prefix, "training.steps=5")) == 0
    assert "changed from the run that saved it" not in capsys.readouterr().err


def test_a_resume_from_an_earlier_step_supersedes_the_later_records(data_prefix, finished,
                                                                    ) -> None:
    """The newest checkpoint gone (damaged, say), the same command resumes from step 2 and
    logs steps 3-4 again: a `rewind` event marks the records it supersedes, and
    `read_steps` gives one record per step, the later ones."""
    ckpt = finished / "ckpt"
    shutil.rmtree(ckpt / "iteration_00000004")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    assert run(again(finished, data_prefix)) == 0
    lines = [json.loads(line) for line in (finished / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "event" not in line] == [1, 2, 3, 4, 3, 4]
    rewind = [line for line in lines if line.get("event") == "rewind"]
    assert [(line["step"], line["superseded"]) for line in rewind] == [(2, [3, 4])]
    records = read_steps(finished / "metrics.jsonl")
    assert [record["step"] for record in records] == [1, 2, 3, 4]
    assert records[2]["time"] > rewind[0]["time"] and records[3]["time"] > rewind[0]["time"]
    assert records[2]["loss"] == steps(finished)[4]["loss"]  # the replayed step 3
