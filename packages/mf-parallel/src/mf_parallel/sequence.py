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
