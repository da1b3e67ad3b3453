"""The peak FLOP/s that MFU divides by: rated, given, or measured once per machine.

* `--peak DEVICE` takes a device's rated dense peak from `RATED` for the run's compute dtype
  (`model.compute_dtype`; float32 on CPU, where nothing else is computed);
* `--peak TFLOPS` takes a number: one rank's peak in TFLOP/s;
* without `--peak`, the trainer measures a float32 matmul (`throughput.measure_peak_flops`),
  once per machine: the first measurement is kept in `CACHE_FILE` under the user's cache
  directory (`$XDG_CACHE_HOME`, else `~/.cache`), keyed by the device, the processor, the
  cores and the ranks this host runs (ranks sharing cores share them in the measurement as in
  training), so that two runs of one configuration report the same peak and MFU. Delete the
  file to measure again.

The start line and metrics.jsonl's start event (`peak_tflops`, `peak_source`) say which.

Pure Python but for the measurement, which imports MindSpore when called.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

from mf_config import TrainConfig
from mf_memory.model_shape import shape_of

from .throughput import PeakFlops

RATED: dict[str, dict[str, float]] = {
    # NVIDIA datasheets (dense tensor cores, no sparsity; float32 without TF32)
    "A100": {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5},
    "H100-SXM": {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0},
    "H100-NVL": {"bfloat16": 835.0, "float16": 835.0, "float32": 60.0},
    "H100-PCIe": {"bfloat16": 756.0, "float16": 756.0, "float32": 51.0},
    "H200": {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0},
    "L40S": {"bfloat16": 362.0, "float16": 362.0, "float32": 91.6},
    # Ascend: the cube units' bfloat16/float16 peak per device (one die of a 910C), as
    # Huawei's own MFU reporting uses; no rated float32 peak
    "Ascend910B1": {"bfloat16": 373.88, "float16": 373.88},
    "Ascend910B2": {"bfloat16": 353.89, "float16": 353.89},
    "Ascend910B3": {"bfloat16": 294.91, "float16": 294.91},
    "Ascend910B4": {"bfloat16": 245.76, "float16": 245.76},
    "Ascend910C": {"bfloat16": 353.89, "float16": 353.89},
}
"""Rated dense peaks, TFLOP/s per device (what one rank drives), by compute dtype."""

CACHE_FILE = "mf-train/peak_flops.json"
RANKS_ON_HOST = "MF_RANKS_ON_HOST"
"""The launcher's ranks on this host, which share its cores (1 without a launcher)."""


class PeakError(ValueError):
    """`--peak` names no rated device, or one without a peak for the compute dtype."""


def check_given(given: str) -> None:
    """Refuse a `--peak` value that `given_peak` could not use, in one line (any dtype)."""
    if _number(given) is None and _rated_name(given) is None:
        raise PeakError(f"--peak {given}: neither a number of TFLOP/s nor a rated device; "
                        f"rated: {', '.join(RATED)}")


def given_peak(given: str, dtype: str) -> PeakFlops:
    """The peak `--peak given` names for a run computing in `dtype`.

    Raises:
        PeakError: no such device, or no rated peak of it for `dtype`.
    """
    number = _number(given)
    if number is not None:
        return PeakFlops(number * 1e12, f"given: --peak {given} TFLOP/s per rank")
    name = _rated_name(given)
    if name is None:
        check_given(given)
    assert name is not None
    if dtype not in RATED[name]:
        raise PeakError(f"--peak {given}: {name} has no rated {dtype} peak here (rated: "
                        f"{', '.join(RATED[name])}); give a number of TFLOP/s instead")
    return PeakFlops(RATED[name][dtype] * 1e12,
                     f"rated: {name} dense {dtype}, {RATED[name][dtype]:g} TFLOP/s (--peak)")


def peak_dtype(config: TrainConfig, device: str) -> str:
    """The dtype a run's matmuls compute in: `model.compute_dtype`, float32 on CPU (the only
    one computed there) or for a model without a declared shape."""
    if device == "CPU":
        return "float32"
    try:
        return shape_of(config.model).compute_dtype
    except ValueError:  # EstimateError: no shape
        return "float32"


def cached_peak(device: str, measure: Callable[[], PeakFlops], *,
                write: bool) -> PeakFlops:
    """The measured peak of this machine: from the cache when it holds this machine's,
    else `measure()` now, kept in the cache when `write` (one rank per host writes). The
    source reads the same either way: `measured once on this machine (float32 1024x1024
    matmul on CPU, fastest of 5, 2026-12-07 18:40; cached in ~/.cache/mf-train/...)`."""
    key = machine_key(device)
    path = cache_path()
    entry = _read(path).get(key)
    if not (isinstance(entry, dict) and isinstance(entry.get("flops"), (int, float))):
        measured = measure()
        entry = {"flops": measured.flops, "source": measured.source,
                 "when": time.strftime("%Y-%m-%d %H:%M")}
        if write:
            _write(path, key, entry)
    return PeakFlops(float(entry["flops"]), f"measured once on this machine "
                     f"({entry.get('source')}, {entry.get('when')}; cached in {path})")


def machine_key(device: str) -> str:
    """What a measured peak depends on: the device, the processor, the cores, the ranks
    sharing them."""
    return (f"{device}|{_processor()}|{os.cpu_count()} cores|"
            f"{os.environ.get(RANKS_ON_HOST, '1')} ranks on the host")


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / CACHE_FILE


def _number(given: str) -> float | None:
    try:
        value = float(given)
    except ValueError:
        return None
    return value if value > 0 and value != float("inf") else None


def _rated_name(given: str) -> str | None:
    return next((name for name in RATED if name.casefold() == given.casefold()), None)


def _processor() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, key: str, entry: dict) -> None:
    """Add `key` to the cache (write a temporary file, then rename: readers never see half a
    file); a cache that cannot be written is left alone (the next run measures again)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read(path)
        data[key] = entry
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(temporary, path)
    except OSError:
        pass
