"""Checkpoint files get the permissions of any file the process creates (0666 less the umask),
as `torch.save` and `open()` give them: a group that may read the run's directory may read its
checkpoints. safetensors alone would leave its files 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from checkpoint_samples import config, save

from mf_train.checkpoint import CheckpointManager


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_checkpoint_files_respect_the_umask(tmp_path, umask) -> None:
    old = os.umask(umask)
    try:
        save(CheckpointManager(config(tmp_path / "ckpt", prefix="qwen3")), 2)
        with open(tmp_path / "reference", "wb"):  # what torch.save's open() gives
            pass
    finally:
        os.umask(old)
    expected = _mode(tmp_path / "reference")
    assert expected == 0o666 & ~umask
    files = sorted(path for path in (tmp_path / "ckpt").rglob("*") if path.is_file())
    assert {path.name for path in files} == {
        "latest_checkpointed_iteration.txt", "common.json",
        "qwen3-model-0000000-0000001.safetensors", "qwen3-opt-0000000-0000001.safetensors",
        "qwen3-rng-0000000-0000001.json", "qwen3-sums-0000000-0000001.json"}
    assert {path.name: oct(_mode(path)) for path in files} == {
        path.name: oct(expected) for path in files}
