"""Packed documents reach the models: with restarting positions and a document mask (compact
document ends or the dense mask), a packed sample computes what its documents compute one by
one; without them it does not. Also: the masks `AttentionPlaces` builds against numpy, and the
data stream hands the fields the data settings ask for."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import Tensor

from mf_config import ModelConfig
from mf_train.models import build_model
from mf_train.models.attention_inputs import AttentionPlaces, cumulative_lengths
from mf_train.models.blocks import AttentionCore
from mf_train.step.batch_fields import attention_fields

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import deepseek_v3_reference as ref  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")

QWEN3 = {"model_type": "qwen3", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 8, "rms_norm_eps": 1e-6, "max_position_embeddings": 32,
         "tie_word_embeddings": True}
DEEPSEEK = {"model_type": "deepseek_v3", **ref.CONFIGS["lora"]}
DOCUMENTS = (5, 7, 4)
"""Lengths of the documents packed into one 16-token sample."""
SEQ = sum(DOCUMENTS)


def model_of(extras: dict):
    sizes = {key: value for key, value in extras.items() if key != "model_type"}
    return build_model(ModelConfig(model_type=extras["model_type"], extras=sizes), seed=3)


def packed_batch(seed: int = 0):
    """Two samples of the same document lengths: tokens, labels, positions, document ends
    (padded with the length, as mf-data pads `actual_seq_len`) and the dense mask."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 64, (2, SEQ)).astype(np.int32)
    labels = rng.integers(1, 64, (2, SEQ)).astype(np.int32)
    starts = np.cumsum((0, *DOCUMENTS[:-1]))
    positions = np.concatenate([np.arange(n) for n in DOCUMENTS])
    positions = np.stack([positions, positions]).astype(np.int32)
    ends = np.array([[*np.cumsum(DOCUMENTS)[:-1], SEQ, SEQ]] * 2, np.int32)
    document = np.repeat(np.arange(len(DOCUMENTS)), DOCUMENTS)
    future = np.triu(np.ones((SEQ, SEQ), bool), k=1)
    dense = (future | (document[:, None] != document[None, :]))[None, None]
    return tokens, labels, positions, ends, dense, starts


@pytest.mark.parametrize("extras", [QWEN3, DEEPSEEK], ids=["qwen3", "deepseek_v3"])
def test_a_packed_sample_computes_what_its_documents_compute_alone(extras) -> None:
    model = model_of(extras)
    tokens, _, positions, ends, dense, starts = packed_batch()
    compact = model.logits(Tensor(tokens), Tensor(positions), Tensor(ends)).asnumpy()
    with_dense = model.logits(Tensor(tokens), Tensor(positions), None,
                              Tensor(dense)).asnumpy()
    unpacked = model.logits(Tensor(tokens)).asnumpy()
    np.testing.assert_allclose(with_dense, compact, rtol=1e-6, atol=1e-6)
    for start, length in zip(starts, DOCUMENTS, strict=True):
        alone = model.logits(Tensor(tokens[:, start:start + length])).asnumpy()
        np.testing.assert_allclose(compact[:, start:start + length], alone, rtol=1e-5,
                                   atol=1e-5)
    first = slice(0, DOCUMENTS[0])  # the first document is causal-alone either way
    np.testing.assert_allclose(unpacked[:, first], compact[:, first], rtol=1e-5, atol=1e-5)
    assert np.abs(unpacked[:, DOCUMENTS[0]:] - compact[:, DOCUMENTS[0]:]).max() > 1e-3


def test_the_loss_of_a_packed_sample_is_the_token_weighted_loss_of_its_documents() -> None:
    model = model_of(QWEN3)
    tokens, labels, positions, ends, _, starts = packed_batch(1)
    mask = np.ones(tokens.shape, np.float32)
    packed = float(model(Tensor(tokens), Tensor(labels), Tensor(mask), Tensor(positions),
                         Tensor(ends)).asnumpy())
    weighted = sum(
        float(model(Tensor(tokens[:, s:s + n]), Tensor(labels[:, s:s + n])).asnumpy()) * n
        for s, n in zip(starts, DOCUMENTS, strict=True)) / SEQ
    assert packed == pytest.approx(weighted, abs=1e-5)
    plain = float(model(Tensor(tokens), Tensor(labels), Tensor(mask)).asnumpy())
    assert abs(plain - weighted) > 1e-4


def test_restarting_positions_alone_change_the_rotation_only() -> None:
    """Positions without a document mask: documents still see each other, but the rotary
    positions restart (what `reset_position_ids` without `reset_attention_mask` does)."""
    model = model_of(QWEN3)
    tokens, _, positions, *_ = packed_batch()
    restarted = model.logits(Tensor(tokens), Tensor(positions)).asnumpy()
    plain = model.logits(Tensor(tokens)).asnumpy()
    same = model.logits(Tensor(tokens), Tensor(np.tile(np.arange(SEQ, dtype=np.int32),
                                                       (2, 1)))).asnumpy()
    np.testing.assert_array_equal(same, plain)
    assert np.abs(restarted[:, DOCUMENTS[0]:] - plain[:, DOCUMENTS[0]:]).max() > 1e-3


def test_document_masks_against_the_dense_rule() -> None:
    """The compact ends give the block-diagonal causal mask mf-data builds densely."""
    *_, ends, dense, _ = packed_batch()
    got = AttentionPlaces().inputs(SEQ, None, Tensor(ends)).mask.asnumpy()
    np.testing.assert_array_equal(got, np.broadcast_to(dense, (2, 1, SEQ, SEQ)))
    assert AttentionPlaces().inputs(SEQ).mask is None  # plain causal: the core's own mask


@pytest.mark.parametrize(("flags", "fields"), [
    ((False, False, True, False), ()),
    ((True, False, True, False), ("position_ids",)),
    ((True, True, True, False), ("position_ids", "attention_mask")),
    ((False, True, False, False), ()),
    ((True, True, False, True), ("position_ids", "actual_seq_len")),
    ((False, False, False, True), ("actual_seq_len",)),
])
def test_the_stream_carries_what_the_data_settings_ask_for(flags, fields) -> None:
    """(reset_position_ids, reset_attention_mask, create_attention_mask,
    create_compressed_eod_mask) -> the fields beyond tokens, labels and loss mask."""
    assert attention_fields(*flags) == fields


def test_a_variable_length_kernel_gets_the_cumulative_document_ends() -> None:
    """With a fused variable-length kernel (Ascend's flash attention) the compact form is
    passed on, not turned into a mask: the documents' ends over the batch's tokens laid end to
    end (TND's actual_seq_qlen), every sample's last document ending at its length."""
    *_, ends, _, _ = packed_batch()
    attending = AttentionPlaces(varlen=True).inputs(SEQ, None, Tensor(ends))
    assert attending.mask is None
    assert attending.lengths == (5, 12, 16, 21, 28, 32)
    assert cumulative_lengths(np.array([[3, 8, 8], [8, 8, 8]]), 8) == (3, 8, 16)
    assert AttentionPlaces().inputs(SEQ, None, Tensor(ends)).lengths is None  # plain path


def test_the_plain_path_refuses_document_lengths() -> None:
    core = AttentionCore(1.0)
    q = Tensor(np.zeros((1, 1, 4, 2), np.float32))
    with pytest.raises(ValueError, match="document lengths need the flash kernel"):
        core(q, q, q, None, (4,))
