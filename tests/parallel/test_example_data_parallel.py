"""The README's example script: the same losses alone and on 2 ranks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mindspore")

from mf_parallel.launch import run_ranks

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mindspore_data_parallel.py"
LOSS = re.compile(r"^step (\d+) loss ([0-9.]+)$", re.M)


@pytest.mark.ranks
def test_example_runs_alone_and_on_two_ranks_with_the_same_losses(tmp_path) -> None:
    alone = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                           timeout=300, check=True).stdout
    result = run_ranks(EXAMPLE, 2, log_dir=tmp_path, timeout=300)
    losses_alone = [float(v) for _, v in LOSS.findall(alone)]
    assert len(losses_alone) == 10 and losses_alone[-1] < losses_alone[0]
    for rank in (0, 1):
        text = result.worker_log(rank).read_text(errors="replace")
        losses = [float(v) for _, v in LOSS.findall(text)]
        assert losses == pytest.approx(losses_alone, abs=2e-6), rank
