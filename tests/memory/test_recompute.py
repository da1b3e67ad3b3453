"""Recompute and communication recompute: bit-identical losses and gradients, marks exactly on
the named cells, and clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import Tensor, nn, ops

from mf_config import (
    ParallelismConfig,
    RecomputeCommConfig,
    RecomputeConfig,
    TrainingConfig,
)
from mf_memory.layers import ContractError
from mf_memory.recompute import (
    RecomputedComm,
    RecomputeError,
    apply_recompute,
    apply_recompute_comm,
    is_recomputed,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decoder_model import loss_and_grads, specs, tiny_model
from tp_model import TPModel, tp_grads

HERE = Path(__file__).resolve().parent

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")


@pytest.fixture(scope="module")
def reference() -> tuple[np.ndarray, list[np.ndarray]]:
    return loss_and_grads(tiny_model(num_layers=3))


CASES = {
    "full": RecomputeConfig(mode="full", full_recompute_layer=specs("0", "2")),
    "select attention": RecomputeConfig(mode="select", select_module={"attention": specs("0-2")}),
    "select mlp": RecomputeConfig(mode="select", select_module={"mlp": specs("1")}),
}
EXPECTED = {
    "full": ["layers[0]", "layers[2]"],
    "select attention": ["layers[0].attention", "layers[1].attention", "layers[2].attention"],
    "select mlp": ["layers[1].mlp"],
}


@pytest.mark.parametrize("case", CASES)
def test_recompute_is_bit_identical_and_lands_on_named_cells(case, reference) -> None:
    model = tiny_model(num_layers=3)
    assert apply_recompute(model, CASES[case]) == EXPECTED[case]
    marked = sorted(name for name, cell in model.cells_and_names() if is_recomputed(cell))
    expected = sorted(path.replace("layers[", "decoder_layers.").replace("]", "")
                      for path in EXPECTED[case])
    assert marked == expected
    value, grads = loss_and_grads(model)
    np.testing.assert_array_equal(value, reference[0])
    assert len(grads) == len(reference[1])
    for got, want in zip(grads, reference[1], strict=True):
        np.testing.assert_array_equal(got, want)


def test_mode_none_marks_nothing() -> None:
    model = tiny_model(num_layers=2)
    assert apply_recompute(model, RecomputeConfig()) == []
    assert not any(is_recomputed(cell) for _, cell in model.cells_and_names())


def test_applying_twice_is_refused() -> None:
    model = tiny_model(num_layers=2)
    apply_recompute(model, CASES["select mlp"])
    with pytest.raises(RecomputeError, match=r"layers\[1\].mlp is already recomputed"):
        apply_recompute(model, CASES["select mlp"])


def test_full_after_select_is_refused_and_marks_nothing() -> None:
    model = tiny_model(num_layers=2)
    apply_recompute(model, CASES["select mlp"])
    full = RecomputeConfig(mode="full", full_recompute_layer=specs("0-1"))
    with pytest.raises(RecomputeError, match=r"layers\[1\] contains 'mlp', which is recomputed"):
        apply_recompute(model, full)
    assert not is_recomputed(model.decoder_layers[0])  # checked before anything was marked


def test_module_and_its_part_in_one_config_is_refused() -> None:
    both = RecomputeConfig(mode="select", select_module={"attention": specs("0"),
                                                         "attention.qkv": specs("0")})
    with pytest.raises(RecomputeError, match=r"contains 'qkv', which is recomputed too"):
        apply_recompute(tiny_model(num_layers=1), both)


def test_unknown_module_and_out_of_range_layer() -> None:
    model = tiny_model(num_layers=2)
    bad_path = RecomputeConfig(mode="select", select_module={"mlp.up": specs("0")})
    with pytest.raises(ContractError, match=r"recompute.select_module\['mlp.up'\]: layer 0 "
                                            r"\(DecoderLayer\) has no sub-module 'mlp.up'.*"
                                            r"'gate_up', 'down'"):
        apply_recompute(model, bad_path)
    too_far = RecomputeConfig(mode="full", full_recompute_layer=specs("1-2"))
    with pytest.raises(ContractError, match=r"recompute.full_recompute_layer: '1-2' names layer 2"
                                            r", but this model has 2 decoder layers"):
        apply_recompute(model, too_far)


def test_model_without_decoder_layers() -> None:
    with pytest.raises(ContractError, match=r"has no `decoder_layers`"):
        apply_recompute(nn.Dense(2, 2), CASES["full"])


# --- communication recompute on mf-parallel's tensor-parallel layers, one process ----------

@pytest.fixture(scope="module")
def tensor_group():
    from mf_parallel import make_plan
    from mf_parallel.runtime import Collectives, init_communication
    from mf_parallel.runtime.tensor_parallel import TensorGroup

    plan = make_plan(ParallelismConfig(), TrainingConfig(global_batch_size=2,
                                                         local_batch_size=2), 1)
    return TensorGroup(Collectives(init_communication(plan, "CPU")), sequence_parallel=True)


class TwoCopies:
    """A stand-in tensor group of two ranks holding the same slice: all-gather doubles dim 0
    (a new tensor, so a recompute is visible), reduce-scatter sums the two halves."""

    size, rank, sequence_parallel = 1, 0, True

    def all_gather(self, x: Tensor) -> Tensor:
        return ops.cat((x, x))

    def reduce_scatter(self, x: Tensor) -> Tensor:
        half = x.shape[0] // 2
        return x[:half] + x[half:]

    def all_reduce(self, x: Tensor) -> Tensor:
        return x

    def shard(self, full: np.ndarray, axis: int) -> np.ndarray:
        return full

    @property
    def ops(self) -> TwoCopies:
        """What the regions call (`TensorGroup.ops`): these collectives."""
        return self


@pytest.mark.parametrize("group_kind", ["world of one", "two copies"])
@pytest.mark.parametrize("shape", [(4, 4), (4, 1, 4)], ids=["[s, h]", "[s, b, h]"])
def test_recompute_comm_wraps_the_gather_and_is_bit_identical(group_kind, tensor_group,
                                                              shape) -> None:
    """`[s, b, h]` as the models' activations: the linear saves the gather's output reshaped
    to rows, which must still be recognised."""
    group = tensor_group if group_kind == "world of one" else TwoCopies()
    reference = tp_grads(TPModel(group), shape)
    model = TPModel(group)
    config = RecomputeCommConfig(enable=True, select_module={"up": specs("1")})
    assert apply_recompute_comm(model, config) == ["layers[1].up.enter"]
    wrapped = [name for name, cell in model.cells_and_names() if isinstance(cell, RecomputedComm)]
    assert wrapped == ["decoder_layers.1.up.enter"]
    got = tp_grads(model, shape)
    for a, b in zip(got, reference, strict=True):
        np.testing.assert_array_equal(a, b)
    if group_kind == "two copies":  # a one-rank gather is the identity: nothing to drop
        # the gathered input was dropped in forward and gathered again once in backward
        assert model.decoder_layers[1].up.enter.recomputes == 1


def test_recompute_comm_path_without_comm_cell(tensor_group) -> None:
    model = TPModel(tensor_group)
    config = RecomputeCommConfig(enable=True, select_module={"down": specs("0")})
    with pytest.raises(RecomputeError, match=r"recompute_comm.select_module\['down'\]: "
                                             r"layers\[0\].down \(RowParallelLinear\) has no "
                                             r"gather/copy communication cell"):
        apply_recompute_comm(model, config)
    with pytest.raises(RecomputeError, match=r"has no gather/copy communication cell"):
        apply_recompute_comm(tiny_model(1), RecomputeCommConfig(
            enable=True, select_module={"attention.qkv": specs("0")}))


def test_recompute_comm_twice_and_disabled(tensor_group) -> None:
    model = TPModel(tensor_group)
    config = RecomputeCommConfig(enable=True, select_module={"up.enter": specs("0")})
    assert apply_recompute_comm(model, config) == ["layers[0].up.enter"]
    with pytest.raises(RecomputeError, match=r"layers\[0\].up.enter is already recomputed"):
        apply_recompute_comm(model, config)
    assert apply_recompute_comm(model, RecomputeCommConfig()) == []


# --- peak memory, one process per variant ------------------------------------------------

PEAK_SCRIPT = """
import sys
sys.path.insert(0, {here!r})
import numpy as np, mindspore as ms
ms.set_context(mode=ms.PYNATIVE_MODE); ms.set_device("CPU")
from mf_config import LayerSpec, RecomputeConfig
from mf_memory.recompute import apply_recompute
from decoder_model import DecoderModel, batch, loss

def status_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

model = DecoderModel(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=4,
                     num_heads=4, num_kv_heads=2, seq_length=256, seed=0)
if sys.argv[1] == "full":
    apply_recompute(model, RecomputeConfig(mode="full", full_recompute_layer=[LayerSpec(0, 3)]))
ids, labels = batch(model_seq=256, batch_size=8)
params = model.trainable_params()
step = ms.value_and_grad(lambda a, b: loss(model, a, b), None, params)
# The peak so far (imports) says nothing about the step: reset it (Linux >= 4.0), then compare
# the step's peak with the resident memory before it.
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")
before = status_kib("VmRSS")
value, grads = step(ids, labels)
print(status_kib("VmHWM") - before, float(value.asnumpy()))
"""


def peak_increase_kib(variant: str) -> tuple[int, float]:
    script = PEAK_SCRIPT.format(here=str(HERE))
    result = subprocess.run([sys.executable, "-c", script, variant], capture_output=True,
                            text=True, timeout=120, check=True, env=dict(os.environ))
    increase, value = result.stdout.split()[-2:]
    return int(increase), float(value)


@pytest.mark.slow
def test_full_recompute_lowers_peak_memory() -> None:
    none_kib, none_loss = peak_increase_kib("none")
    full_kib, full_loss = peak_increase_kib("full")
    assert full_loss == none_loss
    assert full_kib < 0.9 * none_kib, (full_kib, none_kib)  # measured 0.73


@pytest.mark.ranks
def test_recompute_comm_on_two_real_ranks(tmp_path) -> None:
    """The gather really communicates here: 2 msrun ranks, tensor parallel 2 with sequence
    parallelism; bit-identical gradients and one re-gather in backward on each rank."""
    import json

    from mf_parallel.launch import run_ranks

    worker = Path(__file__).resolve().parent / "workers" / "comm_recompute_worker.py"
    run_ranks(worker, 2, log_dir=tmp_path / "logs", timeout=300, args=[str(tmp_path)])
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank in ranks:
        assert rank["wrapped"] == ["layers[1].up.enter"]
        assert rank["identical"] is True
        assert rank["recomputes"] == 1
    # the ranks hold different weight slices: their gradients differ
    assert ranks[0]["grads"][0] != ranks[1]["grads"][0]
