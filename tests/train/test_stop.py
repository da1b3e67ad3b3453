"""A run ends when its owner says so. SIGINT or SIGTERM to `mf-train` (one process, or the
launcher of `--nproc 2`, which forwards it to its ranks) stops the run at the next step
boundary with a checkpoint, one line saying where, no traceback and status 128 + the signal;
the same command then resumes, with the losses of the uninterrupted run. A second Ctrl-C
aborts at once, in one line. A launcher killed with SIGKILL takes every process of its job
with it, and its lock is held until they are gone."""

from __future__ import annotations

import contextlib
import fcntl
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest

pytest.importorskip("mindspore")

from runs import QWEN3, QWEN3_2_LAYERS, arguments, losses, steps

from mf_train.checkpoint.layout import check_complete, iteration_name
from mf_train.launch.cli import run

STEP_ONE = re.compile(r" step \[\s*1/\d+\]")
"""The log line of the first step."""
REPLICATED = "parallelism.data_parallel_shard=1"


def mf_train(output: Path, prefix: str, *sets: str, nproc: int = 1) -> list[str]:
    """`mf-train`'s arguments for the 2-layer Qwen3 of `runs` (4 steps, a checkpoint every
    2) into `output`, with `sets`."""
    launch = ["--nproc", str(nproc), "--timeout", "600"] if nproc > 1 else []
    return [*arguments(QWEN3, output, prefix, [*QWEN3_2_LAYERS, *sets]), *launch]


def signalled(args: Sequence[str], signals: Sequence[int], *, watch: str,
              after: re.Pattern = STEP_ONE, gap: float = 0.0,
              program: Sequence[str] = ("-m", "mf_train.launch.cli")) -> tuple[int, str]:
    """Run `python program args` (`mf-train args`) in a new process, send it `signals` (`gap`
    seconds apart) once a line of its `watch` stream ("stdout" or "stderr") matches `after`,
    and wait for it to end (killed after 600 s). Returns its exit status and whole stderr."""
    job = subprocess.Popen([sys.executable, *program, *args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    other = "stderr" if watch == "stdout" else "stdout"
    texts: dict[str, str] = {}
    drain = threading.Thread(target=lambda: texts.update({other: getattr(job, other).read()}))
    drain.start()
    deadline = threading.Timer(600, job.kill)
    deadline.start()
    try:
        watched, seen = getattr(job, watch), []
        for line in watched:
            seen.append(line)
            if after.search(line):
                break
        else:
            pytest.fail(f"the run ended before a line matched {after.pattern!r}: {seen[-5:]}")
        for sig in signals:
            job.send_signal(sig)
            time.sleep(gap)
        texts[watch] = "".join(seen) + watched.read()
        drain.join()
        job.wait()
    finally:
        deadline.cancel()
        if job.poll() is None:
            job.kill()
            job.wait()
    return job.returncode, texts["stderr"]


def saved_line(name: str, output: Path, step: int, total: int = 4) -> str:
    return (f"mf-train: stopped by {name} after step {step} of {total}; checkpoint saved: "
            f"{output / 'ckpt' / iteration_name(step)} (run the same command to resume from it)")


@pytest.fixture(scope="module")
def uninterrupted(runs) -> dict[int, float]:
    """The one-process run's losses, steps 1-4 (the session's shared run)."""
    return losses(runs(QWEN3, *QWEN3_2_LAYERS))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_stops_the_run_at_a_step_and_the_same_command_resumes(
        uninterrupted, data_prefix, tmp_path: Path, capsys, sig: int) -> None:
    """Before, Ctrl-C printed a KeyboardInterrupt traceback, saved nothing, and the same
    command was then refused ("holds an earlier run ... but no checkpoint")."""
    out = tmp_path / "out"
    args = mf_train(out, data_prefix)
    status, err = signalled(args, [sig], watch="stderr")
    stopped_at = steps(out)[-1]["step"]
    assert 1 <= stopped_at < 4  # the step boundary after the signal (usually step 1's)
    assert status == 128 + sig, err
    assert err.strip().splitlines()[-1] == saved_line(signal.Signals(sig).name, out,
                                                      stopped_at)
    assert err.count("mf-train: stopped by") == 1
    assert "Traceback" not in err and "finished steps" not in err
    assert check_complete(out / "ckpt" / iteration_name(stopped_at)) == []
    assert run(args) == 0  # the same command
    assert (f"resuming from its checkpoint {out / 'ckpt' / iteration_name(stopped_at)}"
            in capsys.readouterr().err)
    assert losses(out) == uninterrupted


SLOW_STEPS = """
import sys, time
from mf_train import trainer
from mf_train.launch.cli import run

real = trainer.Trainer.run_step

def run_step(self, stream):  # each step announced, then 2 s long: the signals come in it
    print(f"step {self.step_count + 1} starts", file=sys.stderr, flush=True)
    time.sleep(2)
    return real(self, stream)

trainer.Trainer.run_step = run_step
sys.exit(run(sys.argv[1:]))
"""


def test_a_second_ctrl_c_aborts_at_once_in_one_line(data_prefix, tmp_path: Path,
                                                    capsys) -> None:
    """Two Ctrl-C 0.3 s apart in step 2, before the first checkpoint: the first asks for a
    stop at the step's end, the second ends the run at once, in one line saying that no
    checkpoint exists, saving nothing; the same command then starts afresh and says so."""
    out = tmp_path / "out"
    args = mf_train(out, data_prefix)
    status, err = signalled(args, [signal.SIGINT, signal.SIGINT], watch="stderr",
                            after=re.compile("step 2 starts"), gap=0.3,
                            program=("-c", SLOW_STEPS))
    assert status == 130, err
    assert err.strip().splitlines()[-1] == (
        f"mf-train: second SIGINT: stopped at once, nothing saved; no checkpoint was saved in "
        f"{out / 'ckpt'} (run the same command to start afresh)")
    assert "Traceback" not in err and "mf-train: stopped by" not in err
    assert [line["step"] for line in steps(out)] == [1]  # step 2 never ended
    assert run(args) == 0
    assert (f"mf-train: {out} holds an earlier run that saved no checkpoint (metrics.jsonl "
            "logs 1 step): starting afresh") in capsys.readouterr().err
    assert [line["step"] for line in steps(out)][-4:] == [1, 2, 3, 4]


def console_script(module: str) -> tuple[str, ...]:
    """A console script's entry point run as the script runs it, with each import's end on
    stderr (`-X importtime`)."""
    return ("-X", "importtime", "-c",
            f"import sys; from {module} import main; sys.exit(main())")


@pytest.mark.parametrize(("program", "module"), [("mf-train", "mf_train.launch.script"),
                                                 ("mf-train-rank", "mf_train.launch.rank_worker")])
def test_ctrl_c_while_starting_is_one_line(data_prefix, tmp_path: Path, monkeypatch,
                                           program, module) -> None:
    """Ctrl-C in the seconds the program's own modules import (before the run's handlers
    exist): one line, status 130, nothing written; for `mf-train` and for `mf-train-rank`
    started by hand (as msrun would, without the launcher). `-X importtime` says when
    mf-config is being imported: the console script's handler is in place by then."""
    monkeypatch.setenv("MS_WORKER_NUM", "1")  # what msrun gives a rank
    monkeypatch.delenv("MF_TRAIN_LAUNCHED", raising=False)
    out = tmp_path / "out"
    status, err = signalled(mf_train(out, data_prefix), [signal.SIGINT], watch="stderr",
                            after=re.compile(r"\|\s+mf_config"), program=console_script(module))
    assert status == 130, err
    assert err.strip().splitlines()[-1] == (f"{program}: stopped by SIGINT while starting; "
                                            "nothing was run or written")
    assert "Traceback" not in err and not out.exists()


# ------------------------------------------------------------------ the launcher of ranks

@pytest.mark.ranks
def test_sigterm_to_the_launcher_stops_every_rank_at_one_step(runs, data_prefix,
                                                              tmp_path: Path, capsys) -> None:
    """Before, the launcher died alone: msrun and the ranks went on training, unwatched, and
    the lock was released. 12 steps: the ranks run ahead of the step lines the launcher
    echoes, by a few steps on a loaded machine."""
    uninterrupted = losses(runs(QWEN3, *QWEN3_2_LAYERS, REPLICATED, "training.steps=12",
                                nproc=2))
    out = tmp_path / "out"
    args = mf_train(out, data_prefix, REPLICATED, "training.steps=12", nproc=2)
    status, err = signalled(args, [signal.SIGTERM], watch="stdout")
    stopped_at = steps(out)[-1]["step"]
    assert stopped_at < 12  # it did not run to the end
    assert status == 143, err
    assert err.strip().splitlines()[-1] == saved_line("SIGTERM", out, stopped_at, 12)
    assert "Traceback" not in err and err.count("mf-train: stopped by") == 1
    # both ranks stopped at that step: its checkpoint holds both ranks' files, committed
    assert check_complete(out / "ckpt" / iteration_name(stopped_at)) == []
    assert run(args) == 0  # the same command
    assert "resuming from its checkpoint" in capsys.readouterr().err
    assert losses(out) == uninterrupted


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _lock_free(directory: Path) -> bool:
    """Whether nothing holds `directory`'s run lock now (taken and let go at once)."""
    with open(directory / ".mf-run.lock", encoding="utf-8") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
    return True


@pytest.mark.ranks
def test_a_launcher_killed_takes_every_process_of_its_job_with_it(data_prefix,
                                                                 tmp_path: Path) -> None:
    """kill -9 of the launcher: msrun, its scheduler and the ranks are gone within seconds,
    and the lock on the output and checkpoint directories is held until they are."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "mf_train.launch.cli",
               *mf_train(out, data_prefix, REPLICATED, "training.steps=50", nproc=2)]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
    family: list[psutil.Process] = []
    try:
        for line in launcher.stdout:
            if STEP_ONE.search(line):
                break
        else:
            pytest.fail(f"the launcher ended before its first step: {launcher.wait()}")
        family = psutil.Process(launcher.pid).children(recursive=True)
        ranks = [p for p in family if [Path(part).name for part in p.cmdline()[1:2]]
                 == ["mf-train-rank"]]
        assert len(ranks) == 3  # msrun's scheduler and the two workers
        launcher.kill()
        launcher.wait(timeout=30)
        freed_early, deadline = [], time.monotonic() + 15
        while (alive := [p for p in family if _alive(p)]) and time.monotonic() < deadline:
            if any(p in ranks for p in alive) and _lock_free(out):
                freed_early.append([p.pid for p in alive])
            time.sleep(0.01)
        assert alive == [], [(p.pid, p.cmdline()[:2]) for p in alive]
        assert freed_early == []
        # A process whose main thread is a zombie may still be closing its files in another
        # thread (the last one out frees the memory first): the locks go a moment later.
        deadline = time.monotonic() + 5
        while not (_lock_free(out) and _lock_free(out / "ckpt")) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _lock_free(out) and _lock_free(out / "ckpt")
    finally:
        for process in family:
            with contextlib.suppress(psutil.Error):
                process.kill()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_exit_duration_stops_at_a_step_with_a_checkpoint(uninterrupted, data_prefix,
                                                         tmp_path: Path, capsys,
                                                         monkeypatch) -> None:
    """--exit-duration 1: the clock is moved an hour on once step 1 has run (the only fake
    here), so the run stops at the next boundary, saves step 1, exits 0 with one line; the
    same command without the fake clock resumes and ends as an uninterrupted run."""
    from mf_train import trainer

    real_step, real_time, ran = trainer.Trainer.run_step, time.time, []

    def run_step(self, stream):
        ran.append(self.step_count + 1)
        return real_step(self, stream)

    out = tmp_path / "out"
    args = [*mf_train(out, data_prefix), "--exit-duration", "1"]
    with monkeypatch.context() as patched:
        patched.setattr(trainer.Trainer, "run_step", run_step)
        patched.setattr(time, "time", lambda: real_time() + (3600 if ran else 0))
        assert run(args) == 0
    assert ran == [1]
    assert capsys.readouterr().err.strip().splitlines()[-1] == saved_line(
        "--exit-duration 1 min", out, 1)
    assert run(args) == 0  # the same command, within its hour
    assert losses(out) == uninterrupted
