"""The lines a run ends with: what it did, and where its checkpoints, metrics and logs are;
or, for a run stopped by a signal, the one line saying where it stopped and saved.

Read from the files the run wrote (metrics.jsonl, the checkpoint directory), so the launcher
of a multi-rank job prints the same summary as a single process, after the ranks are gone.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..checkpoint import layout
from ..monitor.metrics import FILE_NAME as METRICS
from ..observe.callbacks import duration


def summary_lines(output_dir: Path, checkpoints: Path, tensorboard: Path,
                  seconds: float) -> list[str]:
    """`finished: ...` (or `nothing to do: ...`), then `checkpoints: ...`, then where the
    metrics, TensorBoard events and logs are.

    `finished steps 1-50 of 50 (50 in this run) in 19.1s; final loss 4.008488; val_loss
    4.120003 (val_ppl 61.56, step 50); mean 1468 tokens/s (global), MFU 2.1% (steps 2-50);
    peak memory 0.46 GiB` (the validation loss of the last evaluated step, when the run
    evaluated, and the test split's, when it evaluated that), where the means are over the
    steps' time (total tokens / total step time; each step's MFU weighted by its time, which
    is the MFU of that mean), the first step left out when there are several."""
    lines, total = _this_run(output_dir / METRICS)
    steps = [line["step"] for line in lines]
    if steps:
        last = lines[-1]
        head = (f"finished steps {steps[0]}-{steps[-1]} of {total} ({len(steps)} in this run) "
                f"in {duration(seconds)}; final loss {_loss(last)}"
                f"{_validation(lines)}{_throughput(lines)}{_peak_memory(last)}")
    else:
        head = (f"nothing to do: the run in {output_dir} had already finished its {total} steps"
                if total else f"no step was run ({duration(seconds)})")
    complete = layout.complete_iterations(checkpoints)
    newest = f" (newest: {complete[-1][1].name})" if complete else " (none saved)"
    return [head, f"checkpoints: {checkpoints}{newest}",
            f"metrics: {output_dir / METRICS}; TensorBoard: {tensorboard}; logs: "
            f"{output_dir / 'logs'}"]


def stopped_line(signal_name: str, output_dir: Path, checkpoints: Path) -> str:
    """The one line of a run a signal stopped at a step boundary.

    Args:
        signal_name: what stopped it (`SIGINT`).
        output_dir: the run's output directory (its metrics.jsonl says the last step).
        checkpoints: the run's checkpoint directory.

    Returns:
        `stopped by SIGINT after step 3 of 50; checkpoint saved: .../iteration_00000003 (run
        the same command to resume from it)`, or why nothing was saved.
    """
    lines, total = _this_run(output_dir / METRICS)
    steps = [line["step"] for line in lines]
    complete = layout.complete_iterations(checkpoints)
    if not steps:
        return (f"stopped by {signal_name} before the first step; nothing saved"
                + (f" (the newest checkpoint is {complete[-1][1]})" if complete else ""))
    head = f"stopped by {signal_name} after step {steps[-1]} of {total}"
    if complete and complete[-1][0] == steps[-1]:
        return (f"{head}; checkpoint saved: {complete[-1][1]} (run the same command to resume "
                "from it)")
    newest = f"the newest is {complete[-1][1]}" if complete else f"none in {checkpoints}"
    return f"{head}; no checkpoint saved at that step ({newest})"


def _this_run(metrics: Path) -> tuple[list[dict], int | None]:
    """The step lines logged since the last start or resume event, and the run's total."""
    if not metrics.is_file():
        return [], None
    steps: list[dict] = []
    total = None
    for line in metrics.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") in ("start", "resume"):
            steps, total = [], entry.get("total_steps")
        elif "event" not in entry:
            steps.append(entry)
    return steps, total


def _throughput(lines: list[dict]) -> str:
    """`; mean 1468 tokens/s (global), MFU 2.1% (steps 2-50)` over the steps' time, the first
    step left out when there are several (MFU only when every step has one)."""
    timed = lines[1:] or lines
    seconds = sum(line.get("step_time") or 0.0 for line in timed)
    if seconds <= 0:
        return ""
    text = f"; mean {sum(line.get('tokens', 0) for line in timed) / seconds:.0f} tokens/s " \
           "(global)"
    if all(line.get("mfu") is not None for line in timed):
        mfu = sum(line["mfu"] * (line.get("step_time") or 0.0) for line in timed) / seconds
        text += f", MFU {mfu * 100:.3g}%"
    first, last = timed[0]["step"], timed[-1]["step"]
    return f"{text} ({f'step {first}' if first == last else f'steps {first}-{last}'})"


def _validation(lines: list[dict]) -> str:
    """`; val_loss 4.120003 (val_ppl 61.56, step 50)`: the run's last evaluation, if any,
    then `; test_loss 4.2 (test_ppl 66.69, step 50)` when it evaluated the test split."""
    shown = ""
    for split in ("val", "test"):
        evaluated = [line for line in lines if f"{split}_loss" in line]
        if evaluated:
            last = evaluated[-1]
            loss, ppl = last[f"{split}_loss"], last.get(f"{split}_ppl")
            shown += (f"; {split}_loss {'n/a' if loss is None else f'{loss:.6f}'} "
                      f"({split}_ppl {'inf' if ppl is None else f'{ppl:.4g}'}, "
                      f"step {last['step']})")
    return shown


def _peak_memory(line: dict) -> str:
    """`; peak memory 4.61 GiB (rank 2)` from a step line that has it."""
    gib = line.get("peak_memory_gib")
    if gib is None:
        return ""
    rank = line.get("peak_memory_rank")
    return f"; peak memory {gib:.2f} GiB" + (f" (rank {rank})" if rank is not None else "")


def _loss(line: dict) -> str:
    """A step line's loss; metrics.jsonl writes one that is not finite as null."""
    value = line.get("loss")
    if value is not None:
        return f"{value:.6f}"
    return "n/a (skipped)" if line.get("skipped") else "not finite"
