"""mf-data needs MindSpore only in its optional adapter: importing the package must not."""

from __future__ import annotations

import subprocess
import sys


def test_import_does_not_pull_in_mindspore_or_siblings() -> None:
    code = ("import sys, mf_data; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'mindspore', 'mf_memory', 'mf_train'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60)
    assert result.stdout.strip() == "[]"


def test_public_names_load_on_first_use() -> None:
    code = ("import sys, mf_data; light = 'numpy' not in sys.modules; "
            "from mf_data import build_datasets, BatchLoader, GPTDataset; "
            "print(light, build_datasets.__module__, BatchLoader.__module__)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60)
    assert result.stdout.split() == ["True", "mf_data.builder", "mf_data.loader"]
