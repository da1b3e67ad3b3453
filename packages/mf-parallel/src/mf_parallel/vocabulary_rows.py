"""When fully sharded data parallelism keeps the vocabulary tables as each rank's rows.

Under FSDP the embedding table and an untied head (`[vocabulary, hidden]`) can stay split by
rows over the shard group, never gathered, the tokens travelling to them instead
(`runtime.sharded_vocabulary`). One rule decides it, read by the runtime, by mf-train's layout
and by mf-memory's estimate. Pure Python.
"""

from __future__ import annotations

EXACT_IDS = 1 << 24
"""Token ids travel as float32 (the CPU backend's all-reduce, which emulates the all-gather
over a subgroup, takes no integers): exact up to 2^24."""


def keeps_vocabulary_rows(vocab_size: int, shards: int, tensor_parallel: int = 1,
                          pipeline_parallel: int = 1) -> bool:
    """Whether FSDP over `shards` ranks keeps the vocabulary tables as rows.

    Args:
        vocab_size: the model's vocabulary.
        shards: the shard group's size.
        tensor_parallel: the tensor-parallel degree (tensor parallelism splits the vocabulary
            its own way: the tables are then gathered with the root unit).
        pipeline_parallel: the pipeline degree (the embedding and the head must be on one
            stage).

    Returns:
        True for more than one shard, no tensor or pipeline parallelism, and a vocabulary of
        at most `EXACT_IDS` that the shards divide.
    """
    return (shards > 1 and tensor_parallel == 1 and pipeline_parallel == 1
            and 0 < vocab_size <= EXACT_IDS and vocab_size % shards == 0)
