"""The errors of mf-parallel: a layout that cannot work, and a multi-rank job that failed."""


class PlanError(ValueError):
    """The parallel layout does not fit the world size, the batch or the model; says why."""


class LaunchError(RuntimeError):
    """A multi-rank job failed or ran out of time; the message names the rank and its error.

    Raised by `mf_parallel.launch.run_ranks` (and importable from there).
    """


class JobHung(LaunchError):
    """No rank of a job progressed for its hang timeout; the message is the hang's report
    (`mf_parallel.hang_watch`)."""
