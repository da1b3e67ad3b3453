"""Hugging Face DeepSeek-V3 checkpoints: FP8 (e4m3fn) weights dequantised with their block
scales against an independent numpy decoding and hand-checked bytes, and the multi-token-
prediction layers skipped with one log line, on small synthetic checkpoints written here."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from mf_config import ModelConfig
from mf_train.checkpoint import CheckpointError, load_hf_weights
from mf_train.checkpoint.fp8 import E4M3FN, decode_e4m3fn
from mf_train.models import hf_state, load_hf_state
from mf_train.models.deepseek_v3 import DeepseekV3ForCausalLM
from mf_train.models.hf_weights import HFWeightsError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import deepseek_v3_reference as ref
from fp8_samples import e4m3fn_reference, random_fp8, write_fp8_config
from safetensors_files import write_safetensors_by_hand


def test_e4m3fn_bytes_by_hand() -> None:
    assert E4M3FN[0x38] == 1.0 and E4M3FN[0x40] == 2.0 and E4M3FN[0x3C] == 1.5
    assert E4M3FN[0x7E] == 448.0 and E4M3FN[0xFE] == -448.0  # the largest, no infinity
    assert E4M3FN[0x08] == 2.0 ** -6  # smallest normal
    assert E4M3FN[0x01] == 2.0 ** -9 and E4M3FN[0x07] == 7 * 2.0 ** -9  # subnormals
    assert E4M3FN[0x00] == 0.0 and not np.signbit(E4M3FN[0x00])
    assert E4M3FN[0x80] == 0.0 and np.signbit(E4M3FN[0x80])  # negative zero
    assert np.isnan(E4M3FN[0x7F]) and np.isnan(E4M3FN[0xFF])
    assert np.isnan(E4M3FN).sum() == 2
    every = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(decode_e4m3fn(every), e4m3fn_reference(every))


def test_fp8_block_dequantisation_across_files(tmp_path: Path) -> None:
    """A 130 x 260 weight in 128 x 128 blocks (partial last blocks), its scales in another
    file: weight[i, j] = e4m3fn(byte) * scale_inv[i // 128, j // 128]; scales consumed."""
    rng = np.random.default_rng(0)
    raw = random_fp8(rng, (130, 260))
    scale = rng.uniform(0.5, 2.0, (2, 3)).astype(np.float32)
    other = rng.standard_normal(5).astype(np.float32)
    write_safetensors_by_hand(tmp_path / "model-00001-of-00002.safetensors", {
        "w.weight": ("F8_E4M3", raw.shape, raw.tobytes()), "b": ("F32", (5,), other.tobytes())})
    write_safetensors_by_hand(tmp_path / "model-00002-of-00002.safetensors", {
        "w.weight_scale_inv": ("F32", scale.shape, scale.tobytes())})
    write_fp8_config(tmp_path, [128, 128])
    tensors = load_hf_weights(tmp_path)
    assert sorted(tensors) == ["b", "w.weight"]
    rows, cols = np.indices(raw.shape)
    expected = e4m3fn_reference(raw) * scale[rows // 128, cols // 128]
    assert tensors["w.weight"].dtype == np.float32
    np.testing.assert_array_equal(tensors["w.weight"], expected)
    np.testing.assert_array_equal(tensors["b"], other)


def test_fp8_scale_errors(tmp_path: Path) -> None:
    raw = np.full((4, 4), 0x38, np.uint8)
    write_safetensors_by_hand(tmp_path / "a.safetensors", {
        "w.weight": ("F8_E4M3", (4, 4), raw.tobytes()),
        "w.weight_scale_inv": ("F32", (2, 2), np.ones((2, 2), np.float32).tobytes())})
    with pytest.raises(CheckpointError, match=r"w\.weight_scale_inv: shape \(2, 2\), expected "
                                              r"\(1, 1\) for a 4x4 weight in 128x128 blocks"):
        load_hf_weights(tmp_path / "a.safetensors")
    write_fp8_config(tmp_path, [2, 2])  # beside the file: its block size applies
    assert load_hf_weights(tmp_path / "a.safetensors")["w.weight"].tolist() == [[1.0] * 4] * 4
    write_fp8_config(tmp_path, [128])
    with pytest.raises(CheckpointError, match="weight_block_size must be two positive ints"):
        load_hf_weights(tmp_path / "a.safetensors")
    (tmp_path / "config.json").unlink()
    write_safetensors_by_hand(tmp_path / "b.safetensors", {
        "v.weight_scale_inv": ("F32", (1, 1), np.ones((1, 1), np.float32).tobytes())})
    with pytest.raises(CheckpointError, match=r"block scales for no FP8 \(F8_E4M3\) weight: "
                                              r"v\.weight_scale_inv"):
        load_hf_weights(tmp_path / "b.safetensors")


def mtp_layer(index: int, hidden: int, vocab: int) -> dict[str, np.ndarray]:
    """A multi-token-prediction layer as DeepSeek-V3's checkpoint holds it (the decoder part
    shortened to two tensors)."""
    p = f"model.layers.{index}"
    return {f"{p}.enorm.weight": np.ones(hidden, np.float32),
            f"{p}.hnorm.weight": np.ones(hidden, np.float32),
            f"{p}.eh_proj.weight": np.zeros((hidden, 2 * hidden), np.float32),
            f"{p}.shared_head.norm.weight": np.ones(hidden, np.float32),
            f"{p}.shared_head.head.weight": np.zeros((vocab, hidden), np.float32),
            f"{p}.input_layernorm.weight": np.ones(hidden, np.float32),
            f"{p}.self_attn.o_proj.weight": np.zeros((hidden, hidden), np.float32)}


def test_deepseek_v3_checkpoint_with_mtp_and_fp8_weights(tmp_path: Path, caplog) -> None:
    """The tiny DeepSeek-V3 written as DeepSeek publishes it: the projections and experts in
    FP8 with 8 x 8 block scales, norms, router and embeddings in float32, plus an MTP layer
    (its projections FP8 too). Loaded: every weight is the numpy dequantisation, the MTP
    tensors are skipped with one line, nothing is unknown."""
    cfg = ref.LORA
    names_shapes = {name: value.shape for name, value in
                    hf_state(DeepseekV3ForCausalLM.from_config(ModelConfig(extras=cfg))).items()}
    rng = np.random.default_rng(1)
    block = 8
    files: dict[str, tuple[str, tuple, bytes]] = {}
    expected: dict[str, np.ndarray] = {}
    mtp = mtp_layer(cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"])
    for name, shape in {**names_shapes, **{n: v.shape for n, v in mtp.items()}}.items():
        if len(shape) == 2 and ("proj" in name) and "gate.weight" not in name:
            raw = random_fp8(rng, shape)
            scale = rng.uniform(0.001, 0.01, (-(-shape[0] // block), -(-shape[1] // block)))
            scale = scale.astype(np.float32)
            files[name] = ("F8_E4M3", shape, raw.tobytes())
            files[f"{name}_scale_inv"] = ("F32", scale.shape, scale.tobytes())
            expected[name] = e4m3fn_reference(raw) * np.kron(scale, np.ones((block, block),
                                                                           np.float32)
                                                             )[:shape[0], :shape[1]]
        else:
            value = rng.standard_normal(shape).astype(np.float32) * 0.02
            files[name] = ("F32", shape, value.tobytes())
            expected[name] = value
    fp8 = sum(dtype == "F8_E4M3" for dtype, _, _ in files.values())
    assert fp8 > 20 and any(n.endswith("eh_proj.weight_scale_inv") for n in files)
    write_safetensors_by_hand(tmp_path / "model.safetensors", files)
    write_fp8_config(tmp_path, [block, block])

    caplog.set_level(logging.INFO)
    tensors = load_hf_weights(tmp_path)
    assert not any(name.endswith("_scale_inv") for name in tensors)
    model = DeepseekV3ForCausalLM.from_config(ModelConfig(extras=cfg))
    load_hf_state(model, tensors)
    loaded = hf_state(model)
    assert loaded.keys() == names_shapes.keys()
    for name, value in loaded.items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert skipped == [f"Hugging Face weights: skipped {len(mtp)} tensors: the multi-token-"
                       f"prediction layer(s) model.layers.3 (num_nextn_predict_layers): mf "
                       f"does not train multi-token prediction"]
    assert any("dequantised" in r.getMessage() and "8x8" in r.getMessage()
               for r in caplog.records)

    # a surplus decoder layer without MTP modules is still unknown
    surplus = {**tensors, "model.layers.4.input_layernorm.weight": np.ones(32, np.float32)}
    with pytest.raises(HFWeightsError, match=r"model\.layers\.4\.input_layernorm\.weight: not "
                                             r"a weight of DeepseekV3ForCausalLM"):
        load_hf_state(model, surplus)
