"""`context.compile` and the faster step: the tiny example trains as it did before the speed
work (losses recorded then, within 1e-5 relative over 20 steps), compiled or not; the layers
compile once; what cannot be compiled stays in PyNative and says why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import Parameter, Tensor
from runs import steps

from mf_config import OptimizerConfig, load_config
from mf_train.layouts.context_parallel import ContextParallel
from mf_train.models import build_model
from mf_train.optim import build_optimizer
from mf_train.step.compiled_layers import (
    CompileReport,
    compile_layers,
    compile_optimizer,
    graphs_compiled,
)
from mf_train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "qwen3_tiny.yaml"
GOLDEN = json.loads((Path(__file__).parent / "golden" / "qwen3_tiny_losses.json").read_text())


def _train(prefix: str, tmp_path: Path, *more: str) -> tuple[Trainer, list[dict]]:
    config = load_config(EXAMPLE, [f"train_dataset.dataloader.config.data_path=['1','{prefix}']",
                                   "training.steps=20", "checkpoint.enable_save=false", *more])
    trainer = Trainer(config, output_dir=tmp_path)
    trainer.train()
    return trainer, steps(tmp_path)


@pytest.mark.parametrize("compiled", [False, True], ids=["pynative", "compiled"])
def test_losses_equal_the_path_before_the_speed_work(data_prefix, tmp_path, compiled) -> None:
    """The example as written (recompute of attention 0-1 and mlp 3 included)."""
    trainer, logged = _train(data_prefix, tmp_path, f"context.compile={str(compiled).lower()}")
    losses = np.array([line["loss"] for line in logged])
    np.testing.assert_allclose(losses, GOLDEN["losses"], rtol=1e-5, atol=0)
    assert trainer.compiled.enabled is compiled
    compiled_at = [line["step"] for line in logged if "compiled_graphs" in line]
    if not compiled:
        assert compiled_at == [] and trainer.compiled.graphs == 0
        return
    # the forward and backward graph and the update's graph at step 1; nothing compiled in
    # steps 2-20
    assert compiled_at == [1]
    assert logged[0]["compiled_graphs"] == trainer.compiled.graphs >= 2
    assert 0 < logged[0]["compile_time"] <= logged[0]["step_time"]
    assert trainer.compiled.compiled == [
        "the embedding lookup, decoder layers 0-3, final norm, head and loss as one graph, "
        "forward and backward", "the optimizer's update as one graph"]


def _tiny_qwen3():
    config = load_config(EXAMPLE)
    return build_model(config.model, seed=1)


def test_off_leaves_every_layer_in_pynative() -> None:
    model = _tiny_qwen3()
    before = [layer.construct for layer in model.decoder_layers]
    report = compile_layers(model, False)
    assert [layer.construct for layer in model.decoder_layers] == before
    assert report.describe() == "context.compile is false: everything runs in PyNative"


def test_a_blocking_layout_keeps_the_layers_in_pynative_and_says_why() -> None:
    model = _tiny_qwen3()
    before = [layer.construct for layer in model.decoder_layers]
    report = compile_layers(model, True, [("swap", None), ("the context-parallel layout",
                                                           ContextParallel.compile_blocker)])
    assert [layer.construct for layer in model.decoder_layers] == before
    assert report.compiled == []
    line = report.describe()
    assert line.startswith("context.compile: nothing compiled; the decoder layers run in "
                           "PyNative (the context-parallel layout: context-parallel "
                           "attention exchanges")


def test_deepseek_v3_compiles_its_layers_in_parts() -> None:
    """The attention, dense MLP, router, routed experts (one graph for any token count) and
    shared experts of each layer compile on their own; the routing read and the token
    permutation stay in PyNative. Loss and every gradient equal the PyNative model's (same
    weights) over three calls with other routings (the third reuses the graphs)."""
    config = load_config(ROOT / "examples" / "deepseek_v3_tiny.yaml")
    model, reference = build_model(config.model, seed=1), build_model(config.model, seed=1)
    report = compile_layers(model, True)
    assert report.compiled == ["attention of decoder layers 0-2", "dense MLP of decoder layer 0",
                               "router of decoder layers 1-2",
                               "routed experts of decoder layers 1-2",
                               "shared experts of decoder layers 1-2"]
    assert ("the rest of the decoder layers run in PyNative (the model: its MoE layers read "
            "the routing back to the host to give each expert its tokens") in report.describe()
    rng = np.random.default_rng(0)
    for _ in range(3):
        ids = Tensor(rng.integers(0, 512, (2, 32)).astype(np.int32))
        labels = Tensor(rng.integers(0, 512, (2, 32)).astype(np.int32))
        got, got_grads = ms.value_and_grad(model, None, model.trainable_params())(ids, labels)
        want, want_grads = ms.value_and_grad(reference, None, reference.trainable_params())(
            ids, labels)
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-6)
        for param, g, w in zip(model.trainable_params(), got_grads, want_grads, strict=True):
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-4, atol=1e-6,
                                       err_msg=param.name)
    assert report.graphs >= 16  # one per compiled cell at least


def test_a_compiled_layer_compiles_once_per_input_shape() -> None:
    model = _tiny_qwen3()
    report = compile_layers(model, True)
    layer = model.decoder_layers[0]
    x = Tensor(np.random.default_rng(0).standard_normal((16, 2, 64)).astype(np.float32))
    rotation = model.rotary.at(np.arange(16))
    start = graphs_compiled()
    first = layer(x, *rotation).asnumpy()
    assert graphs_compiled() - start == report.graphs >= 1
    for _ in range(3):
        np.testing.assert_array_equal(layer(x, *rotation).asnumpy(), first)
    assert graphs_compiled() - start == report.graphs
    layer(x[:8], *model.rotary.at(np.arange(8)))  # another sequence length: one more graph
    assert graphs_compiled() - start == report.graphs > 1


@pytest.mark.parametrize("packed", [False, True], ids=["causal", "packed-documents"])
def test_the_body_as_one_graph_equals_pynative(packed) -> None:
    """Where the layout allows (`compiles_body`), the embedding lookup, layers, final norm,
    head and loss run as one graph, and their gradients as one graph forward and backward
    (`report.gradients`): both give the loss and every gradient of the PyNative model (same
    weights), with a loss mask, and with packed documents (the attention mask an input of
    the graph); the graphs are reused by the next call."""
    model, reference = _tiny_qwen3(), _tiny_qwen3()
    layers = [layer.construct for layer in model.decoder_layers]
    params = model.trainable_params()
    report = compile_layers(model, True, body_params=params)
    assert report.compiled == ["the embedding lookup, decoder layers 0-3, final norm, head "
                               "and loss as one graph, forward and backward"]
    assert [layer.construct for layer in model.decoder_layers] == layers  # not one by one
    # in a graph of fixed shapes SwiGLU keeps its activation cell; attention takes the views
    assert all(layer.mlp.activations is not None and layer.attention.gathered is None
               for layer in model.decoder_layers)
    rng = np.random.default_rng(0)
    scale = 0.25
    for call in range(2):
        ids = Tensor(rng.integers(0, 512, (2, 32)).astype(np.int32))
        labels = Tensor(rng.integers(0, 512, (2, 32)).astype(np.int32))
        mask = Tensor((rng.random((2, 32)) > 0.2).astype(np.float32))
        ends = Tensor(np.array([[10, 32], [20, 32]], np.int32)) if packed else None
        want, want_grads = ms.value_and_grad(reference, None, reference.trainable_params())(
            ids, labels, mask, None, ends)
        around, around_grads = ms.value_and_grad(model, None, params)(
            ids, labels, mask, None, ends)
        whole, whole_grads = report.gradients(Tensor(scale, ms.float32), ids, labels, mask,
                                              None, ends)
        np.testing.assert_allclose(around.asnumpy(), want.asnumpy(), rtol=1e-6)
        np.testing.assert_allclose(whole.asnumpy(), want.asnumpy() * scale, rtol=1e-6)
        for param, g, h, w in zip(params, around_grads, whole_grads, want_grads, strict=True):
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-4, atol=1e-6,
                                       err_msg=param.name)
            np.testing.assert_allclose(h.asnumpy(), w.asnumpy() * scale, rtol=1e-4,
                                       atol=1e-6, err_msg=param.name)
        if call == 0:
            compiled = report.graphs
    assert report.graphs == compiled >= 2


def test_a_layout_that_works_per_layer_compiles_each_layer_and_says_why() -> None:
    model = _tiny_qwen3()
    report = compile_layers(model, True)
    assert report.compiled == ["decoder layers 0-3"]
    assert report.gradients is None
    assert model._compiled_body is None
    assert ("embedding, final norm, head and loss run in PyNative (not in one graph with the "
            "layers: the layout works on each layer)") in report.describe()


def _named_params(seed: int, dtype=ms.float32) -> list[tuple[str, Parameter]]:
    rng = np.random.default_rng(seed)
    shapes = {"embed.weight": (12, 4), "layers.0.mlp.weight": (6, 4), "layers.0.norm.weight": (4,)}
    return [(name, Parameter(Tensor(rng.standard_normal(shape).astype(np.float32)).astype(dtype),
                             name=name)) for name, shape in shapes.items()]


def test_the_optimizer_update_as_one_graph_equals_pynative() -> None:
    """`context.compile` runs AdamW's update of every parameter as one graph: parameters and
    moments equal the PyNative update's over steps with a changing rate, a clip coefficient
    on the device, a skipped step (non-finite gradients, `keep` false) and state loaded from
    a copy mid-run (the graph takes the moments as inputs, so loaded ones are used)."""
    config = OptimizerConfig(type="AdamW", weight_decay=0.1)
    named, plain_named = _named_params(0), _named_params(0)
    compiled, plain = build_optimizer(config, named), build_optimizer(config, plain_named)
    report = CompileReport(True, compiled=["decoder layers 0-3"])
    compile_optimizer(compiled, report)
    assert report.compiled == ["decoder layers 0-3", "the optimizer's update as one graph"]
    rng = np.random.default_rng(1)
    for step in range(6):
        grads = [rng.standard_normal(p.shape).astype(np.float32) for _, p in named]
        lr, clip = 1e-2 / (step + 1), Tensor(np.float32(0.5 + 0.1 * step))
        keep = Tensor(step != 2)
        if step == 2:
            grads = [np.full_like(g, np.nan) for g in grads]
        for optimizer in (compiled, plain):
            optimizer.step([Tensor(g) for g in grads], lr, clip=clip, keep=keep)
            if step == 2:
                optimizer.uncount()
        if step == 3:
            compiled.load_state_dict(compiled.state_dict())
        for (name, got), (_, want) in zip(named, plain_named, strict=True):
            np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-6, atol=1e-7,
                                       err_msg=f"{name}, step {step}")
    assert compiled.global_step == plain.global_step == 5
    for key, value in plain.state_dict().items():
        np.testing.assert_allclose(compiled.state_dict()[key], value, rtol=1e-6, atol=1e-8,
                                   err_msg=key)
    assert report.graphs == 1  # one graph for every step given `keep`, kept or not; ...
    compiled.step([Tensor(np.zeros(p.shape, np.float32)) for _, p in named], 1e-3)
    assert report.graphs == 2  # ... one more for steps without it


def test_an_optimizer_without_a_compiled_update_stays_in_pynative_and_says_why() -> None:
    low = build_optimizer(OptimizerConfig(type="AdamW"), _named_params(0, ms.float16))
    muon = build_optimizer(OptimizerConfig(type="Muon"), _named_params(0))
    for optimizer, reason in ((low, "low-precision parameters keep float32 masters, cast "
                                    "back after the update"),
                              (muon, "Muon has no compiled form")):
        report = CompileReport(True, compiled=["decoder layers 0-3"])
        compile_optimizer(optimizer, report)
        assert report.compiled == ["decoder layers 0-3"]
        assert report.describe().endswith(f"the optimizer's update run in PyNative ({reason})")
    adamw = build_optimizer(OptimizerConfig(type="AdamW"), _named_params(0))
    off, layers_blocked = CompileReport(False), CompileReport(True)  # compile nothing else
    for report in (off, layers_blocked):
        compile_optimizer(adamw, report)
        assert report.fallbacks == [] and report.compiled == []
    assert adamw._graph is None
