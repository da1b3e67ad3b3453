"""`ShardedVocabulary` on a one-rank group against numpy: the lookup of the rows a rank holds and
the vocabulary-parallel cross-entropy, values and gradients (the multi-rank behaviour is
tested end to end: FSDP on 2 ranks equals one process, tests/train/test_train_sharded.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import Tensor

from mf_parallel.runtime.sharded_vocabulary import ShardedVocabulary


def test_a_one_rank_group_holds_every_row(collectives) -> None:
    vocabulary = ShardedVocabulary(collectives, 10)
    assert (vocabulary.rows, vocabulary.start) == (10, 0)
    table = Tensor(np.zeros((10, 4), np.float32))
    assert vocabulary.holds_rows(table)
    assert not vocabulary.holds_rows(Tensor(np.zeros((0,), np.float32)))


def test_embedding_and_cross_entropy_match_numpy(collectives) -> None:
    rng = np.random.default_rng(0)
    vocab, hidden, seq, batch = 12, 4, 3, 2
    table = rng.standard_normal((vocab, hidden)).astype(np.float32)
    states = rng.standard_normal((seq, batch, hidden)).astype(np.float32)
    ids = rng.integers(0, vocab, (seq, batch)).astype(np.int32)
    labels = rng.integers(0, vocab, (seq, batch)).astype(np.int32)
    vocabulary = ShardedVocabulary(collectives, vocab)

    embedded = vocabulary.embed(Tensor(table), Tensor(ids)).asnumpy()
    np.testing.assert_array_equal(embedded, table[ids])

    def loss(x, w):
        return vocabulary.token_cross_entropy(x, w, Tensor(labels)).sum()

    value, (d_states, d_table) = ms.value_and_grad(loss, (0, 1))(Tensor(states), Tensor(table))
    logits = states.astype(np.float64) @ table.T.astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    assert float(value.asnumpy()) == pytest.approx(-picked.sum(), rel=1e-5)
    d_logits = np.exp(log_probs) - np.eye(vocab)[labels]
    np.testing.assert_allclose(d_states.asnumpy(), d_logits @ table, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(d_table.asnumpy(),
                               np.einsum("sbv,sbh->vh", d_logits, states), rtol=1e-4, atol=1e-5)
