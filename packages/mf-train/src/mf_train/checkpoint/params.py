"""Model parameters <-> the numpy arrays a checkpoint stores.

Checkpoints store bfloat16 parameters as float32. The widening is exact and narrowing it back
on load restores the same bits, so a round trip is bit-identical; the files stay readable by
any safetensors reader (numpy has no bfloat16, and MindSpore's numpy bfloat16 type exists only
once MindSpore is imported); the cost, twice the bytes for bf16 weights, is small beside the
optimizer file, whose float32 masters and moments are 3-4x the weights anyway.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import CheckpointError
from .pieces import Deferred

if TYPE_CHECKING:
    from mindspore import Parameter, Tensor

_MAX_LISTED = 20


def storable(name: str, array: np.ndarray, copy: bool) -> np.ndarray:
    """`array` as the checkpoint stores it: MindSpore's numpy bfloat16 widened to float32,
    other numeric dtypes kept; a private copy when `copy` (an asynchronous save must not see
    the training step change the array)."""
    array = np.asarray(array)
    if array.dtype.name == "bfloat16":
        return array.astype(np.float32)
    if array.dtype.kind not in "biuf":
        raise CheckpointError(f"{name}: cannot store dtype {array.dtype} (numbers and bools "
                              "only)")
    return np.array(array, copy=True) if copy else array


def model_arrays(named_params: Iterable[tuple[str, Parameter]]) -> dict[str, np.ndarray]:
    """Host copies of the parameters under their names (bfloat16 as float32)."""
    return {name: host_array(param) for name, param in named_params}


def host_array(param: Parameter | Tensor) -> np.ndarray:
    """A host copy of one parameter or tensor (bfloat16 as float32)."""
    import mindspore as ms  # on first use: the checkpoint package loads without MindSpore

    if param.dtype == ms.bfloat16:
        return param.astype(ms.float32).asnumpy().copy()
    return param.asnumpy().copy()


def deferred_host_array(tensor: Any) -> Deferred:
    """`host_array(tensor)` made when a checkpoint writer reaches it (float32 for bfloat16,
    the numpy dtype of every other dtype)."""
    return Deferred(_stored_dtype(tensor), functools.partial(host_array, tensor))


def deferred_host_range(flat: Any, start: int, stop: int) -> Deferred:
    """`host_array(flat[start:stop])` of a slice buffer (elements in row-major order: a
    2-D buffer is read flattened), made when the writer reaches it: a save holds one range's
    host copy at a time, not the whole buffer's."""
    return Deferred(_stored_dtype(flat), functools.partial(_host_range, flat, start, stop))


def _host_range(flat: Any, start: int, stop: int) -> np.ndarray:
    if flat.ndim == 1:
        return host_array(flat[start:stop])
    if (start, stop) == (0, flat.size):  # whole: a flattened view would be copied first
        return host_array(flat).reshape(-1)
    return host_array(flat.reshape(-1)[start:stop])


def _stored_dtype(tensor: Any) -> type:
    import mindspore as ms

    numpy_dtypes = {ms.bfloat16: np.float32, ms.float32: np.float32, ms.float16: np.float16,
                    ms.float64: np.float64, ms.int64: np.int64, ms.int32: np.int32,
                    ms.int16: np.int16, ms.int8: np.int8, ms.uint8: np.uint8,
                    ms.bool_: np.bool_}
    if tensor.dtype not in numpy_dtypes:
        raise CheckpointError(f"cannot store dtype {tensor.dtype} (numbers and bools only)")
    return numpy_dtypes[tensor.dtype]


def apply_model_params(named_params: Iterable[tuple[str, Parameter]],
                       arrays: Mapping[str, np.ndarray], where: str = "checkpoint") -> None:
    """Set every parameter from `arrays` (cast to the parameter's dtype). Checks first and
    changes nothing on a mismatch: `CheckpointError` names every missing, unexpected and
    mis-shaped key."""
    from mindspore import Tensor

    params = dict(named_params)
    problems = [f"{name}: missing (parameter of shape {tuple(params[name].shape)})"
                for name in params if name not in arrays]
    problems += [f"{name}: not a parameter of the model" for name in arrays if name not in params]
    problems += [f"{name}: shape {tuple(np.shape(arrays[name]))}, the model's is "
                 f"{tuple(param.shape)}"
                 for name, param in params.items()
                 if name in arrays and tuple(np.shape(arrays[name])) != tuple(param.shape)]
    if problems:
        listed = problems[:_MAX_LISTED]
        more = len(problems) - len(listed)
        tail = [f"... and {more} more"] if more else []
        raise CheckpointError(f"{where} does not fit the model ({len(problems)} problems):\n  "
                              + "\n  ".join(listed + tail))
    for name, param in params.items():
        param.set_data(Tensor(np.array(arrays[name], copy=True)).astype(param.dtype))
