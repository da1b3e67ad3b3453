"""The runtime suite's msrun jobs, which the test_runtime_*.py files share: one job per world
size, launched the first time a test asks for one of its scenarios.

Each msrun job costs 10-20 s before its first collective (msrun, a scheduler and every rank
import MindSpore, then wait for the cluster), more than most scenarios take, so the scenarios
of a world size run one after the other in one job (workers/runtime_suite.py, which lists
them) and the test files read their results: `runtime_suite.results(2, "sharded")` is rank
0's, rank 1's, ... of that scenario. The `runtime_suite` fixture (conftest.py) hands every
test the same `RuntimeSuite`. When pytest-xdist runs the suite in several worker processes,
they share the jobs too: a file lock lets one worker launch a job while another that needs it
waits, then both read the same files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from session_files import shared_directory

from mf_parallel.launch import LaunchError, run_ranks

SUITE = Path(__file__).resolve().parent / "workers" / "runtime_suite.py"
TIMEOUT_SECONDS = 900
"""For a whole job: its scenarios took about 2 minutes with 4 ranks on 2 busy cores."""


class RuntimeSuite:
    """The runtime suite's jobs of this pytest session, each launched on first use.

    Args:
        base: a directory every worker process of the session sees; job `N` writes its
            results in `base/runtime_suite_N_ranks/<scenario>/rank<r>.json`.
    """

    def __init__(self, base: Path):
        self.base = base
        self._errors: dict[int, str | None] = {}

    def results(self, world: int, scenario: str, /, *, ranks: int | None = None,
                **params: object) -> list[dict]:
        """Each rank's results of `scenario` in the `world`-rank job (launched now if no test
        has asked for that job before), in rank order.

        Args:
            ranks: how many ranks the scenario writes (default: all of them; 1 for a
                scenario that rank 0 runs alone).
            params: what the test expects the scenario to have run with (its keyword
                arguments in runtime_suite.py, `world` among them: the one-process reference
                runs a one-rank plan inside the 2-rank job): a test fails, rather than
                comparing the wrong results, if the two files disagree.
        """
        error = self._launch(world)
        directory = self.base / f"runtime_suite_{world}_ranks" / scenario
        files = [directory / f"rank{rank}.json" for rank in range(ranks or world)]
        if not all(file.exists() for file in files):
            pytest.fail(f"the {world}-rank runtime suite has no results of {scenario!r}: "
                        f"{error or 'the job finished without them'}", pytrace=False)
        results = [json.loads(file.read_text()) for file in files]
        ran = results[0].pop("params")
        for result in results[1:]:
            result.pop("params")
        different = {name: ran.get(name) for name, value in params.items()
                     if ran.get(name) != value}
        if different:
            pytest.fail(f"the runtime suite ran {scenario!r} with {different}, the test "
                        f"expects {params}", pytrace=False)
        return results

    def _launch(self, world: int) -> str | None:
        """Run the `world`-rank job unless a process of this session has run it; its error
        (None: it succeeded). A failed job is not run again: the scenarios it finished keep
        their results, the others fail with its error."""
        if world not in self._errors:
            def launch(job: Path) -> None:
                job.mkdir(parents=True)
                try:
                    result = run_ranks(SUITE, world, log_dir=job / "logs",
                                       timeout=TIMEOUT_SECONDS, args=[str(job)])
                    outcome = {"error": None, "seconds": result.seconds}
                except LaunchError as exc:
                    outcome = {"error": str(exc)}
                (job / "status.json").write_text(json.dumps(outcome))

            job = shared_directory(self.base / f"runtime_suite_{world}_ranks", launch)
            self._errors[world] = json.loads((job / "status.json").read_text())["error"]
        return self._errors[world]
