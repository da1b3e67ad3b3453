"""When fully sharded data parallelism (`optim_grads_params`) frees gathered parameters.

Between steps each rank keeps only its slice of every parameter. A sharded unit (one decoder
layer, typically) gathers its parameters before its forward pass; `reshard_after_forward`
decides whether it frees them right after (and gathers them again for its backward pass:
less memory, one more all-gather) or keeps them until its backward pass is done.

The config's `reshard_after_forward_policy`, as torchtitan reads it:
- `always`: every unit reshards after forward;
- `never`: none does;
- `default`: every unit but the last reshards (the backward pass starts with the last unit,
  so freeing it would only gather it again at once), and none does with pipeline parallelism
  (each micro-batch would gather every unit again for its backward pass).
The model's own parameters outside any unit (embedding, final norm, head) are never resharded
after forward, for the same reason as the last unit.
"""

from __future__ import annotations

RESHARD_POLICIES = ("always", "never", "default")


def reshard_after_forward(policy: str, unit: int, num_units: int,
                          pipeline_parallel: int = 1) -> bool:
    """Whether one sharded unit frees its gathered parameters right after its forward pass.

    Args:
        policy: the config's `reshard_after_forward_policy`, one of `RESHARD_POLICIES`.
        unit: the unit's index, 0-based, in forward order.
        num_units: the number of units.
        pipeline_parallel: the pipeline degree (`default` never reshards with pipelining).

    Returns:
        True to free the parameters after forward and gather them again for backward.

    Raises:
        ValueError: an unknown policy, or a unit outside 0..num_units - 1.
    """
    if policy not in RESHARD_POLICIES:
        raise ValueError(f"reshard_after_forward_policy must be one of "
                         f"{', '.join(RESHARD_POLICIES)}, got {policy!r}")
    if not 0 <= unit < num_units:
        raise ValueError(f"unit {unit} is outside 0..{num_units - 1}")
    if policy != "default":
        return policy == "always"
    return pipeline_parallel == 1 and unit < num_units - 1


def reshard_plan(policy: str, num_units: int, pipeline_parallel: int = 1) -> list[bool]:
    """`reshard_after_forward` of every unit, so a model can set up its units at once.

    Args:
        policy: the config's `reshard_after_forward_policy`, one of `RESHARD_POLICIES`.
        num_units: the number of units.
        pipeline_parallel: the pipeline degree.

    Returns:
        One flag per unit, in forward order.
    """
    return [reshard_after_forward(policy, unit, num_units, pipeline_parallel)
            for unit in range(num_units)]
