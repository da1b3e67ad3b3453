"""The tensor-parallel model workers' gradient reduction: the trainer's `GradientReducer`,
summing over the tensor group what `parallelize` marked as a partial sum."""

from mf_config import ModelConfig, ParallelismConfig, TrainingConfig
from mf_parallel import make_plan
from mf_parallel.placement import place_parameters
from mf_parallel.runtime import Collectives, GradientReducer
from mf_parallel.runtime.tensor_parallel import SEQUENCE_PARALLEL_ATTRIBUTE
from mf_train.models import sharding_table


def reduce_tensor_partial(collectives: Collectives, config: ModelConfig, params, grads,
                          sequence_parallel: bool, world: int) -> list:
    """`grads` of `params` summed over the tensor group where the model's parameters are
    marked partial. In the sequence-parallel case (the only one the trainer runs: always on
    with tensor_parallel > 1) the marks must be the placement record's `grad_partial`."""
    partial = [("loss", "tensor") if getattr(p, SEQUENCE_PARALLEL_ATTRIBUTE, False)
               else ("loss",) for p in params]
    if sequence_parallel:
        record = place_parameters(sharding_table(config), make_plan(
            ParallelismConfig(tensor_parallel=world), TrainingConfig(), world,
            num_layers=config.extras["num_hidden_layers"]))
        assert partial == [record[p.name].grad_partial for p in params]
    return GradientReducer(collectives, partial, [p.shape for p in params],
                           average=False).reduce_whole(grads)
