"""Starting a failed job again by itself (`mf-train --nproc N --max-restarts K`).

When a rank fails or the job hangs (`mf_parallel.launch.run_ranks`), the launcher starts the
job again, from the newest complete checkpoint (or afresh when there is none: the run
directory's own decision, `run_directory.claim`), after a back-off, at most K times. Each
restart is a line on the console and a `restart` event in metrics.jsonl: `{"event":
"restart", "attempt": 1, "step": 4, "cause": "rank 1 was killed by SIGKILL ...", "wait_s":
1.0}` (`step`: the last step metrics.jsonl had logged).

A failure that would only fail again is not retried:
- an error in the input (the configuration, the data, a plan: `DETERMINISTIC` in the
  failure's message), which the same command meets again;
- a job that failed without logging a step beyond the one the previous attempt failed
  after (the same step failing twice: a bug or bad data at that step, not a fault).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..monitor.metrics import FILE_NAME as METRICS
from ..monitor.metrics import read_steps
from ..no_follow import open_no_follow

DETERMINISTIC = ("ConfigError", "DataError", "PlanError", "SettingsError")
"""Exception names whose failure the same command meets again: never retried."""
BACKOFF_SECONDS = 1.0
"""The wait before the first restart; it doubles with each one, up to `BACKOFF_LIMIT`."""
BACKOFF_LIMIT = 60.0


def logged_step(output_dir: Path) -> int:
    """The last step metrics.jsonl records (0: none)."""
    try:
        steps = read_steps(output_dir / METRICS)
    except (OSError, ValueError):
        return 0
    return steps[-1]["step"] if steps else 0


def not_retried(cause: str, step: int, failed_before: int | None) -> str | None:
    """Why the failure `cause` after step `step` is not retried, or None to retry it
    (`failed_before`: the step the previous attempt failed after, None on the first)."""
    named = next((name for name in DETERMINISTIC if name in cause), None)
    if named is not None:
        return f"a {named} is not retried (the same command would meet it again)"
    if failed_before is not None and step <= failed_before:
        return (f"it failed again without passing step {failed_before}, where the previous "
                "attempt failed (the same step failing twice is not retried)")
    return None


def backoff(attempt: int) -> float:
    """Seconds to wait before restart `attempt` (1-based)."""
    return min(BACKOFF_SECONDS * 2 ** (attempt - 1), BACKOFF_LIMIT)


def record_restart(output_dir: Path, attempt: int, step: int, cause: str,
                   wait: float) -> None:
    """Append the `restart` event to metrics.jsonl (never through a symbolic link)."""
    line = {"event": "restart", "attempt": attempt, "step": step, "cause": cause,
            "wait_s": wait, "time": round(time.time(), 3)}
    fd = open_no_follow(output_dir / METRICS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a", encoding="utf-8") as metrics:
        metrics.write(json.dumps(line) + "\n")
