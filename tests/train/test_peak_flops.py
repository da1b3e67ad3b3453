"""The peak MFU divides by: a rated device's for the compute dtype, a given number, or a
float32 matmul measured once per machine and kept in the user's cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mf_train.observe.peak_flops import (
    RANKS_ON_HOST,
    RATED,
    PeakError,
    cache_path,
    cached_peak,
    check_given,
    given_peak,
)
from mf_train.observe.throughput import PeakFlops


def test_a_rated_device_gives_its_peak_for_the_dtype() -> None:
    assert given_peak("a100", "bfloat16") == PeakFlops(
        312e12, "rated: A100 dense bfloat16, 312 TFLOP/s (--peak)")
    assert given_peak("Ascend910B2", "float16").flops == 353.89e12
    assert given_peak("H100-SXM", "float32").flops == 67e12
    assert given_peak("95.5", "bfloat16") == PeakFlops(
        95.5e12, "given: --peak 95.5 TFLOP/s per rank")
    with pytest.raises(PeakError) as refused:
        given_peak("Ascend910B2", "float32")
    assert str(refused.value) == ("--peak Ascend910B2: Ascend910B2 has no rated float32 peak "
                                  "here (rated: bfloat16, float16); give a number of TFLOP/s "
                                  "instead")
    for bad in ("X100", "0", "-3", "inf"):
        with pytest.raises(PeakError) as refused:
            check_given(bad)
        assert str(refused.value) == (f"--peak {bad}: neither a number of TFLOP/s nor a rated "
                                      f"device; rated: {', '.join(RATED)}")


def test_the_measured_peak_is_measured_once_per_machine(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(RANKS_ON_HOST, "1")
    measured: list[float] = []

    def measure() -> PeakFlops:
        measured.append(1.0e11 * (len(measured) + 1))  # a different value each time
        return PeakFlops(measured[-1], "float32 1024x1024 matmul on CPU, fastest of 5")

    first = cached_peak("CPU", measure, write=True)
    again = cached_peak("CPU", measure, write=True)
    assert measured == [1.0e11] and first == again and first.flops == 1.0e11
    assert first.source.startswith("measured once on this machine (float32 1024x1024 matmul "
                                   "on CPU, fastest of 5, ")
    assert first.source.endswith(f"; cached in {cache_path()})")
    assert cache_path() == tmp_path / "mf-train" / "peak_flops.json"
    monkeypatch.setenv(RANKS_ON_HOST, "2")  # two ranks share the cores: another peak
    assert cached_peak("CPU", measure, write=False).flops == 2.0e11
    assert cached_peak("CPU", measure, write=True).flops == 3.0e11  # unwritten: measured
    assert cached_peak("CPU", measure, write=True).flops == 3.0e11
    assert len(json.loads(cache_path().read_text())) == 2


def test_an_unknown_device_is_refused_before_anything_starts(capsys) -> None:
    from mf_train.launch.cli import run

    assert run(["--config", "unused.yaml", "--peak", "X100"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"mf-train: --peak X100: neither a number of TFLOP/s nor a rated device; rated: "
        f"{', '.join(RATED)}")


def test_a_given_peak_is_the_runs_mfu_peak(data_prefix, tmp_path: Path) -> None:
    pytest.importorskip("mindspore")
    from runs import QWEN3, QWEN3_2_LAYERS, arguments, steps

    from mf_train.launch.cli import run

    output = tmp_path / "out"
    sets = [*QWEN3_2_LAYERS, "training.steps=2", "checkpoint.enable_save=false"]
    assert run([*arguments(QWEN3, output, data_prefix, sets), "--peak", "A100"]) == 0
    events = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    start = events[0]
    assert start["peak_tflops"] == 19.5  # float32: what the CPU computes
    assert start["peak_source"] == "rated: A100 dense float32, 19.5 TFLOP/s (--peak)"
    for line in steps(output):
        assert line["mfu"] == pytest.approx(line["tflops"] / 19.5)
