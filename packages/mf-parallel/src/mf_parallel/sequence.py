"""What tensor and context parallelism need of the sequence length.

Context parallelism splits each sequence over the context ranks; with a causal mask the
sequence is cut into 2 x context chunks so that every rank gets an early and a late chunk
(equal attention work; Megatron-LM and MindSpore's ring attention do this). Sequence
parallelism, on whenever tensor parallelism is, then splits each rank's part over the tensor
ranks. Both splits must be exact.
"""

from __future__ import annotations

from .errors import PlanError


def sequence_divisor(tensor: int, context: int, causal: bool = True) -> int:
    """The number the sequence length must be a multiple of, so both splits are exact.

    Args:
        tensor: the tensor-parallel degree (sequence parallelism splits over it).
        context: the context-parallel degree.
        causal: whether the mask is causal (then 2 x context chunks, for load balancing).

    Returns:
        2 x context x tensor with a causal mask and context parallelism, else context x tensor.
    """
    chunks = 2 * context if context > 1 and causal else context
    return chunks * tensor


def check_sequence_length(seq_length: int, tensor: int, context: int,
                          causal: bool = True) -> None:
    """Refuse a sequence length the context and tensor ranks cannot split evenly.

    Args:
        seq_length: the model's sequence length.
        tensor: the tensor-parallel degree.
        context: the context-parallel degree.
        causal: whether the mask is causal.

    Raises:
        PlanError: the length is not a multiple of `sequence_divisor`; names the degrees.
    """
    divisor = sequence_divisor(tensor, context, causal)
    if seq_length % divisor == 0:
        return
    parts = []
    if context > 1:
        parts.append(f"context_parallel ({context})" + (" x 2 (causal load balancing)"
                                                         if causal else ""))
    if tensor > 1:
        parts.append(f"tensor_parallel ({tensor}, sequence parallelism)")
    raise PlanError(f"seq_length {seq_length} must be a multiple of {' x '.join(parts)} = "
                    f"{divisor}")


def context_spans(seq_length: int, context: int, rank: int, causal: bool = True) -> list[range]:
    """The parts of the whole sequence one context rank holds, in the order it holds them.

    With a causal mask the sequence is cut into 2 x context chunks and rank r holds chunks r
    and 2 x context - 1 - r, so every rank attends over as many keys (Megatron-LM's
    `get_batch_on_this_cp_rank`); otherwise rank r holds the r-th of `context` chunks.

    Args:
        seq_length: tokens of the whole sequence.
        context: the context-parallel degree.
        rank: this rank's place in its context group.
        causal: whether the mask is causal (`context_parallel_mask_type`).

    Returns:
        Token index ranges, `seq_length / context` tokens in all.

    Raises:
        PlanError: the length does not split, or the rank is outside the group.
    """
    if not 0 <= rank < context:
        raise PlanError(f"context rank {rank} is outside 0..{context - 1}")
    check_sequence_length(seq_length, 1, context, causal)
    if context == 1:
        return [range(seq_length)]
    if not causal:
        size = seq_length // context
        return [range(rank * size, (rank + 1) * size)]
    size = seq_length // (2 * context)
    late = 2 * context - 1 - rank
    return [range(rank * size, (rank + 1) * size), range(late * size, (late + 1) * size)]
