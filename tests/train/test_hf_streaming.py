"""Hugging Face checkpoints read tensor by tensor and slice by slice (`HFCheckpoint`): each
region equals the whole tensor's slice (bfloat16, float16, float32, int64 and FP8 against
independent decodings), a tensor rank reads exactly its share of the bytes and gets the
values of the fuse-then-split reference, a pipeline stage reads none of the other stages'
weights, and a checkpoint that does not fit is refused before any byte is read."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from fp8_samples import e4m3fn_reference, random_fp8, write_fp8_config
from qwen3_parts import PARTS, qwen3_model
from safetensors_files import write_safetensors_by_hand
from tensor_groups import tensor_group

from mf_train.checkpoint import CheckpointError, HFCheckpoint, load_hf_weights
from mf_train.checkpoint.hf_write import bfloat16_bits
from mf_train.models import HFWeightsError, hf_state, load_hf_state
from mf_train.models.blocks import fuse_rows
from mf_train.models.hf_weights import HFPieces, local_value


def bf16_file(path: Path, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`state` written as bfloat16 (rounded); returns the exact float32 values it holds."""
    bits = {name: bfloat16_bits(value) for name, value in state.items()}
    write_safetensors_by_hand(path, {name: ("BF16", value.shape, value.tobytes())
                                     for name, value in bits.items()})
    return {name: (value.astype(np.uint32) << 16).view(np.float32)
            for name, value in bits.items()}


def test_regions_equal_the_whole_tensors_sliced(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 0x7F7F, (6, 8)).astype("<u2")
    f16 = rng.standard_normal((4, 6)).astype("<f2")
    f32 = rng.standard_normal((5, 3, 2)).astype("<f4")
    i64 = rng.integers(-9, 9, (4, 4)).astype("<i8")
    write_safetensors_by_hand(tmp_path / "a.safetensors", {
        "bf16": ("BF16", bits.shape, bits.tobytes()), "f16": ("F16", f16.shape, f16.tobytes()),
        "f32": ("F32", f32.shape, f32.tobytes()), "i64": ("I64", i64.shape, i64.tobytes()),
        "scalar": ("F32", (), struct.pack("<f", 2.5))})
    exact = (bits.astype(np.uint32) << 16).view(np.float32)
    with HFCheckpoint(tmp_path / "a.safetensors") as checkpoint:
        assert checkpoint.names == {"bf16", "f16", "f32", "i64", "scalar"}
        assert checkpoint.shape("f32") == (5, 3, 2)
        rows, cols = checkpoint.read("bf16", (slice(2, 4),)), checkpoint.read(
            "bf16", (slice(None), slice(4, 8)))
        assert rows.dtype == cols.dtype == np.float32
        np.testing.assert_array_equal(rows, exact[2:4])
        np.testing.assert_array_equal(cols, exact[:, 4:8])
        np.testing.assert_array_equal(checkpoint.read("bf16"), exact)
        np.testing.assert_array_equal(checkpoint.read("f16", (slice(None), slice(3, 6))),
                                      f16[:, 3:].astype(np.float32))
        np.testing.assert_array_equal(checkpoint.read("f32", (slice(1, 3), slice(None),
                                                              slice(1, 2))), f32[1:3, :, 1:])
        whole_ints = checkpoint.read("i64")
        assert whole_ints.dtype == np.int64
        np.testing.assert_array_equal(whole_ints, i64)
        assert checkpoint.read("scalar").tolist() == 2.5
        assert checkpoint.bytes_read == (2 * 8 + 6 * 4 + 48) * 2 + 4 * 3 * 2 + 2 * 3 * 1 * 4 \
            + 16 * 8 + 4
        assert checkpoint.nbytes == 48 * 2 + 24 * 2 + 30 * 4 + 16 * 8 + 4
        with pytest.raises(CheckpointError, match=r"a\.safetensors holds no tensor nothing"):
            checkpoint.read("nothing")


def test_fp8_regions_take_their_own_blocks_scales(tmp_path: Path) -> None:
    """A region starting inside a block: each byte times the scale of the block it sits in
    within the whole weight, as the whole weight's dequantisation."""
    rng = np.random.default_rng(3)
    raw = random_fp8(rng, (20, 12))
    scale = rng.uniform(0.5, 2.0, (3, 2)).astype(np.float32)
    write_safetensors_by_hand(tmp_path / "w.safetensors", {
        "w": ("F8_E4M3", raw.shape, raw.tobytes()),
        "w_scale_inv": ("F32", scale.shape, scale.tobytes())})
    write_fp8_config(tmp_path, [8, 8])
    rows, cols = np.indices(raw.shape)
    whole = e4m3fn_reference(raw) * scale[rows // 8, cols // 8]
    with HFCheckpoint(tmp_path / "w.safetensors") as checkpoint:
        assert checkpoint.names == {"w"}
        np.testing.assert_array_equal(checkpoint.read("w", (slice(5, 15), slice(6, 12))),
                                      whole[5:15, 6:12])
        np.testing.assert_array_equal(checkpoint.read("w", (slice(10, 20),)), whole[10:])
        np.testing.assert_array_equal(checkpoint.read("w"), whole)


def test_a_tensor_rank_reads_its_share_and_gets_the_fused_then_split_values(
        tmp_path: Path) -> None:
    """Rank r of 2 reads half of every split weight and all of the replicated ones; its
    values are the old loader's: the whole parts fused rank-interleaved, then split."""
    source = qwen3_model(seed=11)
    exact = bf16_file(tmp_path / "model.safetensors", hf_state(source))
    entries = source.weight_maps()
    split = sum(exact[name].nbytes // 2 for entry in entries if entry.axis is not None
                for name in entry.hf)
    replicated = sum(exact[name].nbytes // 2 for entry in entries if entry.axis is None
                     for name in entry.hf)
    assert split and replicated
    for rank in range(2):
        group = tensor_group(rank, 2)
        with HFCheckpoint(tmp_path / "model.safetensors") as checkpoint:
            for entry in entries:
                parts = [exact[name] for name in entry.hf]
                full = fuse_rows(parts, 2 if entry.axis == 0 else 1)
                want = full if entry.axis is None else np.split(full, 2, entry.axis)[rank]
                np.testing.assert_array_equal(local_value(entry, checkpoint, group), want,
                                              err_msg=entry.ours)
            assert checkpoint.bytes_read == split // 2 + replicated
    with (HFCheckpoint(tmp_path / "model.safetensors") as checkpoint,
          pytest.raises(HFWeightsError, match=r"dimension 0 of shape \(\d+, \d+\) is not "
                                              r"divisible by tensor_parallel \(7\)")):
        local_value(entries[0], checkpoint, tensor_group(0, 7))


def test_a_flat_range_is_the_tensor_place_s_value_read_from_the_rows_it_covers(
        tmp_path: Path) -> None:
    """`HFPieces`, the view the trainer loads HF weights through: at each tensor place of 2
    (and whole), every flat range of every parameter (fused `qkv` and `gate_up` across their
    parts' boundaries, row- and column-split, 1-D norms) equals that place's whole value
    flattened and cut; and a range reads only the rows holding it, not the tensor."""
    bf16_file(tmp_path / "model.safetensors", hf_state(qwen3_model(seed=11)))
    entries = qwen3_model().weight_maps()
    rng = np.random.default_rng(5)
    with HFCheckpoint(tmp_path / "model.safetensors") as checkpoint:
        pieces = HFPieces(checkpoint, entries, tmp_path)
        for tensor in (None, (0, 2), (1, 2)):
            group = None if tensor is None else tensor_group(*tensor)
            for entry in entries:
                whole = local_value(entry, checkpoint, group)
                assert pieces.shape(entry.ours, tensor) == whole.shape, entry.ours
                flat = whole.reshape(-1)
                width = flat.size // whole.shape[0]
                cuts = sorted(rng.choice(flat.size + 1, 2, replace=False))
                for start, stop in [cuts, (0, flat.size), (width - 1, width + 1)]:
                    before = checkpoint.bytes_read
                    got = pieces.read_range(entry.ours, start, stop, tensor)
                    np.testing.assert_array_equal(got, flat[start:stop], err_msg=entry.ours)
                    rows = -(-stop // width) - start // width
                    assert checkpoint.bytes_read - before == rows * width * 2, entry.ours
                np.testing.assert_array_equal(pieces.read_whole(entry.ours, tensor), whole)
    assert {entry.ours for entry in entries if len(entry.hf) > 1}  # fused ones were read
    assert {entry.axis for entry in entries} == {None, 0, 1}


def test_the_whole_model_streams_to_what_the_whole_arrays_give(tmp_path: Path) -> None:
    exact = bf16_file(tmp_path / "model.safetensors", hf_state(qwen3_model(seed=11)))
    streamed, whole = qwen3_model(seed=1), qwen3_model(seed=2)
    with HFCheckpoint(tmp_path / "model.safetensors") as checkpoint:
        load_hf_state(streamed, checkpoint)
        assert checkpoint.bytes_read == checkpoint.nbytes
    load_hf_state(whole, load_hf_weights(tmp_path / "model.safetensors", workers=2))
    for name, value in hf_state(streamed).items():
        np.testing.assert_array_equal(value, exact[name], err_msg=name)
        np.testing.assert_array_equal(value, hf_state(whole)[name], err_msg=name)


def test_a_pipeline_stage_reads_none_of_the_other_stages_weights(tmp_path: Path) -> None:
    exact = bf16_file(tmp_path / "model.safetensors", hf_state(qwen3_model(seed=11)))
    for part in PARTS:
        stage = qwen3_model(part)
        held = {name for entry in stage.weight_maps() for name in entry.hf}
        with HFCheckpoint(tmp_path / "model.safetensors") as checkpoint:
            load_hf_state(stage, checkpoint)
            assert 0 < checkpoint.bytes_read == sum(exact[name].nbytes // 2 for name in held)
            assert checkpoint.bytes_read < checkpoint.nbytes


def test_a_checkpoint_that_does_not_fit_is_refused_before_any_byte_is_read(
        tmp_path: Path) -> None:
    state = hf_state(qwen3_model(seed=11))
    name = "model.layers.0.mlp.up_proj.weight"
    state[name] = state[name][:-1]
    bf16_file(tmp_path / "model.safetensors", state)
    with HFCheckpoint(tmp_path / "model.safetensors") as checkpoint:
        with pytest.raises(HFWeightsError, match=rf"{name}: shape \(\d+, \d+\), expected"):
            load_hf_state(qwen3_model(), checkpoint)
        assert checkpoint.bytes_read == 0
