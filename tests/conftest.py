"""What every test process shares: MindSpore set up as mf-train sets it up, once, before any
test runs a kernel; and the order of the files under pytest-xdist.

MindSpore fixes parts of its runtime the first time a kernel runs: `set_device` is refused
after that ("The runtime has been initialized"), and synchronous launch on the CPU backend
(`mindspore.runtime.launch_blocking`, which mf-train's trainer turns on) no longer takes
effect. A test module that ran kernels before a trainer started in the same process therefore
made that trainer fail, or run 10-20x slower (the tiny Qwen3's 6 steps: 35 s instead of 2 s).
So the device and the launch mode are set here, as the trainer sets them, whatever the order
of the test files.

The ranks the tests launch look for msrun's scheduler every second instead of MindSpore's
default of every 3-5 s (`MS_RETRY_INTERVAL_LOWER/UPPER`, inherited through msrun): a rank
that started before the scheduler listened, or registered after its first look, otherwise
waits out the longer interval; measured, a 2-rank job of the tiny model started 3-5 s sooner.

Under pytest-xdist (`nox -s tests` runs two workers with `--dist loadfile`: a file's tests in
one worker, so module fixtures run once) the files that launch msrun ranks are handed out
first: they take minutes each and the rest seconds, and handed out in path order the last rank
files would run on one worker while the other sat idle. A plain pytest run keeps path order.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MS_RETRY_INTERVAL_LOWER", "1")
os.environ.setdefault("MS_RETRY_INTERVAL_UPPER", "1")

try:
    import mindspore as ms
except ImportError:  # the tests that need MindSpore skip
    pass
else:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ms.runtime.launch_blocking()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    items.sort(key=lambda item: item.get_closest_marker("ranks") is None)  # stable
