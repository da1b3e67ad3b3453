"""Where a step's time goes: seconds per phase, over the ranks, and the slowest rank.

The trainer marks its phases (`mf_parallel.rank_progress.phase`); each rank adds up the
seconds it spends in each. A step's record covers one whole iteration of the training loop,
from the moment the previous step's record was made to the moment this one's is (so the
iteration's times sum to the wall time between two step lines):

* `data`: taking the step's micro-batches from the data stream (loader wait);
* `forward_backward`: the layout's forward and backward over the micro-batches;
* `reduction`: the gradient reduction and the global norm (`StepLayout.reduce`);
* `optimizer`: the update (clipping and the skip decision included);
* `readback`: reading the loss and norm back to the host, which waits for every kernel the
  step launched: on a device, whose kernels run asynchronously, most of the step's compute
  shows here rather than in the phases that launched it; on CPU mf launches kernels
  synchronously (`trainer.launch_synchronously_on_cpu`), so each phase holds its own work;
* `save`: the checkpoint saved after the previous step (its synchronous part: with
  `async_save` the writing goes on in the background);
* `other`: the rest (the stop vote at the step boundary, the callbacks and this record).

With several ranks, each phase is reported as its largest value over the ranks
(`time/<phase>`), its smallest (`time/<phase>_min`) and the rank with the largest
(`time/<phase>_rank`). A rank that waits for a slower one waits inside a collective (in
`reduction` for data parallelism), so the slowest rank (`time/slowest_rank`) is the one with
the most time in its own work (`data`, `forward_backward`, `optimizer`, `save`); the step line
also names that rank's phase furthest above the other ranks'.
"""

from __future__ import annotations

from collections.abc import Mapping

PHASES = ("data", "forward_backward", "reduction", "optimizer", "readback", "save")
"""The phases reported by name; `other` and `iteration` follow."""
REPORTED = (*PHASES, "other", "iteration")
OWN_WORK = ("data", "forward_backward", "optimizer", "save")
"""The phases in which a rank does its own work rather than wait for the others."""
PREFIX = "time/"


def own_times(spent: Mapping[str, float]) -> list[float]:
    """This rank's seconds in each of `REPORTED` from `rank_progress.phase_seconds()`."""
    named = [spent.get(phase, 0.0) for phase in PHASES]
    iteration = sum(spent.values())
    return [*named, max(iteration - sum(named), 0.0), iteration]


def step_times(every_rank: list[list[float]]) -> dict[str, float]:
    """The record's `time/...` values from each rank's `own_times`, in rank order."""
    out: dict[str, float] = {}
    for index, phase in enumerate(REPORTED):
        column = [times[index] for times in every_rank]
        slowest = max(range(len(column)), key=column.__getitem__)
        out[f"{PREFIX}{phase}"] = column[slowest]
        if len(every_rank) > 1:
            out[f"{PREFIX}{phase}_min"] = min(column)
            out[f"{PREFIX}{phase}_rank"] = slowest
    if len(every_rank) > 1:
        out[f"{PREFIX}slowest_rank"] = slowest_rank(every_rank)
    return out


def slowest_rank(every_rank: list[list[float]]) -> int:
    """The rank with the most seconds in `OWN_WORK`."""
    columns = [REPORTED.index(phase) for phase in OWN_WORK]
    return max(range(len(every_rank)),
               key=lambda rank: sum(every_rank[rank][column] for column in columns))


def format_step_times(extra: Mapping[str, float]) -> str:
    """`time data 2 ms fwd_bwd 180 ms reduce 31 ms optim 12 ms readback 0 ms save 0 ms
    other 4 ms, slowest rank 1 (data +25 ms)` from a record's values ('' without them)."""
    if f"{PREFIX}iteration" not in extra:
        return ""
    short = {"forward_backward": "fwd_bwd", "reduction": "reduce", "optimizer": "optim"}
    parts = [f"{short.get(phase, phase)} {extra[PREFIX + phase] * 1e3:.0f} ms"
             for phase in (*PHASES, "other")]
    text = "time " + " ".join(parts)
    rank = extra.get(f"{PREFIX}slowest_rank")
    if rank is not None:
        gaps = {phase: extra[PREFIX + phase] - extra[f"{PREFIX}{phase}_min"]
                for phase in OWN_WORK if extra[f"{PREFIX}{phase}_rank"] == rank}
        phase = max(gaps, key=gaps.__getitem__) if gaps else None
        text += f", slowest rank {rank:.0f}"
        if phase is not None:
            text += f" ({short.get(phase, phase)} +{gaps[phase] * 1e3:.0f} ms)"
    return text
