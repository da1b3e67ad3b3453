"""Probes: what users and operators do to a run by accident, tried on real runs, each judged
held or failed.

    python benchmarks/probes.py [--only WORD] [--list] [--keep DIR]

Each probe starts `mf-train` (the tiny Qwen3 of examples/, narrowed as the tests narrow it:
4 steps, checkpoints at steps 2 and 4) in processes of its own, does one thing wrong to it,
and checks what a user is promised:

- bad input (YAML, `--set`, data files): a non-zero status and ONE line saying what is wrong,
  no traceback; nothing trained;
- a signal (SIGINT, SIGTERM, SIGHUP) at a point of the run: it stops at a step's end, saves,
  and the same command resumes to the losses of a run never stopped;
- `kill -9` of the process, the launcher, msrun, a rank: no process of the job left, the
  locks freed (the same command runs), and it resumes exactly;
- a damaged checkpoint (a piece truncated, flipped or gone, `common.json` edited or garbled,
  the tracker garbled or naming a missing step): named in one line, and the run falls back
  to the newest intact checkpoint and reaches the losses of a run never damaged;
- the faults of the environment and the causes found by hand before (a diverging run, a
  user's files in the save path, symbolic links where the run writes, a full disk, a memory
  limit, a busy master port, a model too large, an unbounded configuration file, an id out
  of the vocabulary, a `load_path` with nothing to load).

It prints one line per probe as it goes, then a table of held/failed per category, and exits
non-zero when any probe failed. Not part of CI: all probes take several minutes (the results
are in benchmarks/README.md). Test helpers are shared with the suite (tests/train/runs.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "train"), str(ROOT / "tests")]

from runs import QWEN3, QWEN3_4_LAYERS, arguments, losses  # noqa: E402

from mf_parallel.msrun import kill_group  # noqa: E402

TIMEOUT = 300.0
"""Seconds one mf-train process of a probe may take before it counts as hung."""


@attrs.define
class Ran:
    """One finished mf-train process."""

    status: int
    out: str
    err: str

    def last(self) -> str:
        lines = self.err.strip().splitlines()
        return lines[-1] if lines else ""


@attrs.frozen
class Probe:
    category: str
    name: str
    check: Callable[[Path], str | None]
    """Returns None when the probe held, else what went wrong (one line)."""


PROBES: list[Probe] = []


def probe(category: str, name: str):
    def register(check: Callable[[Path], str | None]) -> Callable[[Path], str | None]:
        PROBES.append(Probe(category, name, check))
        return check
    return register


# ------------------------------------------------------------------------------- running

class Context:
    """What every probe shares: the corpus and a run never disturbed."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.prefix = str(base / "data" / "tiny_text_document")
        self._reference: dict[int, float] | None = None
        self._saved: Path | None = None
        self._lock = threading.Lock()

    def args(self, out: Path, *sets: str, config: Path = QWEN3) -> list[str]:
        return arguments(config, out, self.prefix, [*QWEN3_4_LAYERS, *sets])

    @property
    def reference(self) -> dict[int, float]:
        """The losses of the 4-step run, never stopped."""
        if self._reference is None:
            out = self.saved
            self._reference = losses(out)
        return self._reference

    @property
    def saved(self) -> Path:
        """A finished 4-step run (checkpoints at steps 2 and 4), not to be changed: copy it."""
        with self._lock:
            return self._make_saved()

    def _make_saved(self) -> Path:
        if self._saved is None:
            out = self.base / "reference"
            ran = Ran(0, "", "") if logged_steps(out) == 4 else mf_train(self.args(out))
            if ran.status != 0:
                raise SystemExit(f"the reference run failed: {ran.last()}")
            self._saved = out
        return self._saved

    def copy_of_saved(self, work: Path) -> Path:
        out = work / "out"
        shutil.copytree(self.saved, out, symlinks=True,
                        ignore=shutil.ignore_patterns(".mf-run.lock"))
        # the copy's settings name the reference's save path: the probe runs with its own
        return out


CTX: Context


def command(args: Sequence[str], prologue: str | None = None) -> list[str]:
    if prologue is None:
        return [sys.executable, "-m", "mf_train.launch.cli", *args]
    return [sys.executable, "-c", prologue + "\nfrom mf_train.launch.cli import run\n"
            "raise SystemExit(run(sys.argv[1:]))\n", *args]


def start(args: Sequence[str], *, prologue: str | None = None,
          env: dict[str, str] | None = None, preexec: Callable[[], None] | None = None,
          log: Path | None = None) -> subprocess.Popen:
    """mf-train in a session of its own (so that its whole job can be killed)."""
    stderr = open(log, "wb") if log is not None else subprocess.PIPE  # noqa: SIM115
    process = subprocess.Popen(command(args, prologue), stdout=subprocess.PIPE,
                               stderr=stderr, env={**os.environ, **(env or {})},
                               start_new_session=True, preexec_fn=preexec)
    if log is not None:
        stderr.close()
    return process


def finish(process: subprocess.Popen, timeout: float = TIMEOUT, log: Path | None = None) -> Ran:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(process)
        out, err = process.communicate()
        err = (err or b"") + f"\n(probe: killed after {timeout:.0f} s)".encode()
    if log is not None:
        err = log.read_bytes()
    return Ran(process.returncode, (out or b"").decode(errors="replace"),
               (err or b"").decode(errors="replace"))


def mf_train(args: Sequence[str], **kwargs) -> Ran:
    timeout = kwargs.pop("timeout", TIMEOUT)
    return finish(start(args, **kwargs), timeout)


def one_line(ran: Ran, *, status: int | None = None, says: str = "") -> str | None:
    """None when `ran` failed as promised: `status` (any non-zero when None), its last line
    `mf-train: ...` holding `says`, no traceback."""
    if "Traceback" in ran.err:
        return f"a traceback (status {ran.status}): {ran.last()[:150]}"
    if (ran.status == 0) if status is None else (ran.status != status):
        return f"status {ran.status}, expected {status or 'non-zero'}: {ran.last()[:150]}"
    lines = ran.err.strip().splitlines()
    # a configuration's problems: a `mf-train: N problems ...` line, then one line each
    said = [line for line in lines if line.startswith(("mf-train: ", "mf-data: "))]
    listed = bool(said) and "in the configuration:" in said[-1] and lines[-1].startswith("  ")
    if not (ran.last().startswith(("mf-train: ", "mf-data: ")) or listed):
        return f"last line {ran.last()[:200]!r}"
    if says not in ran.last():
        return f"the line does not say {says!r}: {ran.last()[:200]!r}"
    return None


def same_losses(out: Path, ranks: bool = False) -> str | None:
    """None when `out`'s losses are the undisturbed run's: equal, or, for a run of 2 ranks
    (`ranks`: data parallel, whose reductions round otherwise), within 1e-5 of them."""
    reference = CTX.reference
    try:
        got = losses(out)
    except (OSError, ValueError) as exc:
        return f"no metrics: {exc}"
    close = got.keys() == reference.keys() and all(
        abs(got[step] - reference[step]) <= 1e-5 * abs(reference[step]) for step in got)
    if (got != reference) if not ranks else not close:
        return f"losses {got} differ from the undisturbed run's {reference}"
    return None


def wait_for(condition: Callable[[], bool], process: subprocess.Popen,
             timeout: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if condition():
            return True
        time.sleep(0.05)
    return False


def logged_steps(out: Path) -> int:
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    return sum(1 for line in lines if line.strip() and '"event"' not in line)


def job_processes(marker: str) -> list[int]:
    """Processes whose command line names `marker` (a probe's own directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace")
                state = (entry / "stat").read_text().rpartition(")")[2].split()[:1]
                if marker in cmdline and state != ["Z"]:
                    found.append(int(entry.name))
    return found


def no_orphans(work: Path, within: float = 15.0) -> str | None:
    deadline = time.monotonic() + within
    while (left := job_processes(str(work))) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return f"{len(left)} process(es) of the job left behind"
    return None


# -------------------------------------------------------------------------- bad YAML

YAML_CASES = {
    "syntax error": "training: {steps: 3\n",
    "tab indentation": "training:\n\tsteps: 3\n",
    "unknown top-level key": "trainig:\n  steps: 3\n",
    "unknown nested key": "model:\n  hiden_size: 32\n",
    "wrong type": "training:\n  steps: ten\n",
    "negative steps": "training:\n  steps: -4\n",
    "empty file": "",
    "a list at the top": "- 1\n- 2\n",
    "duplicate key": "training:\n  steps: 3\n  steps: 4\n",
    "string learning rate": "optimizer:\n  learning_rate: fast\n",
    "vocab_size 2e9 (F1)": "model:\n  vocab_size: 2000000000\n",
    "hidden not divisible by heads": "model:\n  hidden_size: 33\n",
    "alias bomb": "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
                  "c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c]\n"
                  "e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n",
    "deep nesting": "a: " + "[" * 5000 + "]" * 5000 + "\n",
    "null section": "model: null\n",
    "save_max 0 with a bad type": "checkpoint:\n  save_max: many\n",
}


def _yaml_probe(text: str) -> Callable[[Path], str | None]:
    def check(work: Path) -> str | None:
        config = work / "train.yaml"
        base = QWEN3.read_text() if "top" not in text and text else ""
        config.write_text(base + "\n" + text if base else text)
        out = work / "out"
        result = one_line(mf_train(CTX.args(out, config=config), timeout=120))
        if result is None and (out / "metrics.jsonl").exists():
            return "trained anyway"
        return result
    return check


for _name, _text in YAML_CASES.items():
    probe("bad YAML", _name)(_yaml_probe(_text))


@probe("bad YAML", "non-UTF-8 bytes")
def _(work: Path) -> str | None:
    config = work / "train.yaml"
    config.write_bytes(QWEN3.read_bytes() + b"\nmodel:\n  name: \xff\xfe\n")
    return one_line(mf_train(CTX.args(work / "out", config=config), timeout=120))


@probe("bad YAML", "missing file")
def _(work: Path) -> str | None:
    return one_line(mf_train(CTX.args(work / "out", config=work / "absent.yaml"), timeout=120))


@probe("bad YAML", "a directory as --config")
def _(work: Path) -> str | None:
    return one_line(mf_train(CTX.args(work / "out", config=work), timeout=120))


@probe("bad YAML", "--config /dev/zero (F2)")
def _(work: Path) -> str | None:
    return one_line(mf_train(CTX.args(work / "out", config=Path("/dev/zero")), timeout=60))


@probe("bad YAML", "a FIFO as --config")
def _(work: Path) -> str | None:
    os.mkfifo(work / "fifo.yaml")
    return one_line(mf_train(CTX.args(work / "out", config=work / "fifo.yaml"), timeout=60))


@probe("bad YAML", "a 100 MiB config (F2)")
def _(work: Path) -> str | None:
    config = work / "huge.yaml"
    with open(config, "w") as handle:
        handle.write(QWEN3.read_text())
        handle.write("# " + "x" * (100 << 20) + "\n")
    return one_line(mf_train(CTX.args(work / "out", config=config), timeout=120))


@probe("bad YAML", "--set an unknown key")
def _(work: Path) -> str | None:
    return one_line(mf_train(CTX.args(work / "out", "model.hiden=3"), timeout=120))


@probe("bad YAML", "--set a bad value")
def _(work: Path) -> str | None:
    return one_line(mf_train(CTX.args(work / "out", "training.steps=abc"), timeout=120))


@probe("bad YAML", "--set without =")
def _(work: Path) -> str | None:
    return one_line(mf_train(CTX.args(work / "out", "training.steps"), timeout=120))


# -------------------------------------------------------------------------- bad data files

def _data_copy(work: Path) -> Path:
    data = work / "data"
    data.mkdir()
    for suffix in (".bin", ".idx"):
        shutil.copy(CTX.prefix + suffix, data / ("tiny_text_document" + suffix))
    return data / "tiny_text_document"


def _with_data(work: Path, prefix: Path | str, *sets: str) -> Ran:
    args = arguments(QWEN3, work / "out", str(prefix), [*QWEN3_4_LAYERS, *sets])
    return mf_train(args, timeout=180)


def _data_probe(name: str, damage: Callable[[Path], None]) -> None:
    @probe("bad data", name)
    def _(work: Path) -> str | None:
        prefix = _data_copy(work)
        damage(prefix)
        return one_line(_with_data(work, prefix))


_data_probe("the .bin missing", lambda p: p.with_suffix(".bin").unlink())
_data_probe("the .idx missing", lambda p: p.with_suffix(".idx").unlink())
_data_probe("the .bin truncated", lambda p: os.truncate(p.with_suffix(".bin"), 100))
_data_probe("the .bin empty", lambda p: os.truncate(p.with_suffix(".bin"), 0))
_data_probe("the .idx garbage", lambda p: p.with_suffix(".idx").write_bytes(os.urandom(4096)))
_data_probe("the .idx truncated", lambda p: os.truncate(p.with_suffix(".idx"), 40))
_data_probe("the .idx empty", lambda p: os.truncate(p.with_suffix(".idx"), 0))
_data_probe("the .bin a directory", lambda p: (p.with_suffix(".bin").unlink(),
                                               p.with_suffix(".bin").mkdir()))


@probe("bad data", "an id beyond the vocabulary, met in training")
def _(work: Path) -> str | None:
    """The byte corpus ends documents with EOD 256; a 256-token model meets it."""
    return one_line(mf_train(CTX.args(work / "out", "model.vocab_size=256")))


@probe("held, but", "an id beyond the vocabulary, --scan-tokens before launch")
def _(work: Path) -> str | None:
    out = work / "out"
    ran = mf_train([*CTX.args(out, "model.vocab_size=256"), "--scan-tokens"])
    if (out / "metrics.jsonl").exists():
        return "trained before refusing"
    return one_line(ran, status=2, says="outside the model's vocabulary")


@probe("bad data", "a data_path weight that is not a number")
def _(work: Path) -> str | None:
    sets = [*QWEN3_4_LAYERS, f"train_dataset.dataloader.config.data_path=['x','{CTX.prefix}']"]
    return one_line(mf_train(["--config", str(QWEN3), "--output-dir", str(work / "out"),
                              *[a for s in sets for a in ("--set", s)]], timeout=120))


@probe("bad data", "data_path at a directory")
def _(work: Path) -> str | None:
    return one_line(_with_data(work, work))


# ----------------------------------------------------------------------------- signals

def _stop_at(work: Path, sigs: Sequence[int], after_steps: int, *,
             before_start: bool = False, extra: Sequence[str] = ()) -> tuple[Ran, Path]:
    """mf-train, and `sigs` sent once `after_steps` steps are logged (or once it prints its
    first line, `before_start`)."""
    out = work / "out"
    log = work / "stderr.txt"
    process = start([*CTX.args(out), *extra], log=log)
    if before_start:
        wait_for(lambda: log.stat().st_size > 0, process)
    else:
        wait_for(lambda: logged_steps(out) >= after_steps, process)
    for sig in sigs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, sig)
        time.sleep(0.3)
    return finish(process, log=log), out


def _signal_probe(sig: signal.Signals, after: int, *, before_start: bool = False,
                  extra: Sequence[str] = ()) -> None:
    where = "while starting" if before_start else f"after step {after}"
    ranks = " (2 ranks)" if extra else ""

    @probe("signals", f"{sig.name} {where}{ranks}")
    def _(work: Path) -> str | None:
        ran, out = _stop_at(work, [sig], after, before_start=before_start, extra=extra)
        if "Traceback" in ran.err:
            return f"a traceback: {ran.last()[:150]}"
        if ran.status == 0 and logged_steps(out) < 4:
            return f"status 0 though stopped at step {logged_steps(out)}"
        again = mf_train([*CTX.args(out), *extra])
        if again.status != 0:
            return f"the same command failed: {again.last()[:200]}"
        return same_losses(out, ranks=bool(extra))


for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    _signal_probe(_sig, 1)
    _signal_probe(_sig, 3)
_signal_probe(signal.SIGINT, 0, before_start=True)
_signal_probe(signal.SIGTERM, 0, before_start=True)
_signal_probe(signal.SIGTERM, 1, extra=("--nproc", "2", "--timeout", "300"))
_signal_probe(signal.SIGHUP, 1, extra=("--nproc", "2", "--timeout", "300"))


@probe("signals", "double Ctrl-C before the first checkpoint (F3)")
def _(work: Path) -> str | None:
    ran, out = _stop_at(work, [signal.SIGINT, signal.SIGINT], 1)
    if "Traceback" in ran.err:
        return "a traceback"
    if not any(out.glob("ckpt/iteration_*")) and "checkpoint is kept" in ran.err:
        return f"claims a checkpoint is kept where none exists: {ran.last()[:150]}"
    again = mf_train(CTX.args(out))
    if again.status != 0:
        return f"the same command was refused: {again.last()[:200]}"
    return same_losses(out)


# ------------------------------------------------------------------------------ kill -9

def _kill_probe(name: str, victim: Callable[[subprocess.Popen, Path], int | None], *,
                extra: Sequence[str] = (), after: int = 2) -> None:
    @probe("kill -9", name)
    def _(work: Path) -> str | None:
        out = work / "out"
        log = work / "stderr.txt"
        process = start([*CTX.args(out), *extra], log=log)
        wait_for(lambda: logged_steps(out) >= after, process)
        pid = victim(process, out)
        if pid is None:
            kill_group(process)
            return "found nothing to kill"
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=60)
        if process.poll() is None:
            kill_group(process)
            return "the launcher did not end after its job was killed"
        left = no_orphans(work)
        if left:
            return left
        again = mf_train([*CTX.args(out), *extra])
        if again.status != 0:
            return f"the same command failed: {again.last()[:200]}"
        return same_losses(out, ranks=bool(extra))


def _descendant(process: subprocess.Popen, name: str = "", marker: str = "") -> int | None:
    """A process below `process` whose command name is `name` or whose output goes to a file
    whose name ends with `marker` (a rank's log)."""
    from mf_parallel.msrun import _descendants, proc_stat

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for pid in _descendants(process.pid):
            with contextlib.suppress(OSError):
                output = os.readlink(f"/proc/{pid}/fd/1")
                if (name and proc_stat(pid)[1:2] == [name]) or (marker and output.endswith(
                        marker)):
                    return pid
        time.sleep(0.1)
    return None


_NPROC = ("--nproc", "2", "--timeout", "300")
_kill_probe("the process", lambda p, out: p.pid)
_kill_probe("the process at its first step", lambda p, out: p.pid, after=0)
_kill_probe("the launcher", lambda p, out: p.pid, extra=_NPROC)
_kill_probe("msrun (F6)", lambda p, out: _descendant(p, name="msrun"), extra=_NPROC)
_kill_probe("rank 1", lambda p, out: _descendant(p, marker="worker_1.log"), extra=_NPROC)


@probe("kill -9", "the process during a save")
def _(work: Path) -> str | None:
    out = work / "out"
    log = work / "stderr.txt"
    process = start(CTX.args(out), log=log)
    saving = wait_for(lambda: any((out / "ckpt").glob("iteration_*.tmp-*"))
                      or any((out / "ckpt").glob("iteration_*/*.part-*")), process)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    left = no_orphans(work)
    if left:
        return left
    again = mf_train(CTX.args(out))
    if again.status != 0:
        return f"the same command failed: {again.last()[:200]}"
    return same_losses(out) if saving else "(the save was never caught; resumed)"


# -------------------------------------------------------------------- damaged checkpoints

def _damage_probe(name: str, damage: Callable[[Path], None]) -> None:
    @probe("damaged checkpoint", name)
    def _(work: Path) -> str | None:
        out = CTX.copy_of_saved(work)
        ckpt = out / "ckpt"
        damage(ckpt)
        ran = mf_train(CTX.args(out))
        if "Traceback" in ran.err:
            return f"a traceback: {ran.last()[:150]}"
        if ran.status != 0:
            return f"status {ran.status}: {ran.last()[:200]}"
        return same_losses(out)


def _piece(ckpt: Path, kind: str = "model") -> Path:
    return sorted((ckpt / "iteration_00000004").rglob(f"*{kind}*.safetensors"))[0]


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _edit_common(ckpt: Path, key: str, value: object) -> None:
    path = ckpt / "iteration_00000004" / "common.json"
    common = json.loads(path.read_text())
    common[key] = value
    path.write_text(json.dumps(common))


_damage_probe("a model piece truncated", lambda c: os.truncate(_piece(c), 1000))
_damage_probe("a model piece's byte flipped", lambda c: _flip(_piece(c)))
_damage_probe("a model piece deleted", lambda c: _piece(c).unlink())
_damage_probe("an optimizer piece truncated", lambda c: os.truncate(_piece(c, "opt"), 1000))
_damage_probe("an optimizer piece's byte flipped", lambda c: _flip(_piece(c, "opt")))
_damage_probe("common.json consumed_samples edited (F8)",
              lambda c: _edit_common(c, "consumed_samples", 3))
_damage_probe("common.json global_step edited (F8)", lambda c: _edit_common(c, "global_step", 3))
_damage_probe("common.json garbled",
              lambda c: (c / "iteration_00000004" / "common.json").write_text("{not json"))
_damage_probe("common.json deleted", lambda c: (c / "iteration_00000004" / "common.json").unlink())
_damage_probe("the tracker reads banana (F7)",
              lambda c: (c / "latest_checkpointed_iteration.txt").write_text("banana"))
_damage_probe("the tracker names a missing step",
              lambda c: (c / "latest_checkpointed_iteration.txt").write_text("9"))
_damage_probe("the tracker empty",
              lambda c: (c / "latest_checkpointed_iteration.txt").write_text(""))


def _step_2_only_reference(ckpt: Path) -> None:
    shutil.rmtree(ckpt / "iteration_00000004")


_damage_probe("the newest checkpoint removed by hand", _step_2_only_reference)


# ---------------------------------------------------------------- faults and found causes

@probe("found causes", "a run diverging after its checkpoints (F14), then a sane lr")
def _(work: Path) -> str | None:
    out = work / "out"
    every_step = ("checkpoint.save_interleaved_steps=1", "checkpoint.save_max=1")
    first = mf_train(CTX.args(out, "training.steps=2", *every_step))
    if first.status != 0:
        return f"the first 2 steps failed: {first.last()[:150]}"
    ran = mf_train(CTX.args(out, "training.steps=6", *every_step,
                            "lr_scheduler.learning_rate=1e39"))
    problem = one_line(ran, status=1, says="diverged at step")
    if problem:
        return problem
    tracked = (out / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip()
    if tracked != "2" or not (out / "ckpt" / "iteration_00000002").is_dir():
        return f"the finite checkpoint of step 2 is gone (tracker: {tracked})"
    sane = mf_train(CTX.args(out, "training.steps=6", *every_step))
    if sane.status != 0:
        return f"the same command with a sane lr failed: {sane.last()[:200]}"
    return None


@probe("found causes", "the user's iteration_*.tmp-* and .del-* dirs in the save path (F9)")
def _(work: Path) -> str | None:
    out = work / "out"
    for name in ("iteration_00000009.tmp-mine", "iteration_00000002.del-notes"):
        (out / "ckpt" / name).mkdir(parents=True)
        (out / "ckpt" / name / "notes.txt").write_text("mine")
    ran = mf_train(CTX.args(out, "checkpoint.save_max=1"))
    kept = all((out / "ckpt" / n / "notes.txt").exists()
               for n in ("iteration_00000009.tmp-mine", "iteration_00000002.del-notes"))
    if not kept:
        return "the user's directory was removed"
    return None if ran.status == 0 else f"status {ran.status}: {ran.last()[:150]}"


def _link_probe(where: str, *, resumed: bool, target_is_dir: bool = False) -> None:
    @probe("found causes", f"a symbolic link at {where} (F10)")
    def _(work: Path) -> str | None:
        out = CTX.copy_of_saved(work) if resumed else work / "out"
        target = work / "precious"
        if target_is_dir:
            target.mkdir()
            (target / "keep.txt").write_text("precious")
        else:
            target.write_text("precious")
        link = out / where
        if link.exists() or link.is_symlink():
            link.unlink()
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
        ran = mf_train(CTX.args(out))
        if target_is_dir:
            changed = [p.name for p in target.iterdir()] != ["keep.txt"]
        else:
            changed = target.read_text() != "precious"
        if changed:
            return "the link's target was changed"
        return one_line(ran, says="symbolic link")


_link_probe("logs/train.log", resumed=True)
_link_probe("metrics.jsonl", resumed=True)
_link_probe(".mf-run.lock", resumed=False)
_link_probe("tensorboard", resumed=False, target_is_dir=True)
_link_probe("tensorboard/events.out.tfevents.1.host.0", resumed=True)
_link_probe("hang", resumed=False, target_is_dir=True)
_link_probe("hang/rank_0.txt", resumed=False)
_link_probe("logs/msrun.log", resumed=False)
_link_probe("logs/scheduler.log", resumed=False)
_link_probe("profile", resumed=False, target_is_dir=True)


FULL_DISK = """
import errno, os, sys
from mf_train.checkpoint import writer
def full(path, tensors, metadata=None):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
writer.write_safetensors_streamed = full
"""


@probe("found causes", "a full disk at the first save, then space (F11, simulated)")
def _(work: Path) -> str | None:
    out = work / "out"
    ran = mf_train(CTX.args(out), prologue="import sys" + FULL_DISK)
    problem = one_line(ran, says="no space left in ")
    if problem:
        return problem
    if str(out / "ckpt") not in ran.last():
        return f"the line does not name the directory: {ran.last()[:150]}"
    again = mf_train(CTX.args(out))
    if again.status != 0:
        return f"the same command with space failed: {again.last()[:200]}"
    return same_losses(out)


@probe("found causes", "prlimit --as=1GiB (F12)")
def _(work: Path) -> str | None:
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return one_line(mf_train(CTX.args(work / "out"), preexec=limit), says="memory")


@probe("found causes", "--master-port in use, one node (F13)")
def _(work: Path) -> str | None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ran = mf_train([*CTX.args(work / "out"), "--nproc", "2", "--master-port", str(port)],
                       timeout=120)
    return one_line(ran, says=str(port))


@probe("found causes", "--master-port in use, --nnodes 2 (F13)")
def _(work: Path) -> str | None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        nodes = [start([*CTX.args(work / f"node{rank}", "parallelism.data_parallel_shard=1"),
                        "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                        "--master-port", str(port), "--hang-timeout", "40"])
                 for rank in (0, 1)]
        ran = [finish(node, timeout=200) for node in nodes]
    for rank, result in enumerate(ran):
        problem = one_line(result, says=str(port))
        if problem:
            return f"node {rank}: {problem}"
    return no_orphans(work)


@probe("found causes", "a model too large for the host (F1)")
def _(work: Path) -> str | None:
    return one_line(mf_train(CTX.args(work / "out", "model.hidden_size=65536",
                                      "model.intermediate_size=262144",
                                      "model.num_attention_heads=512",
                                      "model.num_key_value_heads=512")), says="")


@probe("held, but", "load_path at a directory without a checkpoint")
def _(work: Path) -> str | None:
    (work / "empty").mkdir()
    ran = mf_train(CTX.args(work / "out", f"checkpoint.load_path={work / 'empty'}"))
    return one_line(ran, status=2, says=str(work / "empty"))


@probe("found causes", "a second run into the same directory while one runs")
def _(work: Path) -> str | None:
    out = work / "out"
    first = start(CTX.args(out, "training.steps=40"))
    wait_for(lambda: logged_steps(out) >= 1, first)
    second = mf_train(CTX.args(out), timeout=120)
    kill_group(first)
    first.communicate()
    return one_line(second, status=2, says="in use by another run")


@probe("found causes", "an output directory under a file")
def _(work: Path) -> str | None:
    (work / "file").write_text("x")
    return one_line(mf_train(CTX.args(work / "file" / "out"), timeout=120))


# -------------------------------------------------------------------------------- main

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the probes whose category or name "
                        "contains this (case-insensitive)")
    parser.add_argument("--jobs", type=int, default=1, help="probes run at once (each "
                        "starts its own processes; default 1)")
    parser.add_argument("--list", action="store_true", help="list the probes and exit")
    parser.add_argument("--keep", type=Path, default=None,
                        help="work in this directory and keep it (default: a temporary one)")
    args = parser.parse_args(argv)
    chosen = [p for p in PROBES
              if args.only.lower() in f"{p.category} {p.name}".lower()]
    if args.list:
        for p in chosen:
            print(f"{p.category}: {p.name}")
        return 0
    base = args.keep or Path(tempfile.mkdtemp(prefix="mf-probes-"))
    base.mkdir(parents=True, exist_ok=True)
    global CTX
    CTX = Context(base)
    if not Path(CTX.prefix + ".bin").exists():
        (base / "data").mkdir(exist_ok=True)
        subprocess.run([sys.executable, "-m", "mf_data", "preprocess", "--input",
                        str(ROOT / "examples" / "data" / "tiny.jsonl"), "--output-prefix",
                        CTX.prefix], check=True, capture_output=True)
    def one(number: int, p: Probe) -> tuple[Probe, str | None, float]:
        work = base / f"probe_{number:03d}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        began = time.monotonic()
        try:
            problem = p.check(work)
        except Exception as exc:
            problem = f"the probe itself failed: {type(exc).__name__}: {exc}"[:300]
        leftover = no_orphans(work, within=5.0) if problem is None else None
        problem = problem or leftover
        seconds = time.monotonic() - began
        verdict = "held  " if problem is None else "FAILED"
        print(f"{verdict} {seconds:5.0f} s  {p.category}: {p.name}"
              + ("" if problem is None else f"\n         {problem}"), flush=True)
        return p, problem, seconds

    CTX.reference  # noqa: B018 - the undisturbed run, once, before the probes
    began = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(one, range(len(chosen)), chosen))
    print()
    print("| category | probes | held | failed |\n|---|---:|---:|---:|")
    for category in dict.fromkeys(p.category for p, _, _ in results):
        mine = [problem for p, problem, _ in results if p.category == category]
        held = sum(problem is None for problem in mine)
        print(f"| {category} | {len(mine)} | {held} | {len(mine) - held} |")
    held = sum(problem is None for _, problem, _ in results)
    total = time.monotonic() - began
    print(f"| all | {len(results)} | {held} | {len(results) - held} |")
    print(f"\n{total:.0f} s in all; work in {base}")
    if args.keep is None:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if held == len(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
