"""The one error type of the plan: a layout or batch setting that cannot work."""


class PlanError(ValueError):
    """The parallel layout does not fit the world size, the batch or the model; says why."""
