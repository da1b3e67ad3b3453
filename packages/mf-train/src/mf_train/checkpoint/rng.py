"""Capture and restore every random generator a training process draws from, so a resumed
run continues bit-identically.

Covered: Python's `random`, numpy's global generator (`np.random.get_state`, which the legacy
`np.random.*` functions and `mindspore.set_seed` use), and MindSpore's global seed
(`ms.get_seed`) and default generator (`ms.get_rng_state`: seed and offset, 16 bytes, which
the generator-based `mint` random ops advance). Not covered, because MindSpore does not expose
it: the per-primitive state of legacy random ops such as `ops.rand` or `ops.dropout` (the only
random ops with CPU kernels in MindSpore 2.10). mf's models draw no random numbers while
training, so this affects only user code that does.

The state is plain JSON (lists of ints), stored per rank. MindSpore is imported on first use,
so the checkpoint package itself loads without it (fast tools and crash-test workers).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from .errors import CheckpointError

_KEYS = ("python", "numpy", "mindspore")


def capture_rng_state() -> dict[str, Any]:
    """This process's generator states, as JSON-serialisable data."""
    import mindspore as ms

    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
        "numpy": {"bit_generator": name, "keys": keys.tolist(), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "mindspore": {"seed": ms.get_seed(),
                      "generator": ms.get_rng_state().asnumpy().tolist()},
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what `capture_rng_state` returned (`CheckpointError` if it is malformed)."""
    import mindspore as ms

    missing = [key for key in _KEYS if key not in state]
    if missing:
        raise CheckpointError(f"RNG state lacks {', '.join(missing)} (expected {_KEYS})")
    try:
        python, numpy_state, mindspore = (state[key] for key in _KEYS)
        random.setstate((python["version"], tuple(python["state"]), python["gauss_next"]))
        np.random.set_state((numpy_state["bit_generator"],
                             np.asarray(numpy_state["keys"], dtype=np.uint32),
                             numpy_state["pos"], numpy_state["has_gauss"],
                             numpy_state["cached_gaussian"]))
        if mindspore["seed"] is not None and mindspore["seed"] != ms.get_seed():
            _set_mindspore_seed(int(mindspore["seed"]))
        ms.set_rng_state(ms.Tensor(np.asarray(mindspore["generator"], dtype=np.uint8)))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"RNG state is malformed: {exc!r}") from None


def _set_mindspore_seed(seed: int) -> None:
    """Restore `ms.get_seed()` (only needed when the resumed run seeded differently) without
    `ms.set_seed`'s side effect of reseeding numpy, whose state was just restored."""
    import mindspore as ms

    numpy_state = np.random.get_state()
    ms.set_seed(seed)
    np.random.set_state(numpy_state)
