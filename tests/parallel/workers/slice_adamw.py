"""MindSpore's AdamW on the slices of mf-parallel's sharded wrappers, their gradients reduced by
the production path (`ShardedGradients` with `GradientReducer.reduce_flat`, averaged over the
data-parallel ranks): the update the workers and test_fully_sharded_local.py compare with
plain data parallelism and with each other."""

from collections.abc import Sequence

from mindspore import Tensor
from mindspore.experimental.optim import AdamW

from mf_parallel.runtime import GradientReducer
from mf_parallel.runtime.flat_shard import built_shape
from mf_parallel.runtime.grad_shards import ShardedGradients
from mf_parallel.runtime.sharded import ShardedDataParallel


class SliceAdamW:
    """One AdamW over `wrapper`'s slices (`ShardedDataParallel` or `FullyShardedDataParallel`).

    Args:
        wrapper: the sharded wrapper.
        collectives: this rank's collectives.
        hyper: AdamW's settings (`lr`, `betas`, `eps`, `weight_decay`).
    """

    def __init__(self, wrapper, collectives, **hyper):
        self.wrapper, self.buffers = wrapper, wrapper.buffers
        params = wrapper.params
        reducer = GradientReducer.data_parallel(collectives, [built_shape(p) for p in params],
                                                average=True)
        self.grads = ShardedGradients(self.buffers, params, reducer.reduce_flat)
        self.optimizer = AdamW([b.master for b in self.buffers], **hyper)

    def step(self, grads: Sequence[Tensor]) -> None:
        """Reduce `grads` (aligned with the wrapper's `params`) to this rank's slices, update
        them, and (ZeRO) gather them into the model; FSDP's next forward gathers them."""
        if not isinstance(self.wrapper, ShardedDataParallel):
            self.wrapper.reshard()  # the step's passes are over
        self.grads.add_all(list(grads))
        slices = self.grads.take()
        self.optimizer(tuple(s.reshape(b.slice_shape) for b, s in zip(self.buffers, slices,
                                                                      strict=True)))
        if isinstance(self.wrapper, ShardedDataParallel):
            self.wrapper.publish([b.master + 0 for b in self.buffers])
