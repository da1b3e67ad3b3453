"""mf-parallel's plan is pure Python: importing the package must not import MindSpore."""

from __future__ import annotations

import subprocess
import sys


def test_import_does_not_pull_in_mindspore_or_upper_packages() -> None:
    code = ("import sys, mf_parallel, mf_parallel.placement; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'mindspore', 'numpy', 'mf_memory', 'mf_data', 'mf_train'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60)
    assert result.stdout.strip() == "[]"
