"""Which failures `--max-restarts` retries, and the back-off between attempts."""

from __future__ import annotations

import json
from pathlib import Path

from mf_train.launch.restarts import backoff, logged_step, not_retried, record_restart


def test_an_input_error_or_the_same_step_failing_twice_is_not_retried() -> None:
    killed = "rank 1 was killed by SIGKILL (log: logs/worker_1.log)"
    assert not_retried(killed, 4, None) is None
    assert not_retried(killed, 6, 4) is None  # it got further: a fault, again
    assert not_retried(killed, 4, 4) == (
        "it failed again without passing step 4, where the previous attempt failed (the same "
        "step failing twice is not retried)")
    assert not_retried("rank 0 failed: mf_data.errors.DataError: token 70000 >= vocab_size",
                       0, None) == ("a DataError is not retried (the same command would meet "
                                    "it again)")
    assert [backoff(attempt) for attempt in (1, 2, 3, 8)] == [1.0, 2.0, 4.0, 60.0]


def test_the_restart_event_follows_the_logged_steps(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"event": "start", "step": 0}\n'
                                            '{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n')
    assert logged_step(tmp_path) == 2
    record_restart(tmp_path, 1, 2, "rank 1 was killed by SIGKILL", 1.0)
    last = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert {key: last[key] for key in ("event", "attempt", "step", "cause", "wait_s")} == {
        "event": "restart", "attempt": 1, "step": 2, "cause": "rank 1 was killed by SIGKILL",
        "wait_s": 1.0}
    assert logged_step(tmp_path) == 2
    assert logged_step(tmp_path / "nothing") == 0
