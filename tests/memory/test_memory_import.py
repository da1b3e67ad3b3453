"""mf-memory sits beside mf-data, never above it: importing it must not import mf-data."""

from __future__ import annotations

import subprocess
import sys


def test_import_does_not_pull_in_siblings_or_upper_packages() -> None:
    code = ("import sys, mf_memory; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in {'mf_data', 'mf_train'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60)
    assert result.stdout.strip() == "[]"
