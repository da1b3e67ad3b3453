"""Step layouts: exactly one runs each plan, a registration mistake is caught, and the README's
example of a new layout runs (the 2-rank equalities are test_train_ranks.py's and
test_train_sharded.py's)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from regression_model import Regression, batch

from mf_config import (
    OptimizerConfig,
    ParallelismConfig,
    RecomputeCommConfig,
    SwapConfig,
    TrainingConfig,
)
from mf_parallel import PlanError, make_plan
from mf_parallel.runtime import Collectives, init_communication
from mf_train import layouts
from mf_train.layouts import (
    FSDP,
    ContextParallel,
    DataParallel,
    LayoutSections,
    Pipelined,
    SingleRank,
    StepLayout,
    TensorParallel,
    ZeRO,
    layout_for,
)
from mf_train.layouts.context_parallel import without_context
from mf_train.layouts.pipelined import without_pipeline
from mf_train.optim import build_optimizer
from mf_train.trainer import TrainStep

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")

README = Path(__file__).resolve().parents[2] / "packages" / "mf-train" / "README.md"
TRAINING = TrainingConfig(global_batch_size=8, local_batch_size=1)


def dims(world: int, **parallelism):
    config = ParallelismConfig(**parallelism)
    return make_plan(config, TRAINING, world).dims, config


@pytest.mark.parametrize(("world", "parallelism", "expected"), [
    (1, {}, SingleRank),
    (2, {"data_parallel_shard": 1}, DataParallel),
    (2, {"tensor_parallel": 2}, TensorParallel),
    (4, {"tensor_parallel": 2, "data_parallel_shard": 1}, TensorParallel),
    (2, {"data_parallel_shard_strategy": "optim"}, ZeRO),
    (2, {"data_parallel_shard_strategy": "optim_grads"}, ZeRO),
    (4, {"data_parallel_shard": 2, "data_parallel_shard_strategy": "optim_grads"}, ZeRO),
    (2, {"data_parallel_shard_strategy": "optim_grads_params"}, FSDP),
    (4, {"data_parallel_shard": 2}, FSDP),
    (4, {"tensor_parallel": 2, "data_parallel_shard_strategy": "optim"}, ZeRO),
    (4, {"tensor_parallel": 2}, FSDP),
    (8, {"tensor_parallel": 2, "data_parallel_shard": 2}, FSDP),
    (2, {"pipeline_parallel": 2}, Pipelined),
    (8, {"pipeline_parallel": 2, "tensor_parallel": 2}, Pipelined),
    (2, {"context_parallel": 2}, ContextParallel),
    (4, {"context_parallel": 2, "pipeline_parallel": 2}, Pipelined),
])
def test_the_plan_selects_its_layout(world, parallelism, expected) -> None:
    assert layout_for(*dims(world, **parallelism)) is expected


@pytest.mark.parametrize(("world", "parallelism", "inner", "replicate", "shard"), [
    (2, {"context_parallel": 2}, DataParallel, 2, 1),
    (4, {"context_parallel": 2}, FSDP, 1, 4),
    (4, {"context_parallel": 2, "data_parallel_shard": 1}, DataParallel, 4, 1),
    (4, {"context_parallel": 2, "tensor_parallel": 2, "data_parallel_shard": 1},
     TensorParallel, 2, 1),
    (8, {"context_parallel": 2, "data_parallel_shard": 2,
         "data_parallel_shard_strategy": "optim"}, ZeRO, 2, 4),
])
def test_context_ranks_count_as_data_ranks_for_the_inner_layout(world, parallelism, inner,
                                                                replicate, shard) -> None:
    """Sharded plans shard over shard x context (torchtitan's dp_shard_cp); unsharded ones
    replicate over data x context; the mesh's groups are the same ranks either way."""
    whole, config = dims(world, **parallelism)
    folded = without_context(whole)
    assert (folded.context, folded.data_replicate, folded.data_shard) == (1, replicate, shard)
    assert layout_for(folded, config) is inner
    from mf_parallel.mesh import RankMesh
    assert sorted(RankMesh(folded).groups("data")) == sorted(RankMesh(whole).groups("loss"))


@pytest.mark.parametrize(("world", "parallelism", "shards"), [
    (2, {"data_parallel_shard_strategy": "optim_grads_params"}, 2),
    (4, {"pipeline_parallel": 2}, 2),  # FSDP over each stage's 2 data ranks
    (4, {"context_parallel": 2}, 4),  # FSDP over data x context
    (8, {"context_parallel": 2, "pipeline_parallel": 2}, 4),  # each stage's data x context
    (4, {"expert_parallel": 2}, 4),  # FSDP over the 4 ranks, the experts left whole
    (2, {"data_parallel_shard_strategy": "optim_grads"}, None),
    (2, {"data_parallel_shard": 1}, None),
    (4, {"pipeline_parallel": 2, "data_parallel_shard": 1}, None),
    (2, {"context_parallel": 2, "data_parallel_shard": 1}, None),
    (4, {"context_parallel": 2, "pipeline_parallel": 2}, None),
    (1, {}, None),
])
def test_layers_are_cut_as_built_wherever_fsdp_runs(world, parallelism, shards) -> None:
    """FSDP, also inside the pipeline and context layouts, cuts each decoder layer to rank
    0's slice (over the group FSDP shards over) as the model builds it; every layout that
    keeps parameters whole leaves the layers as built."""
    from mf_parallel.mesh import RankMesh
    from mf_parallel.runtime.comm import Communication
    from mf_parallel.runtime.flat_shard import PRESLICED

    plan_dims, config = dims(world, **parallelism)
    comm = Communication(rank=0, world_size=world, device_target="CPU",
                         group_ranks=RankMesh(plan_dims).groups_of(0), group_names={})
    hook = layout_for(plan_dims, config).layer_built(plan_dims, config, Collectives(comm))
    assert (hook is not None) == (shards is not None)
    if hook is not None:
        layer = ms.nn.Dense(3, 5)  # a weight of 15 elements, a bias of 5
        hook(layer)
        assert [tuple(p.shape) for p in layer.trainable_params()] == [(0,), (0,)]
        assert tuple(getattr(layer, PRESLICED).shape) == (-(-15 // shards) + -(-5 // shards),)


@pytest.mark.parametrize("world", [4, 2])
def test_fsdp_under_expert_parallelism_cuts_layers_and_experts_apart(world) -> None:
    """A layer's routed experts (`mlp.experts.<id>.`) are left out when the rest of the layer
    is cut as built over the shard group; on 4 ranks (expert parallel 2: 2 ranks hold the
    same experts) they are cut apart, over their expert-data group, their slice recorded on
    the experts' cell; on 2 ranks (no other rank holds them) they stay whole."""
    from mf_parallel.mesh import RankMesh
    from mf_parallel.runtime.comm import Communication
    from mf_parallel.runtime.flat_shard import PRESLICED

    class Experts(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.experts = ms.nn.CellList([ms.nn.Dense(2, 2, has_bias=False)])

    class Layer(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.proj = ms.nn.Dense(3, 5)  # a weight of 15 elements, a bias of 5
            self.mlp = Experts()

    plan_dims, config = dims(world, expert_parallel=2)
    comm = Communication(rank=0, world_size=world, device_target="CPU",
                         group_ranks=RankMesh(plan_dims).groups_of(0), group_names={})
    layer = Layer()
    layout_for(plan_dims, config).layer_built(plan_dims, config, Collectives(comm))(layer)
    shapes = {p.name: tuple(p.shape) for p in layer.trainable_params()}
    sliced = world == 4
    assert shapes == {"proj.weight": (0,), "proj.bias": (0,),
                      "mlp.experts.0.weight": (0,) if sliced else (2, 2)}
    # over every rank: each tensor's chunk
    assert tuple(getattr(layer, PRESLICED).shape) == (-(-15 // world) + -(-5 // world),)
    if sliced:  # 4 elements over the 2 ranks holding the same experts
        assert tuple(getattr(layer.mlp.experts, PRESLICED).shape) == (2,)
    else:
        assert not hasattr(layer.mlp.experts, PRESLICED)


@pytest.mark.parametrize("strategy", ["optim", "optim_grads", "optim_grads_params"])
def test_sharding_with_tensor_parallelism_is_not_refused(strategy) -> None:
    """Data parallel 2 x tensor parallel 2: each sharded strategy runs (the 4-rank runs are
    test_train_sharded.py's)."""
    plan_dims, config = dims(4, tensor_parallel=2, data_parallel_shard_strategy=strategy)
    sections = LayoutSections(config, OptimizerConfig(), SwapConfig(), RecomputeCommConfig())
    layouts.check_layout(plan_dims, sections)


def test_no_plan_is_claimed_by_two_layouts() -> None:
    """Every plan of 1-8 ranks over the degrees and strategies: exactly one layout; with
    pipeline parallelism the pipeline layout, over the one layout that runs a stage's
    degrees; with context parallelism (on a stage) the context layout, over the one layout of
    the stage's degrees with context counted as data."""
    seen = 0
    for world, tp, cp, pp, shard, strategy in itertools.product(
            (1, 2, 4, 8), (1, 2), (1, 2), (1, 2), (-1, 1, 2),
            ("optim", "optim_grads", "optim_grads_params")):
        try:
            plan_dims, config = dims(world, tensor_parallel=tp, context_parallel=cp,
                                     pipeline_parallel=pp, data_parallel_shard=shard,
                                     data_parallel_shard_strategy=strategy)
        except PlanError:
            continue
        chosen = layout_for(plan_dims, config)
        stage = without_pipeline(plan_dims)
        assert chosen is (Pipelined if pp > 1 else layout_for(stage, config)), \
            plan_dims.describe()
        if cp > 1:
            assert layout_for(stage, config) is ContextParallel
            assert layout_for(without_context(stage), config) not in (
                None, Pipelined, ContextParallel)
        else:
            assert layout_for(stage, config) not in (None, Pipelined, ContextParallel)
        seen += 1
    assert seen > 100


def readme_example() -> str:
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    example = [block for block in blocks if "LAYOUTS" in block]
    assert len(example) == 1
    assert len(example[0].strip().splitlines()) <= 10
    return example[0]


def test_the_readme_layout_replaces_data_parallel_and_steps_like_one_process(
        monkeypatch) -> None:
    monkeypatch.setattr(layouts, "LAYOUTS", dict(layouts.LAYOUTS))
    namespace: dict[str, object] = {}
    exec(compile(readme_example(), str(README), "exec"), namespace)
    new = namespace["OneBucketDataParallel"]
    assert isinstance(new, type) and issubclass(new, StepLayout)
    assert layout_for(*dims(2, data_parallel_shard=1)) is new
    assert DataParallel not in layouts.LAYOUTS.values()

    collectives = Collectives(init_communication(make_plan(ParallelismConfig(), TRAINING, 1)))
    steps = []
    for make in (lambda m, o: SingleRank(m, o),
                 lambda m, o: new(m, o, collectives, ParallelismConfig())):
        model = Regression()
        optimizer = build_optimizer(OptimizerConfig(weight_decay=0.0), [("w", model.w)])
        steps.append(TrainStep(make(model, optimizer), max_norm=1.0))
    for seed in (1, 2):
        plain, example = (step([batch(seed)], lr=0.1) for step in steps)
        assert (plain.loss, plain.grad_norm) == (example.loss, example.grad_norm)
    np.testing.assert_array_equal(steps[0].layout.model.w.asnumpy(),
                                  steps[1].layout.model.w.asnumpy())
