"""A pipeline stage's part of the Qwen3 model (`models.parts.ModelPart`): the pieces run one
after another equal the whole model, parameters keep their model-wide names and values, and a
stage loads its own share of a whole Hugging Face checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import Tensor
from qwen3_parts import PARTS, SIZES, qwen3_model

from mf_train.models import PipelineModel, hf_state, load_hf_state


def batch() -> tuple[Tensor, Tensor]:
    data = np.random.default_rng(3).integers(0, SIZES["vocab_size"], (2, 17)).astype(np.int32)
    return Tensor(data[:, :-1]), Tensor(data[:, 1:])


def test_parts_hold_the_whole_models_parameters_under_its_names() -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    whole = {name: p.asnumpy() for name, p in qwen3_model().parameters_and_names()}
    first, last = (dict(qwen3_model(part).parameters_and_names()) for part in PARTS)
    assert sorted({n.split(".")[1] for n in first if n.startswith("decoder_layers")}) == ["0", "2"]
    assert "final_norm.weight" in last and "final_norm.weight" not in first
    assert "embedding.weight" in first and "embedding.weight" in last  # the tied copy
    for name, param in [*first.items(), *last.items()]:
        np.testing.assert_array_equal(param.asnumpy(), whole[name], err_msg=name)
    assert set(first) | set(last) == set(whole)


def test_the_pieces_in_interleaved_order_give_the_whole_models_loss() -> None:
    """Virtual stages 0-3 on two stages (layers 0, 1, 2, 3 on stages 0, 1, 0, 1)."""
    whole, (first, last) = qwen3_model(), [qwen3_model(part) for part in PARTS]
    assert isinstance(first, PipelineModel)
    ids, labels = batch()
    hidden = first.embed(ids)
    for stage, layer in ((first, 0), (last, 1), (first, 2), (last, 3)):
        hidden, _ = stage.decoder(hidden, [layer], stage.attending(ids))
    loss = last.head_loss(hidden, labels, None)
    assert float(loss.asnumpy()) == pytest.approx(float(whole(ids, labels).asnumpy()), rel=1e-6)
    assert first.hidden_spec(2, 16) == ((16, 2, 32), ms.float32)


def test_a_stage_loads_its_share_of_a_whole_hugging_face_checkpoint() -> None:
    """Weights of another seed, loaded strictly: the other stage's weights are not errors."""
    other = qwen3_model(seed=11)
    source, want = hf_state(other), dict(other.parameters_and_names())
    for part in PARTS:
        stage = qwen3_model(part)
        load_hf_state(stage, source)
        for name, param in stage.parameters_and_names():
            np.testing.assert_array_equal(param.asnumpy(), want[name].asnumpy(), err_msg=name)
    with pytest.raises(ValueError, match=r"model\.layers\.9\.mlp\.up_proj\.weight: not a weight"):
        load_hf_state(qwen3_model(PARTS[0]), {**source, "model.layers.9.mlp.up_proj.weight":
                                              np.zeros((2, 2), np.float32)})
