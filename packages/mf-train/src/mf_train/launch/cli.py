"""`mf-train --config FILE [--set key.path=value ...] [--output-dir DIR] [--nproc N]
[--nnodes N --node-rank R --master-addr HOST [--master-port P]]`, and
`mf-train export-hf ...` (a checkpoint as a Hugging Face directory: `export_command`), and
`mf-train generate ...` (text from a checkpoint: `generate_command`).

The whole configuration is validated first (mf-config, then mf-parallel's plan for the world
size, then the input files it names: `input_checks`), and only then are devices, data and the
model touched. A bad file exits with status 2 and every problem with its path and line; a
failure while training exits with status 1.

With `--nproc N` the launcher starts N ranks on this host through msrun (mf_parallel.launch:
127.0.0.1, a free port, the whole process group killed on failure or timeout); each rank runs
the `mf-train-rank` entry point (`rank_worker`) and writes its log to
`DIR/logs/worker_<rank>.log`, and the host's first rank's lines are shown on the console as
they come (`[rank 0] ...`). When a rank fails or is killed, the job stops within a second or
so and the launcher prints that rank's error and the path of its log; a rank that is stopped
or behind the others is named first (a healthy rank's failure in a collective waiting for it
is its consequence). When no rank progresses for `--hang-timeout` seconds (default 600; 0:
never), every rank dumps its Python stacks with its step, phase and last collective into
`DIR/hang/rank_<r>.txt`, the launcher prints one report naming the ranks behind, and exits
with status 3 (`mf_parallel.hang_watch`). With `--nnodes`, this host is one node of a job
over several hosts (`node_flags`): every check sees the whole job.

SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal closed) stop a run at its next step
boundary (`stop_signals`): it saves a checkpoint, prints one line saying where, and exits
with status 128 + the signal's number; a second signal aborts at once. The launcher forwards
the request to its ranks and, killed itself, takes its job with it (`mf_parallel.launch`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import attrs

from mf_config import ConfigError, TrainConfig
from mf_config.errors import ConfigWarning
from mf_config.validate import config_from_source, load_source
from mf_config.yaml_source import Source, UnreadableFile
from mf_data.errors import DataError
from mf_parallel import PlanError, rank_progress
from mf_parallel.launch import Forward, HangSettings, JobHung, LaunchError, Nodes, run_ranks
from mf_parallel.log_echo import MINDSPORE_INFO
from mf_parallel.msrun import path_with_interpreter

from ..monitor.tensorboard import event_dir
from ..no_follow import open_no_follow
from ..observe.peak_flops import (
    RANKS_ON_HOST,
    RATED,
    PeakError,
    check_given,
    given_peak,
    peak_dtype,
)
from ..preflight.input_checks import check_inputs, scan_token_ids
from ..preflight.run_directory import HANG_DIR, TRAIN_LOG, Claim, RunDirectoryError, claim
from . import export_command, generate_command
from .host_memory import HostMemoryError, check_host_memory, out_of_memory, out_of_memory_line
from .node_flags import NODE_OPTIONS, FlagError, add_node_flags, nodes_from
from .restarts import backoff, logged_step, not_retried, record_restart
from .resume_changes import changes
from .stop_signals import (
    EXIT_AT,
    LAUNCHED,
    LAUNCHER_PID,
    LAUNCHER_STOP,
    StopSignals,
    aborted_line,
    name,
    status,
)
from .summary import stopped_line, summary_lines

# `preflight.job` and `trainer` import MindSpore (about 2.7 s here), so they are imported where
# a run needs them: `mf-train --help` and usage errors answer at once.


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mf-train", description="Train the model a train.yaml describes, on MindSpore in "
        "PyNative mode.", epilog=f"`mf-train {export_command.COMMAND} --checkpoint DIR --output "
        "DIR` writes a checkpoint's model as a Hugging Face directory (`mf-train "
        f"{export_command.COMMAND} --help`); `mf-train {generate_command.COMMAND} --checkpoint "
        "DIR --prompt TEXT` continues a prompt with it.")
    parser.add_argument("--config", required=True, metavar="FILE", help="train.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a value, e.g. training.steps=10")
    parser.add_argument("--output-dir", default="./output", metavar="DIR",
                        help="logs, metrics.jsonl and TensorBoard events (default ./output)")
    parser.add_argument("--nproc", type=int, default=1, metavar="N",
                        help="ranks to start on this host through msrun (default 1: this "
                             "process trains)")
    parser.add_argument("--scan-tokens", action="store_true",
                        help="before launch, read every dataset whole (memory-mapped) and "
                             "refuse one with a token id outside model.vocab_size (default: "
                             "each sample is checked as it is read)")
    parser.add_argument("--timeout", type=float, default=0, metavar="SECONDS",
                        help="with --nproc: stop the job after this long (default: no limit)")
    parser.add_argument("--hang-timeout", type=float, default=None, metavar="SECONDS",
                        help="with --nproc: when no rank progresses for this long, dump every "
                             "rank's stacks to <output-dir>/hang/, report the ranks behind "
                             f"and end the job with status {HUNG_STATUS} (default "
                             f"{DEFAULT_HANG_TIMEOUT:g}; 0: never)")
    parser.add_argument("--step-times", action="store_true",
                        help="end each step line with where its time went: data, forward/"
                             "backward, reduction, optimizer, readback, save, other, and the "
                             "slowest rank (metrics.jsonl and TensorBoard have them always)")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="with --nproc: after a rank fails or the job hangs, start it again "
                             "from its newest checkpoint, up to N times (back-off 1 s, "
                             "doubling); an input error, or the same step failing twice, is "
                             "not retried (default 0)")
    parser.add_argument("--exit-duration", type=float, default=None, metavar="MINUTES",
                        help="stop at the first step boundary after this many minutes (from "
                             "the start, restarts included), saving a checkpoint; exit 0")
    parser.add_argument("--spike-factor", type=float, default=3.0, metavar="F",
                        help="a step whose loss or gradient norm exceeds F times its running "
                             "average is a spike event in metrics.jsonl and a warning (default "
                             "3; 0: none)")
    parser.add_argument("--peak", metavar="DEVICE|TFLOPS",
                        help="the peak MFU divides by: a rated device (" + ", ".join(RATED)
                             + ": its dense peak for the compute dtype) or one rank's TFLOP/s "
                             "(default: a float32 matmul measured once on this machine)")
    add_node_flags(parser)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `mf-train` script (`mf-train export-hf ...`: `export_command`;
    `mf-train generate ...`: `generate_command`)."""
    given = list(argv if argv is not None else sys.argv[1:])
    if given[:1] == [export_command.COMMAND]:
        return export_command.main(given[1:])
    if given[:1] == [generate_command.COMMAND]:
        return generate_command.main(given[1:])
    args = _parser().parse_args(argv)
    if args.nproc < 1:
        print(f"mf-train: --nproc must be >= 1, got {args.nproc}", file=sys.stderr)
        return 2
    try:
        nodes = nodes_from(args)
        if args.peak is not None:
            check_given(args.peak)
    except (FlagError, PeakError) as exc:
        print(f"mf-train: {exc}", file=sys.stderr)
        return 2
    if args.max_restarts < 0 or args.spike_factor < 0 or (
            args.exit_duration is not None and args.exit_duration <= 0):
        print("mf-train: --max-restarts and --spike-factor must be >= 0, --exit-duration > 0 "
              "minutes", file=sys.stderr)
        return 2
    if args.max_restarts and nodes.count > 1:
        print("mf-train: --max-restarts restarts the ranks of one host; with --nnodes, "
              "restart the job from the scheduler that started its nodes", file=sys.stderr)
        return 2
    if args.hang_timeout is not None and args.hang_timeout < 0:
        print(f"mf-train: --hang-timeout must be >= 0 seconds, got {args.hang_timeout:g}",
              file=sys.stderr)
        return 2
    if nodes.count * args.nproc > 1:
        return launch(args, list(argv if argv is not None else sys.argv[1:]), nodes)
    if args.max_restarts:
        print("mf-train: --max-restarts has no effect on one process (it restarts the ranks "
              "of --nproc N > 1); ignoring it", file=sys.stderr)
    if args.hang_timeout:
        print("mf-train: --hang-timeout has no effect on one process (it watches the ranks "
              "of --nproc N > 1); ignoring it", file=sys.stderr)
    return run_training(argv if argv is not None else sys.argv[1:], world_size=1)


HUNG_STATUS = 3
"""The exit status of a job the hang watch ended (`mf_parallel.hang_watch`)."""
DEFAULT_HANG_TIMEOUT = 600.0
"""`--hang-timeout` under `--nproc` when not given: seconds without any rank progressing (a
first step's compilation or a large checkpoint's load on one rank can take minutes)."""

RANK_ENTRY_POINT = "mf-train-rank"
"""The console script msrun starts on each rank (`rank_worker.main`)."""


class _Aborted(Exception):
    """A second stop signal reached the launcher: its job is killed."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _abort_job(signum: int, _checkpoints: Path | None) -> None:
    raise _Aborted(signum)  # from the signal handler: `_run_msrun` kills the job on its way out


def launch(args: argparse.Namespace, argv: list[str], nodes: Nodes) -> int:
    """Validate for the whole job's ranks here, claim the directories the run writes (node 0
    holds their locks), then run this host's ranks through msrun and print the run's summary.
    A stop signal is forwarded to the ranks (`stop_signals`); a second one kills the job."""
    with StopSignals(abort=_abort_job) as signals:
        try:
            return _launch(args, argv, nodes, signals)
        except _Aborted as exc:
            print(f"mf-train: {aborted_line(exc.signum, signals.checkpoints)}; every process "
                  "of the job was killed", file=sys.stderr)
            return status(exc.signum)


def _launch(args: argparse.Namespace, argv: list[str], nodes: Nodes,
            signals: StopSignals) -> int:
    validated = _validated(args, nodes.count * args.nproc, say_warnings=True,
                           ranks=nodes.local_ranks(args.nproc))
    if validated is None:
        return 2
    if signals.requested is not None:
        return _stopped_before_start(signals.requested)
    worker = shutil.which(RANK_ENTRY_POINT, path=path_with_interpreter())
    if worker is None:
        print(f"mf-train: {RANK_ENTRY_POINT}, the command msrun starts on each rank, is not "
              f"installed beside {sys.executable}; install mf-train into this environment "
              "(pip install mf-train, or pip install -e packages/mf-train)", file=sys.stderr)
        return 1
    owned = _claimed(args.output_dir, validated[0], lock=nodes.rank == 0)
    if owned is None:
        return 2
    signals.checkpoints = Path(owned.checkpoint.save_path)
    if not _resume_allowed(validated[0], owned, say=nodes.rank == 0):
        owned.release()
        return 2
    if signals.requested is not None:
        owned.release()
        return _stopped_before_start(signals.requested)
    logs = Path(args.output_dir) / "logs"
    timeout = args.timeout if args.timeout > 0 else 365 * 24 * 3600.0
    hang_timeout = DEFAULT_HANG_TIMEOUT if args.hang_timeout is None else args.hang_timeout
    ranks = nodes.local_ranks(args.nproc)
    print(f"mf-train: starting {_ranks_phrase(nodes, ranks)}; logs in "
          f"{logs}/worker_<rank>.log", file=sys.stderr)
    start = time.monotonic()
    # MindSpore's C++ warnings would crowd rank 0's lines on the console (GLOG_v 3: errors;
    # the INFO lines it writes regardless stay in the rank's log), unless the user sets GLOG_v
    chosen = "GLOG_v" in os.environ
    quiet = {} if chosen else {"GLOG_v": "3"}
    exit_at = {} if args.exit_duration is None else {
        EXIT_AT: str(time.time() + args.exit_duration * 60)}
    decided, attempt, failed_after = owned, 0, None
    try:
        while True:
            rank_args = [*_without_launcher_options(argv), *_decided(decided)]
            try:
                run_ranks(worker, args.nproc, log_dir=logs, timeout=timeout, args=rank_args,
                          env={LAUNCHED: "1", LAUNCHER_PID: str(os.getpid()),
                               RANKS_ON_HOST: str(args.nproc), **exit_at, **quiet},
                          echo_rank=ranks[0], echo_to=sys.stdout, nodes=nodes,
                          forward=Forward(LAUNCHER_STOP, signals), hold_fds=owned.lock_fds(),
                          echo_drop=None if chosen else MINDSPORE_INFO,
                          hang=HangSettings(hang_timeout, Path(args.output_dir) / HANG_DIR))
                break
            except LaunchError as exc:
                print(f"mf-train: {exc}", file=sys.stderr)
                failed = HUNG_STATUS if isinstance(exc, JobHung) else 1
                step = logged_step(Path(args.output_dir))
                if args.max_restarts == 0 or signals.requested is not None:
                    return failed
                why = (not_retried(str(exc), step, failed_after)
                       if attempt < args.max_restarts else
                       f"--max-restarts {args.max_restarts} reached")
                if why is not None:
                    print(f"mf-train: not restarting: {why}", file=sys.stderr)
                    return failed
                attempt, failed_after = attempt + 1, step
                decided = _restart(args, validated[0], attempt, step,
                                   str(exc).splitlines()[0], signals)
                if decided is None:
                    return failed
    finally:
        owned.release()
    if signals.requested is not None:
        if nodes.rank == 0:
            print(f"mf-train: {_stopped_line(signals.requested, owned)}", file=sys.stderr)
        else:
            print(f"mf-train: node {nodes.rank} stopped its ranks ({name(signals.requested)}); "
                  "node 0 says where the run saved", file=sys.stderr)
        return status(signals.requested)
    if nodes.rank == 0 and exit_at and time.time() >= float(exit_at[EXIT_AT]) and \
            logged_step(Path(args.output_dir)) < validated[0].training.steps:
        print(f"mf-train: {_stopped_line(None, owned, _duration(args))}", file=sys.stderr)
    elif nodes.rank == 0:  # rank 0 writes the metrics
        _summarise(validated[0], owned, time.monotonic() - start)
    else:
        print(f"mf-train: node {nodes.rank} finished its ranks {ranks[0]}-{ranks[-1]} in "
              f"{time.monotonic() - start:.0f} s; node 0 has the metrics", file=sys.stderr)
    return 0


def _restart(args: argparse.Namespace, config: TrainConfig, attempt: int, step: int,
             cause: str, signals: StopSignals) -> Claim | None:
    """Wait the back-off, record the restart (metrics.jsonl's `restart` event, a console
    line) and decide again where the job starts (`run_directory.claim`, without the locks the
    launcher still holds): the new attempt's checkpoint settings, or None when a stop signal
    came during the wait."""
    wait = backoff(attempt)
    record_restart(Path(args.output_dir), attempt, step, cause, wait)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and signals.requested is None:
        time.sleep(0.1)
    if signals.requested is not None:
        return None
    decided = claim(args.output_dir, config.checkpoint, lock=False,
                    also=_written_elsewhere(config, Path(args.output_dir)))
    start = decided.checkpoint.load_path or "the start (no checkpoint)"
    print(f"mf-train: restart {attempt} of {args.max_restarts} after {wait:g} s, from {start}"
          f" (metrics.jsonl logged step {step})", file=sys.stderr)
    return decided


def _ranks_phrase(nodes: Nodes, ranks: range) -> str:
    if nodes.count == 1:
        return f"{len(ranks)} ranks"
    return (f"ranks {ranks[0]}-{ranks[-1]} of {nodes.count * len(ranks)} as node "
            f"{nodes.rank} of {nodes.count} (master {nodes.master_addr}:{nodes.master_port})")


def _claimed(output_dir: str, config: TrainConfig, *, lock: bool = True) -> Claim | None:
    """The run's claim on `output_dir` (see `run_directory`), or None after printing why not;
    says what the run does with an earlier run it found."""
    try:
        owned = claim(output_dir, config.checkpoint, lock=lock,
                      also=_written_elsewhere(config, Path(output_dir)))
    except RunDirectoryError as exc:
        print(f"mf-train: {exc}", file=sys.stderr)
        return None
    if owned.note is not None and lock:
        print(f"mf-train: {owned.note}", file=sys.stderr)
    return owned


def _written_elsewhere(config: TrainConfig, output_dir: Path) -> list[tuple[Path, str]]:
    """The directories other than the output and checkpoint directories the run writes, with
    the option naming each: TensorBoard's, and the profiler's when it profiles."""
    found = [(event_dir(config.monitor.tensorboard, output_dir), "monitor.tensorboard.output_dir")]
    if config.profiler.enable_profiling and config.profiler.output_path:
        found.append((Path(config.profiler.output_path), "profiler.output_path"))
    return found


def _resume_allowed(config: TrainConfig, owned: Claim, *, say: bool) -> bool:
    """Whether the run may resume the checkpoint it loads with the settings it has
    (`resume_changes`); printed when `say` (the launcher speaks for its ranks)."""
    found = changes(config, owned.checkpoint.load_path)
    if found is not None and found.refused:
        if say:
            print(f"mf-train: {found.refusal()}", file=sys.stderr)
        return False
    if found is not None and say:
        print(f"mf-train: {found.warning()}", file=sys.stderr)
    return True


def _decided(owned: Claim) -> list[str]:
    """The launcher's decisions, as overrides for the ranks (so they need not re-decide)."""
    checkpoint = owned.checkpoint
    sets = [f"checkpoint.save_path={json.dumps(checkpoint.save_path)}"]
    if checkpoint.load_path:
        sets.append(f"checkpoint.load_path={json.dumps(checkpoint.load_path)}")
    return [arg for value in sets for arg in ("--set", value)]


def _duration(args: argparse.Namespace) -> str | None:
    """`--exit-duration 30 min` when the run was given one."""
    return None if args.exit_duration is None else f"--exit-duration {args.exit_duration:g} min"


def _stopped_before_start(signum: int) -> int:
    print(f"mf-train: stopped by {name(signum)} before training started; nothing saved",
          file=sys.stderr)
    return status(signum)


def _stopped_line(signum: int | None, owned: Claim, duration: str | None = None) -> str:
    """Where a run stopped by `signum` (None: by `duration`, the `--exit-duration` phrase,
    when given, else by another rank's request) stopped and saved (`summary.stopped_line`)."""
    phrase = (name(signum) if signum is not None else duration if duration is not None
              else "another rank's stop request")
    return stopped_line(phrase, owned.output_dir, Path(owned.checkpoint.save_path))


def _summarise(config: TrainConfig, owned: Claim, seconds: float) -> None:
    checkpoints = Path(owned.checkpoint.save_path)
    tensorboard = event_dir(config.monitor.tensorboard, owned.output_dir)
    for line in summary_lines(owned.output_dir, checkpoints, tensorboard, seconds):
        print(f"mf-train: {line}", file=sys.stderr)


def _without_launcher_options(argv: list[str]) -> list[str]:
    """`argv` without the launcher's options (--nproc, --timeout, the node flags) and their
    values, for the ranks."""
    options = ("--nproc", "--timeout", "--hang-timeout", "--max-restarts", "--exit-duration",
               *NODE_OPTIONS)
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in options:
            skip = True
            continue
        if arg.startswith(tuple(f"{option}=" for option in options)):
            continue
        out.append(arg)
    return out


def _validated(args: argparse.Namespace, world_size: int, *, say_warnings: bool = False,
               ranks: Sequence[int] = ()) -> tuple[TrainConfig, Source] | None:
    """(config, source) when the file, overrides, plan and what the trainer supports
    (`support`) are valid and the files it reads are there (`input_checks`); else print the
    problems and return None. With `say_warnings`, the settings that have no effect here are
    printed too (the launcher says them once for all ranks; a single process logs them when
    the trainer starts). The configuration's own warnings (`ConfigWarning`) are printed as
    one line each, by the launcher or a single process; a rank the launcher started keeps
    quiet about them. The ranks of this host (`ranks`) must fit in its memory on CPU
    (`host_memory`), and with `--scan-tokens` every token id must be in the vocabulary: the
    launcher checks for its ranks (which pass no `ranks`)."""
    from ..preflight.job import check_support, make_job_plan, resolve_device  # MindSpore

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConfigWarning)
            source = load_source(args.config, args.overrides)
            config = config_from_source(source)
        _say_config_warnings(caught, quiet=os.environ.get(LAUNCHED) == "1")
        plan = make_job_plan(config, world_size=world_size, source=source)
        device = resolve_device(config.context.device_target)
        no_effect = check_support(config, plan, device, source)
        check_inputs(config, source)
        if args.peak is not None:  # a rated device must have a peak for the compute dtype
            given_peak(args.peak, peak_dtype(config, device))
        if args.scan_tokens and ranks:
            scan_token_ids(config, source)
        check_host_memory(config, world_size, ranks, device)
    except (ConfigError, UnreadableFile, PlanError, PeakError, HostMemoryError) as exc:
        print(f"mf-train: {exc}", file=sys.stderr)
        return None
    for warning in no_effect if say_warnings else ():
        print(f"mf-train: {warning}", file=sys.stderr)
    return config, source


def _say_config_warnings(caught: list[warnings.WarningMessage], *, quiet: bool) -> None:
    """Print each `ConfigWarning` as one `mf-train: ` line (unless `quiet`); other warnings
    go on to the warnings module as they came."""
    for warning in caught:
        if issubclass(warning.category, ConfigWarning):
            if not quiet:
                print(f"mf-train: {warning.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)


def _log_to_file(path: Path) -> logging.Handler:
    """Also append the log to `path` (the run's log under its output directory), never
    through a symbolic link (`no_follow`); the caller removes the returned handler, and
    closes it, when the run ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stream = os.fdopen(open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a",
                       encoding="utf-8")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger("mf_train").setLevel(logging.INFO)  # even if logging was set up before
    return handler


_STOPPED = -1
"""What `_train` returns for a run that a stop request ended (at a step boundary)."""


def run_training(argv: Sequence[str], *, world_size: int,
                 signals: StopSignals | None = None) -> int:
    """Validate, build and train in this process (one rank of `world_size`).

    Args:
        argv: `mf-train`'s arguments (without the launcher's options).
        world_size: the job's number of ranks (1: this process is the whole run).
        signals: the stop signals to handle while training (default: SIGINT and SIGTERM,
            a second one aborting at once); see `stop_signals`.

    Returns:
        The exit status: 0 done, 2 refused before training, 1 failed, 128 + the signal's
        number when a stop signal ended the run (0 for the launcher's ranks: it reports).
    """
    with signals if signals is not None else StopSignals() as handled:
        return _run_training(argv, world_size, handled)


def _run_training(argv: Sequence[str], world_size: int, signals: StopSignals) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    rank_progress.phase("validate")  # where a rank is, for the launcher's hang watch
    validated = _validated(args, world_size, ranks=[0] if world_size == 1 else ())
    if validated is None:
        return 2
    if signals.requested is not None and world_size == 1:  # ranks all start, then agree
        return _stopped_before_start(signals.requested)
    config, source = validated
    # the launcher holds the lock for its ranks; ranks started by hand, rank 0 takes it
    lock = world_size == 1 or (os.environ.get(LAUNCHED) != "1"
                               and os.environ.get("RANK_ID", "0") == "0")
    owned = _claimed(args.output_dir, config, lock=lock)
    if owned is None:
        return 2
    signals.checkpoints = Path(owned.checkpoint.save_path)
    if not _resume_allowed(config, owned, say=os.environ.get(LAUNCHED) != "1"):
        owned.release()
        return 2
    config = attrs.evolve(config, checkpoint=owned.checkpoint)
    output_dir = Path(args.output_dir)
    # ranks started by msrun log to <output-dir>/logs/worker_<rank>.log already
    handler = _log_to_file(output_dir / TRAIN_LOG) if world_size == 1 else None
    start = time.monotonic()
    exit_at = (float(os.environ[EXIT_AT]) if EXIT_AT in os.environ else
               time.time() + args.exit_duration * 60 if args.exit_duration else None)
    try:
        outcome = _train(config, source, output_dir, world_size, signals, args, exit_at)
    finally:
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()
            handler.stream.close()
        owned.release()
    if outcome == _STOPPED:
        if os.environ.get(LAUNCHED) == "1":
            return 0  # the launcher says where the run stopped, and exits with the status
        print(f"mf-train: {_stopped_line(signals.requested, owned, _duration(args))}",
              file=sys.stderr)
        return 0 if signals.requested is None else status(signals.requested)
    if outcome == 0 and world_size == 1:
        _summarise(config, owned, time.monotonic() - start)
    return outcome


def _train(config: TrainConfig, source: Source, output_dir: Path, world_size: int,
           stop: StopSignals, args: argparse.Namespace, exit_at: float | None = None) -> int:
    """Build the trainer and train until done, or until `stop` or the wall time `exit_at`
    (`--exit-duration`), at a step boundary (`_STOPPED`). On one process,
    bad input found while building is one line and status 2 (a failure while training, 1); a
    rank raises, and the traceback's last line is what the launcher reports."""
    from ..trainer import Trainer, TrainingStopped  # MindSpore

    rank_progress.phase("build")
    try:
        trainer = Trainer(config, output_dir=output_dir, source=source, world_size=world_size,
                          say_warnings=os.environ.get(LAUNCHED) != "1",
                          show_step_times=args.step_times, peak=args.peak,
                          spike_factor=args.spike_factor)
        trainer.train(lambda: stop() or (exit_at is not None and time.time() >= exit_at))
    except (ConfigError, DataError, ValueError, OSError, TrainingStopped) as exc:
        if world_size > 1:
            raise
        print(f"mf-train: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    except (MemoryError, RuntimeError) as exc:
        if not out_of_memory(exc):
            raise
        line = out_of_memory_line(exc, config, world_size, int(os.environ.get("RANK_ID", 0)))
        if world_size > 1:  # the launcher reports the traceback's last line
            raise HostMemoryError(line) from None
        print(f"mf-train: {line}", file=sys.stderr)
        return 1
    return _STOPPED if trainer.stopped or stop.requested is not None else 0

if __name__ == "__main__":
    raise SystemExit(run())
