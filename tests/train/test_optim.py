"""AdamW and Muon against numpy reimplementations written from the published formulas, and
their state dicts: round trips that continue bit-identically, and clear errors."""

from __future__ import annotations

import logging

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor

from mf_config import OptimizerConfig
from mf_train.optim import (
    AdamW,
    Muon,
    MuonSettings,
    OptimizerStateError,
    adamw_update,
    adamw_update_in_place,
    build_optimizer,
    newton_schulz,
)

ms.set_context(mode=ms.PYNATIVE_MODE)

QUINTIC = (3.4445, -4.7750, 2.0315)
LRS = [1e-2, 3e-2, 5e-3, 2e-2]
SHAPES = {"embed.weight": (12, 4), "layers.0.mlp.weight": (6, 4), "layers.0.attn.weight": (4, 10),
          "layers.0.norm.weight": (4,), "head.bias": (12,)}


def make_params(seed: int = 0, dtypes: dict[str, ms.dtype] | None = None,
                ) -> list[tuple[str, Parameter]]:
    rng = np.random.default_rng(seed)
    named = []
    for name, shape in SHAPES.items():
        value = Tensor(rng.standard_normal(shape).astype(np.float32))
        dtype = (dtypes or {}).get(name, ms.float32)
        named.append((name, Parameter(value.astype(dtype), name=name)))
    return named


def make_grads(step: int) -> list[np.ndarray]:
    rng = np.random.default_rng(100 + step)
    return [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES.values()]


def values(named: list[tuple[str, Parameter]]) -> dict[str, np.ndarray]:
    return {name: param.float().asnumpy() for name, param in named}


def run(optimizer, steps: range) -> None:
    for step in steps:
        optimizer.step([Tensor(g) for g in make_grads(step)], LRS[step % len(LRS)])


# ----- numpy references (float64) -----

def np_adamw(p, g, m, v, t, lr, wd, betas, eps):
    """torch.optim.AdamW / Loshchilov & Hutter, written out."""
    b1, b2 = betas
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return p, m, v


def np_newton_schulz(x, steps=5, coefficients=QUINTIC, eps=1e-7):
    """Keller Jordan's quintic iteration, written out."""
    a, b, c = coefficients
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / max(np.linalg.norm(x), eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def np_muon(p, g, buf, lr, wd, momentum, nesterov, rms=0.2):
    """Muon with Moonlight's scale lr * 0.2 * sqrt(max(rows, cols)), written out."""
    buf = momentum * buf + g
    u = g + momentum * buf if nesterov else buf
    p = p * (1 - lr * wd) - lr * rms * np.sqrt(max(p.shape)) * np_newton_schulz(u)
    return p, buf


def decays(name: str) -> bool:
    return len(SHAPES[name]) == 2 and not name.endswith(".bias")


# ----- AdamW -----

def test_adamw_matches_numpy_over_steps_with_changing_lr() -> None:
    named = make_params()
    betas, eps, wd = (0.9, 0.95), 1e-8, 0.1
    opt = build_optimizer(OptimizerConfig(type="AdamW", betas=list(betas), eps=eps,
                                          weight_decay=wd), named)
    ref = {n: (v.astype(np.float64), 0.0, 0.0) for n, v in values(named).items()}
    for step in range(4):
        grads = make_grads(step)
        opt.step([Tensor(g) for g in grads], LRS[step])
        for (name, (p, m, v)), g in zip(ref.items(), grads, strict=True):
            ref[name] = np_adamw(p, g.astype(np.float64), m, v, step + 1, LRS[step],
                                 wd if decays(name) else 0.0, betas, eps)
    state = opt.state_dict()
    assert state["global_step"].tolist() == [4]
    for name, (p, m, v) in ref.items():
        np.testing.assert_allclose(values(named)[name], p, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(state[f"adam_m.{name}"], m, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(state[f"adam_v.{name}"], v, rtol=1e-6, atol=1e-8)


def test_the_fused_update_equals_the_formula_over_20_steps_from_a_zero_lr() -> None:
    """`adamw_update_in_place` folds the bias corrections into the kernel's arguments; a
    warm-up's lr of 0 (no update, no division by it) and decay 0 are included."""
    rng = np.random.default_rng(5)
    start = rng.standard_normal((8, 6)).astype(np.float32)
    formula = [Tensor(start.copy()), Tensor(np.zeros((8, 6), np.float32)),
               Tensor(np.zeros((8, 6), np.float32))]
    fused = [Tensor(start.copy()), Tensor(np.zeros((8, 6), np.float32)),
             Tensor(np.zeros((8, 6), np.float32))]
    for step in range(1, 21):
        grad = Tensor(rng.standard_normal((8, 6)).astype(np.float32))
        lr, decay = (0.0 if step == 1 else 1e-2 / step), (0.0 if step % 5 == 0 else 0.1)
        param, m, v = formula
        formula = list(adamw_update(param, grad, m, v, step, lr, decay, (0.9, 0.95), 1e-8))
        adamw_update_in_place(*fused[:1], grad, *fused[1:], step, lr, decay, (0.9, 0.95), 1e-8)
        if step == 1:
            np.testing.assert_array_equal(fused[0].asnumpy(), start)
    assert not np.allclose(fused[0].asnumpy(), start)
    for ours, reference in zip(fused, formula, strict=True):
        np.testing.assert_allclose(ours.asnumpy(), reference.asnumpy(), rtol=1e-5, atol=1e-7)


def test_adamw_update_on_a_slice_equals_the_slice_of_the_whole_update() -> None:
    rng = np.random.default_rng(3)
    whole = [Tensor(rng.random(40).astype(np.float32)) for _ in range(4)]
    kwargs = {"step": 3, "lr": 0.01, "weight_decay": 0.1, "betas": (0.9, 0.95), "eps": 1e-8}
    new_whole = adamw_update(*whole, **kwargs)
    new_slice = adamw_update(*(t[10:25] for t in whole), **kwargs)
    for full, part in zip(new_whole, new_slice, strict=True):
        np.testing.assert_array_equal(full.asnumpy()[10:25], part.asnumpy())


def test_low_precision_parameters_follow_a_float32_master(
        caplog: pytest.LogCaptureFixture) -> None:
    dtypes = {"layers.0.mlp.weight": ms.float16, "layers.0.norm.weight": ms.bfloat16}
    with caplog.at_level(logging.WARNING, logger="mf_train.optim"):
        named = make_params(dtypes=dtypes)
        opt = AdamW(named, weight_decay=0.0)
    said = [record.getMessage() for record in caplog.records]
    assert [message.startswith("bfloat16 parameters (layers.0.norm.weight) on the CPU")
            for message in said] == ([True] if _on_cpu() else [])
    start = {n: values(named)[n].astype(np.float64) for n in dtypes}
    ref = {n: (start[n], 0.0, 0.0) for n in dtypes}
    for step in range(3):
        grads = dict(zip(SHAPES, make_grads(step), strict=True))
        opt.step([Tensor(g) for g in grads.values()], 1e-4)
        for n in dtypes:
            ref[n] = np_adamw(*ref[n][:1], grads[n], *ref[n][1:], step + 1, 1e-4, 0.0,
                              (0.9, 0.95), 1e-8)
    state = opt.state_dict()
    for name, dtype in dtypes.items():
        master = state[f"main_param.{name}"]
        assert master.dtype == np.float32
        np.testing.assert_allclose(master, ref[name][0], rtol=1e-6, atol=1e-7)
        param = dict(named)[name]
        assert param.dtype == dtype
        expected = Tensor(master).astype(dtype).float().asnumpy()
        np.testing.assert_array_equal(param.float().asnumpy(), expected)
    assert not any(key.startswith("main_param.layers.0.attn") for key in state)


def _on_cpu() -> bool:
    return ms.get_context("device_target") == "CPU"


def test_reload_main_params_from_model_follows_newly_loaded_weights() -> None:
    named = make_params(dtypes={"layers.0.mlp.weight": ms.float16})
    opt = AdamW(named)
    param = dict(named)["layers.0.mlp.weight"]
    loaded = np.full(param.shape, 0.5, np.float16)
    param.set_data(Tensor(loaded))
    opt.reload_main_params_from_model()
    np.testing.assert_array_equal(opt.state_dict()["main_param.layers.0.mlp.weight"], 0.5)


# ----- Newton-Schulz -----

@pytest.mark.parametrize("shape", [(8, 8), (6, 16), (16, 6)])
def test_newton_schulz_matches_numpy_and_is_nearly_orthogonal(shape) -> None:
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    out = newton_schulz(Tensor(x), (QUINTIC,) * 5).asnumpy()
    np.testing.assert_allclose(out, np_newton_schulz(x.astype(np.float64)), rtol=1e-5,
                               atol=1e-5)
    # The iteration acts on each singular value s alone: s -> a s + b s^3 + c s^5, five
    # times, from s / ||x||_F; the quintic leaves values that start above ~0.05 in about
    # [0.68, 1.14] (not exactly 1: Keller Jordan trades accuracy for a steep slope at 0).
    a, b, c = QUINTIC
    expected = np.linalg.svd(x.astype(np.float64), compute_uv=False) / np.linalg.norm(x)
    for _ in range(5):
        expected = a * expected + b * expected**3 + c * expected**5
    singular = np.linalg.svd(out.astype(np.float64), compute_uv=False)
    np.testing.assert_allclose(np.sort(singular), np.sort(expected), rtol=1e-5)
    assert singular.min() > 0.67 and singular.max() < 1.14, singular


def test_newton_schulz_of_a_transpose_is_the_transpose() -> None:
    x = np.random.default_rng(8).standard_normal((5, 9)).astype(np.float32)
    wide = newton_schulz(Tensor(x), (QUINTIC,) * 5).asnumpy()
    tall = newton_schulz(Tensor(x.T.copy()), (QUINTIC,) * 5).asnumpy()
    np.testing.assert_array_equal(tall, wide.T)


def test_newton_schulz_of_zero_is_zero_not_nan() -> None:
    out = newton_schulz(Tensor(np.zeros((4, 6), np.float32)), (QUINTIC,) * 5).asnumpy()
    np.testing.assert_array_equal(out, 0.0)


# ----- Muon -----

@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_matches_numpy_over_steps_with_changing_lr(nesterov) -> None:
    named = make_params(seed=1)
    betas, wd, momentum = (0.9, 0.95), 0.1, 0.9
    config = OptimizerConfig(type="Muon", betas=list(betas), weight_decay=wd,
                             extras={"momentum": momentum, "nesterov": nesterov})
    opt = build_optimizer(config, named)
    assert opt.groups_summary()["muon"] == ["layers.0.mlp.weight", "layers.0.attn.weight"]
    ref = {n: (v.astype(np.float64), 0.0, 0.0) for n, v in values(named).items()}
    for step in range(3):
        grads = make_grads(step)
        opt.step([Tensor(g) for g in grads], LRS[step])
        for (name, (p, m, v)), g in zip(ref.items(), grads, strict=True):
            wd_here = wd if decays(name) else 0.0
            if name in ("layers.0.mlp.weight", "layers.0.attn.weight"):
                ref[name] = (*np_muon(p, g, m, LRS[step], wd_here, momentum, nesterov), None)
            else:
                ref[name] = np_adamw(p, g, m, v, step + 1, LRS[step], wd_here, betas, 1e-8)
    state = opt.state_dict()
    for name, (p, m, v) in ref.items():
        np.testing.assert_allclose(values(named)[name], p, rtol=1e-6, atol=1e-6)
        if v is None:
            np.testing.assert_allclose(state[f"muon_m.{name}"], m, rtol=1e-6, atol=1e-6)
            assert f"adam_m.{name}" not in state
        else:
            np.testing.assert_allclose(state[f"adam_m.{name}"], m, rtol=1e-6, atol=1e-7)
            assert f"muon_m.{name}" not in state


def test_muon_update_rms_matches_adamw_scale() -> None:
    """Moonlight: the update's RMS is about matched_adamw_rms * lr, whatever the shape."""
    for shape in [(8, 32), (32, 8), (16, 16)]:
        named = [("w", Parameter(Tensor(np.zeros(shape, np.float32)), name="w"))]
        opt = Muon(named, settings=MuonSettings(matched_adamw_rms=0.2))
        grad = np.random.default_rng(9).standard_normal(shape).astype(np.float32)
        opt.step([Tensor(grad)], 0.01)
        rms = np.sqrt(np.mean(named[0][1].asnumpy() ** 2))
        assert 0.7 * 0.002 < rms < 1.2 * 0.002, (shape, rms)


def test_muon_settings_reach_the_update() -> None:
    named = [("w", Parameter(Tensor(np.ones((4, 6), np.float32)), name="w"))]
    settings = MuonSettings(momentum=0.5, nesterov=False, ns_steps=2, matched_adamw_rms=0.3)
    opt = Muon(named, settings=settings, weight_decay=0.2)
    grad = np.arange(24, dtype=np.float32).reshape(4, 6) / 24
    for lr in (0.1, 0.2):
        opt.step([Tensor(grad)], lr)
    buf = grad + 0.5 * grad
    expected = np.ones((4, 6)) * (1 - 0.1 * 0.2) - 0.1 * 0.3 * np.sqrt(6) * np_newton_schulz(
        grad.astype(np.float64), steps=2)
    expected = expected * (1 - 0.2 * 0.2) - 0.2 * 0.3 * np.sqrt(6) * np_newton_schulz(buf, 2)
    np.testing.assert_allclose(named[0][1].asnumpy(), expected, rtol=1e-6, atol=1e-6)


# ----- state dicts -----

@pytest.mark.parametrize("kind", ["AdamW", "Muon"])
def test_state_dict_round_trip_continues_bit_identically(kind) -> None:
    dtypes = {"layers.0.attn.weight": ms.float16}
    config = OptimizerConfig(type=kind, weight_decay=0.05)
    named = make_params(seed=2, dtypes=dtypes)
    first = build_optimizer(config, named)
    run(first, range(3))
    saved = first.state_dict()
    weights = {n: p.asnumpy().copy() for n, p in named}

    resumed_named = [(n, Parameter(Tensor(weights[n]), name=n)) for n in SHAPES]
    resumed = build_optimizer(config, resumed_named)
    resumed.load_state_dict(saved)
    assert resumed.global_step == 3
    run(first, range(3, 6))
    run(resumed, range(3, 6))
    for (name, a), (_, b) in zip(named, resumed_named, strict=True):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy(), err_msg=name)
    for key, value in first.state_dict().items():
        np.testing.assert_array_equal(value, resumed.state_dict()[key], err_msg=key)


@pytest.mark.parametrize("kind", ["AdamW", "Muon"])
def test_a_step_not_kept_changes_nothing_and_is_uncounted(kind) -> None:
    """`keep` false (decided on the device) with non-finite gradients and a device clip
    coefficient: parameters, float16 masters and moments stay bit-identical, and after
    `uncount` the run goes on exactly as one that never had that step."""
    dtypes = {"layers.0.attn.weight": ms.float16}
    config = OptimizerConfig(type=kind, weight_decay=0.05)
    named, plain_named = make_params(seed=2, dtypes=dtypes), make_params(seed=2, dtypes=dtypes)
    gated, plain = build_optimizer(config, named), build_optimizer(config, plain_named)
    run(gated, range(2))
    run(plain, range(2))
    bad = [Tensor(np.full(g.shape, np.nan, np.float32)) for g in make_grads(2)]
    gated.step(bad, 0.1, clip=Tensor(np.float32(np.nan)), keep=Tensor(False))
    gated.uncount()
    keep = Tensor(True)
    for step in range(2, 5):  # kept steps with the device arguments equal the plain ones
        gated.step([Tensor(g) for g in make_grads(step)], LRS[step % len(LRS)],
                   clip=Tensor(np.float32(1.0)), keep=keep)
    run(plain, range(2, 5))
    for (name, a), (_, b) in zip(named, plain_named, strict=True):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy(), err_msg=name)
    for key, value in plain.state_dict().items():
        np.testing.assert_array_equal(gated.state_dict()[key], value, err_msg=key)


def test_state_dict_is_a_copy() -> None:
    opt = AdamW(make_params())
    run(opt, range(1))
    state = opt.state_dict()
    state["adam_m.embed.weight"][:] = 99.0
    assert not np.any(opt.state_dict()["adam_m.embed.weight"] == 99.0)


def test_load_state_dict_names_missing_extra_and_misshaped_keys() -> None:
    opt = build_optimizer(OptimizerConfig(type="Muon"), make_params())
    run(opt, range(1))
    before = opt.state_dict()
    bad = dict(before)
    del bad["muon_m.layers.0.mlp.weight"]
    bad["adam_m.not.a.param"] = np.zeros(3, np.float32)
    bad["adam_v.embed.weight"] = np.zeros((4, 12), np.float32)
    bad["adam_m.embed.weight"] = np.zeros((12, 4), np.int32)
    with pytest.raises(OptimizerStateError) as info:
        opt.load_state_dict(bad)
    message = str(info.value)
    assert "missing 1 key(s): muon_m.layers.0.mlp.weight" in message
    assert "unexpected 1 key(s): adam_m.not.a.param" in message
    assert "adam_v.embed.weight: expected shape (12, 4), got (4, 12)" in message
    assert "adam_m.embed.weight: expected floating-point values, got int32" in message
    for key, value in opt.state_dict().items():  # nothing was changed
        np.testing.assert_array_equal(value, before[key])


def test_load_state_dict_checks_the_step() -> None:
    opt = AdamW(make_params())
    state = opt.state_dict()
    state["global_step"] = np.array([1.5])
    with pytest.raises(OptimizerStateError, match="global_step: expected one integer >= 0"):
        opt.load_state_dict(state)


# ----- step arguments -----

def test_step_rejects_wrong_gradients_and_learning_rates() -> None:
    opt = AdamW(make_params())
    grads = [Tensor(g) for g in make_grads(0)]
    with pytest.raises(ValueError, match="got 4 gradients for 5 parameters"):
        opt.step(grads[:4], 0.1)
    with pytest.raises(ValueError, match=r"gradient of 'embed.weight' has shape \(4, 12\)"):
        opt.step([Tensor(np.zeros((4, 12), np.float32)), *grads[1:]], 0.1)
    with pytest.raises(ValueError, match="learning rate must be a finite number >= 0"):
        opt.step(grads, float("nan"))
    assert opt.global_step == 0


def test_constructor_rejects_bad_parameter_lists() -> None:
    with pytest.raises(ValueError, match="no parameters"):
        AdamW([])
    p = Parameter(Tensor(np.zeros(2, np.float32)), name="p")
    with pytest.raises(ValueError, match=r"more than once: \['a'\]"):
        AdamW([("a", p), ("a", p)])
    q = Parameter(Tensor(np.zeros(2, np.int32)), name="q")
    with pytest.raises(ValueError, match="parameter 'q' is Int32"):
        AdamW([("q", q)])
