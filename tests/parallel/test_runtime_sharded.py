"""Sharded data parallel on real ranks equals plain data parallel; its per-rank state shrinks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from mf_parallel.launch import run_ranks

WORKER = Path(__file__).resolve().parent / "workers" / "sharded_worker.py"
STEPS = 4
pytestmark = pytest.mark.ranks


def run(tmp_path: Path, name: str, world: int, strategy: str, shard: int) -> list[dict]:
    out = tmp_path / name
    out.mkdir()
    run_ranks(WORKER, world, log_dir=out / "logs", timeout=300,
              args=[str(out), strategy, str(shard), str(STEPS)])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def assert_same_weights(a: dict, b: dict) -> None:
    for x, y in zip(a["weights"], b["weights"], strict=True):
        np.testing.assert_allclose(np.array(x), np.array(y), rtol=0, atol=1e-6)


def test_zero_1_and_2_on_two_ranks_equal_plain_data_parallel(tmp_path) -> None:
    plain = run(tmp_path, "plain", 2, "plain", -1)
    for strategy in ("optim", "optim_grads"):
        sharded = run(tmp_path, strategy, 2, strategy, -1)
        for rank in range(2):
            assert_same_weights(sharded[rank], plain[rank])
        held = sharded[0]["held"]
        count = sum(np.array(w).size for w in plain[0]["weights"])
        assert count == 16 * 33 + 33 + 33 * 8 + 8 == 833
        assert held["optimizer"] == 2 * 4 * 417  # two moments of a 417-float slice (833 / 2)
        assert held["grads"] == (4 * 417 if strategy == "optim_grads" else 4 * 833)


def test_hsdp_on_four_ranks_equals_plain_data_parallel(tmp_path) -> None:
    """replicate 2 x shard 2: slices over the shard group, sums over the replicate group."""
    plain = run(tmp_path, "plain4", 4, "plain", -1)
    hsdp = run(tmp_path, "hsdp", 4, "optim_grads", 2)
    assert [r["groups"]["shard"] for r in hsdp] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["groups"]["replicate"] for r in hsdp] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    for rank in range(4):
        assert_same_weights(hsdp[rank], plain[rank])
