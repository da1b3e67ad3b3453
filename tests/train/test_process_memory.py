"""Host memory handling of a rank (`mf_train.process_memory`)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_glibc_takes_the_fixed_mmap_threshold() -> None:
    """In a fresh process: glibc accepts the threshold (mallopt answers 0 for a parameter or
    value it refuses)."""
    script = ("from mf_train.process_memory import map_large_allocations\n"
              "print(map_large_allocations())\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.split() == ["True"]
