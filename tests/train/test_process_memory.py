"""Host memory handling of a rank (`mf_train.observe.process_memory`)."""

from __future__ import annotations

import platform
import subprocess
import sys

import psutil
import pytest

from mf_train.observe.process_memory import cpu_pool_block, overcommit_mode

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_glibc_takes_the_fixed_mmap_threshold() -> None:
    """In a fresh process: glibc accepts the threshold (mallopt answers 0 for a parameter or
    value it refuses)."""
    script = ("from mf_train.observe.process_memory import map_large_allocations\n"
              "print(map_large_allocations())\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.split() == ["True"]


@pytest.mark.skipif(overcommit_mode() == 2,
                    reason="strict overcommit keeps MindSpore's pool defaults")
def test_cpu_pool_is_one_block_of_the_machines_memory() -> None:
    """In a fresh process: on CPU the pool is configured once, with one block as large as the
    machine's memory (a second call, as a second trainer in the process makes, leaves it);
    another backend leaves MindSpore's defaults."""
    script = ("from mindspore._c_expression import RuntimeConf\n"
              "from mf_train.observe.process_memory import one_block_cpu_pool\n"
              "print(one_block_cpu_pool('Ascend'), RuntimeConf.get_instance()"
              ".is_memory_configured())\n"
              "print(one_block_cpu_pool('CPU'), RuntimeConf.get_instance()"
              ".is_memory_configured())\n"
              "print(one_block_cpu_pool('CPU'))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=True)
    gib = psutil.virtual_memory().total // 2**30
    assert result.stdout.split() == ["None", "False", f"{gib}GB", "True", "None"]


def test_cpu_pool_block_follows_the_machine_and_its_overcommit_policy() -> None:
    assert cpu_pool_block(24 * 2**30, 0) == "24GB"
    assert cpu_pool_block(24 * 2**30 - 1, 1) == "23GB"  # whole GiB, rounded down
    assert cpu_pool_block(2**29, None) == "1GB"  # at least one
    assert cpu_pool_block(64 * 2**30, 2) is None  # strict: MindSpore's defaults
