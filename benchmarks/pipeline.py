"""Pipeline parallelism on 2 (or `--stages`) msrun ranks: each schedule's step against one
process and the simulator.

For each micro-batch count m (`--microbatches`, micro-batch 1 x seq), in fresh processes:
- **one process** running the same config without pipelining, pinned to one core (`taskset`
  equivalent: `os.sched_setaffinity` before MindSpore starts its threads), and unpinned
  (both cores) for orientation;
- **PP 2** with each schedule (gpipe, 1f1b, interleaved_1f1b with 2 chunks, and
  `1f1b_split`: 1F1B with `pipeline_parallel_enable_dxdw_split`, ZB-H1), the two ranks
  unpinned (as `mf-train --nproc 2` runs them) and, with `--pin-ranks`, rank r pinned to
  core r; `--stages 4` runs PP 4 instead (4 ranks sharing the cores).
Every process is `pipeline_worker.py` (mf-train's own `run_training`, with the step, its
pieces and every pipeline action timed by wrapping the classes, the trainer's code
unchanged). Steady state: the first `--skip` steps are dropped, medians of the rest.

Printed per run: the step time; the ratio to the one-process step on one core; the unit
simulator's bubble (`simulate(build_schedule(...), forward_time=1, backward_time=2)`, what
`make_plan` reports); the step predicted from the measured durations in two ways:
- **sim**: mf-parallel's `simulate` with t_f = median F of a chunk that sends (the last
  virtual stage runs nothing at F) and t_b = median B (the recompute makes it about
  t_f + t_b; split: t_w = median W, B and W each recomputing the forward), messages free,
  plus the measured rest of the step (reduce, optimizer);
- **replay**: the stage programs the ranks really ran (`stage_programs`, with their
  rendezvous transfers) replayed with each (stage, chunk)'s own measured F and B and the
  measured cost of moving one message, plus the same rest; **buffered**: the same
  durations with the simulator's rule instead (sends never wait), which isolates what the
  rendezvous costs; **re-placed**: the transfers placed with the measured t_f, t_b instead
  of the plan's 1 and 2;
and per stage: busy (F + B + W), time in transfers (waiting for the peer + moving), the rest of
the stage's `run` (Python between actions), and CPU time over wall time.

The comparison with one process: a stage computes 1/p of the layers, but every B recomputes
its chunk's forward, so with per-micro-batch forward f and backward b of the whole model a
stage is busy m (2f + b)/p against one process's m (f + b): the best PP 2 can do against
one process on one core is (2f + b)/(f + b)/2 of its time (about 2/3 with b = 2f) divided by
(1 - bubble), plus the reduce and update. `recompute x` below is that factor, measured as
(sum of all F and B) / (sum of all B), since a B is the one-process work of its chunk.

Usage: python benchmarks/pipeline.py [--microbatches 4,8] [--steps 8] [--skip 2]
       [--schedules gpipe,1f1b,interleaved_1f1b,1f1b_split] [--stages 2] [--pin-ranks]
       [--json FILE] [--quick] [--keep DIR [--reanalyse]]
       (about 8 minutes, 13 with --pin-ranks)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from mf_parallel.launch import run_ranks
from mf_parallel.pipeline_program import Transfer, stage_programs
from mf_parallel.pipeline_schedules import Kind, build_schedule, message_of
from mf_parallel.pipeline_simulator import simulate, unit_times
from mf_train.launch.cli import LAUNCHED

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "pipeline_worker.py"
EXAMPLE = ROOT / "examples" / "qwen3_tiny.yaml"
SCHEDULES = {"gpipe": ("gpipe", 1, False), "1f1b": ("1f1b", 1, False),
             "interleaved_1f1b": ("interleaved_1f1b", 2, False),
             "1f1b_split": ("1f1b", 1, True)}
"""Name -> (the configured schedule, chunks per stage, the backward split in B and W)."""
MODEL = {"model.hidden_size": 256, "model.intermediate_size": 704, "model.head_dim": 64,
         "model.num_attention_heads": 4, "model.num_key_value_heads": 2,
         "model.num_hidden_layers": 4, "train_dataset.dataloader.config.seq_length": 256,
         "model.max_position_embeddings": 256}
QUICK = {**MODEL, "model.hidden_size": 32, "model.intermediate_size": 64, "model.head_dim": 8,
         "train_dataset.dataloader.config.seq_length": 32, "model.max_position_embeddings": 32}


def overrides(prefix: Path, microbatches: int, steps: int, model: dict) -> list[str]:
    sets = {**model, "train_dataset.dataloader.config.data_path": f"['1','{prefix}']",
            "training.steps": steps, "training.local_batch_size": 1,
            "training.global_batch_size": microbatches, "recompute.mode": "None",
            "recompute.select_module": "null", "lr_scheduler.warmup_steps": 1,
            "checkpoint.enable_save": "false"}
    return [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]


def train_args(run_dir: Path, sets: list[str]) -> list[str]:
    return [str(run_dir / "timeline"), "--config", str(EXAMPLE), "--output-dir",
            str(run_dir / "out"), *sets]


def load(run_dir: Path) -> list[dict]:
    return [json.loads(path.read_text())
            for path in sorted((run_dir / "timeline").glob("timeline_*.json"))]


def run_one(run_dir: Path, sets: list[str], pin: str) -> list[dict]:
    """One process, pinned to the cores in `pin` ("" = unpinned)."""
    env = {**os.environ, "GLOG_v": "3", "MF_BENCH_PIN": pin}
    with open(run_dir.with_suffix(".log"), "w") as log:
        subprocess.run([sys.executable, str(WORKER), *train_args(run_dir, sets)], env=env,
                       stdout=log, stderr=subprocess.STDOUT, check=True, timeout=1800)
    return load(run_dir)


def run_pipeline(run_dir: Path, sets: list[str], schedule: str, pin: bool,
                 stages: int) -> list[dict]:
    configured, chunks, split = SCHEDULES[schedule]
    more = [f"parallelism.pipeline_parallel={stages}",
            f"parallelism.pipeline_parallel_schedule={configured}",
            f"parallelism.pipeline_parallel_interleave_num={chunks}",
            f"parallelism.pipeline_parallel_enable_dxdw_split={str(split).lower()}"]
    sets = [*sets, *(arg for value in more for arg in ("--set", value))]
    run_ranks(WORKER, stages, log_dir=run_dir / "logs", timeout=1800,
              args=train_args(run_dir, sets),
              env={"GLOG_v": "3", "MF_BENCH_PIN": "rank" if pin else "",
                   # as `mf-train --nproc`: no rank (nor msrun's scheduler, which runs the
                   # same script) locks the output directory (a fresh one per run here)
                   LAUNCHED: "1"})
    return sorted(load(run_dir), key=lambda t: t["stage"])


# ---------------------------------------------------------------- analysis

def steady(events: list, skip: int) -> dict[int, list]:
    """Events of the steps after the first `skip`, by step."""
    by_step = defaultdict(list)
    for event in events:
        if event[0] >= skip:
            by_step[event[0]].append(event)
    return by_step


def span(events: list, name: str) -> float:
    """Total wall time of the `name` events."""
    return sum(e[3] - e[2] for e in events if e[1] == name)


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def one_process(timeline: dict, skip: int, microbatches: int) -> dict:
    steps = steady(timeline["events"], skip).values()
    return {"step": median(span(s, "step") for s in steps),
            "per_microbatch": median(span(s, "forward_backward") for s in steps) / microbatches,
            "rest": median(span(s, "step") - span(s, "forward_backward") for s in steps),
            "cpu": median(_cpu(s, "step") for s in steps)}


def _cpu(events: list, name: str) -> float:
    """CPU time (all threads) over wall time of the `name` events."""
    wall = span(events, name)
    return sum(e[5] - e[4] for e in events if e[1] == name) / wall if wall else float("nan")


def pipeline(timelines: list[dict], skip: int, schedule: str, microbatches: int) -> dict:
    """Step time, action durations, per-stage busy/transfer/other, and the predictions."""
    configured, chunks, split = SCHEDULES[schedule]
    num_stages = len(timelines)
    by_rank = [steady(t["events"], skip) for t in timelines]
    steps = sorted(set.intersection(*(set(b) for b in by_rank)))
    durations = defaultdict(list)  # (stage, kind, virtual) -> seconds
    moves, stage_rows = [], defaultdict(lambda: defaultdict(list))
    for step in steps:
        starts = defaultdict(dict)  # transfer key -> stage -> (start, end)
        for stage, by_step in enumerate(by_rank):
            events = by_step[step]
            for e in events:
                if e[1] in ("F", "B", "W"):
                    durations[(stage, e[1], e[6][0])].append(e[3] - e[2])
                elif e[1] == "T":
                    starts[tuple(e[6])][stage] = (e[2], e[3])
            busy = span(events, "F") + span(events, "B") + span(events, "W")
            run, transfers = span(events, "run"), span(events, "T")
            row = stage_rows[stage]
            row["step"].append(span(events, "step"))
            row["run"].append(run)
            row["busy"].append(busy)
            row["transfer"].append(transfers)
            row["other"].append(run - busy - transfers)
            row["rest"].append(span(events, "step") - span(events, "forward_backward"))
            row["cpu_run"].append(_cpu(events, "run"))
            row["cpu_transfer"].append(_cpu(events, "T"))
        waits = defaultdict(float)
        for ends in starts.values():
            meet = max(start for start, _ in ends.values())
            moves.append(min(end for _, end in ends.values()) - meet)
            for stage, (start, _) in ends.items():
                waits[stage] += meet - start
        for stage in range(len(by_rank)):
            stage_rows[stage]["wait"].append(waits[stage])
    measured = {key: median(values) for key, values in durations.items()}
    last = num_stages * chunks - 1
    t_f = median(v for (_, kind, virtual), vs in durations.items() if kind == "F"
                 and virtual != last for v in vs)
    # a split B of the first virtual stage computes nothing (no input gradient to send)
    t_b = median(v for (_, kind, virtual), vs in durations.items() if kind == "B"
                 and not (split and virtual == 0) for v in vs)
    t_w = median(v for (_, kind, _), vs in durations.items() if kind == "W" for v in vs) \
        if split else 1.0
    move = median(moves)
    stages = [{key: median(values) for key, values in stage_rows[s].items()}
              for s in range(len(by_rank))]
    rest = stages[0]["rest"]
    actions = build_schedule(configured, num_stages, microbatches, chunks, split)
    unit = simulate(actions, num_chunks=chunks, **unit_times(split))
    real = simulate(actions, num_chunks=chunks, forward_time=t_f, backward_time=t_b,
                    weight_time=t_w)
    programs = stage_programs(actions, chunks, **unit_times(split))
    replayed, replay_busy = replay(programs, measured, move)
    # the same durations with buffered sends (the simulator's rule): what rendezvous costs
    buffered = replay(programs, measured, move, buffered=actions)[0]
    # the transfers placed with the measured durations instead of the plan's units
    replaced = replay(stage_programs(actions, chunks, forward_time=t_f, backward_time=t_b,
                                     weight_time=t_w), measured, move)[0]
    all_f = sum(sum(v) for (_, kind, _), v in durations.items() if kind == "F")
    all_b = sum(sum(v) for (_, kind, _), v in durations.items() if kind in ("B", "W"))
    per_mb_b = all_b / len(steps) / microbatches
    return {"schedule": schedule, "microbatches": microbatches, "steps": len(steps),
            "step": stages[0]["step"], "stages": stages, "t_f": t_f, "t_b": t_b,
            "t_w": t_w if split else None, "move": move,
            "durations": {f"stage {s} {kind} v{v}": d for (s, kind, v), d in measured.items()},
            "unit_bubble": unit.bubble_fraction, "sim_makespan": real.makespan,
            "sim_bubble": real.bubble_fraction, "sim_step": real.makespan + rest,
            "replay_makespan": replayed, "replay_step": replayed + rest,
            "buffered_step": buffered + rest, "replaced_step": replaced + rest,
            "replay_busy": replay_busy, "recompute_factor": (all_f + all_b) / all_b,
            "sum_b_per_microbatch": per_mb_b}


def replay(programs: list[list], measured: dict, move: float,
           buffered: list[list] | None = None) -> tuple[float, list[float]]:
    """The stages' real programs on a clock: each F/B takes its measured median, a transfer
    starts when both ends have reached it and takes `move`. Returns (makespan, busy).
    With `buffered` (the schedule's actions), sends never wait instead: a RECV waits until
    the matching SEND has run, plus `move`."""
    if buffered is not None:
        return _buffered(buffered, measured, move)
    stages = len(programs)
    position, clock, busy = [0] * stages, [0.0] * stages, [0.0] * stages
    while any(position[s] < len(programs[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            while position[s] < len(programs[s]):
                item = programs[s][position[s]]
                if isinstance(item, Transfer):
                    peer = item.target if item.source == s else item.source
                    if position[peer] >= len(programs[peer]) or \
                            programs[peer][position[peer]] != item:
                        break
                    clock[s] = clock[peer] = max(clock[s], clock[peer]) + move
                    position[peer] += 1
                elif item.kind in (Kind.F, Kind.B, Kind.W):
                    duration = _duration(measured, s, item, stages)
                    clock[s] += duration
                    busy[s] += duration
                position[s] += 1
                progressed = True
        if not progressed:
            raise RuntimeError("replay stuck: the programs' transfers do not line up")
    return max(clock), busy


def _duration(measured: dict, stage: int, action, stages: int) -> float:
    """The measured median of an F, B or W of `stage` (0 for one it never times: the last
    virtual stage's F)."""
    return measured.get((stage, action.kind.value, action.chunk * stages + stage), 0.0)


def _buffered(actions: list[list], measured: dict, move: float) -> tuple[float, list[float]]:
    stages = len(actions)
    position, clock, busy = [0] * stages, [0.0] * stages, [0.0] * stages
    sent: dict[object, float] = {}
    while any(position[s] < len(actions[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            while position[s] < len(actions[s]):
                action = actions[s][position[s]]
                key = message_of(action, s, stages) if action.peer is not None else None
                if action.kind in (Kind.RECV_F, Kind.RECV_B):
                    if key not in sent:
                        break
                    clock[s] = max(clock[s], sent[key] + move)
                elif action.kind in (Kind.SEND_F, Kind.SEND_B):
                    sent[key] = clock[s]
                else:
                    duration = _duration(measured, s, action, stages)
                    clock[s] += duration
                    busy[s] += duration
                position[s] += 1
                progressed = True
        if not progressed:
            raise RuntimeError("buffered replay stuck")
    return max(clock), busy


# ---------------------------------------------------------------- report

def report(results: list[dict], singles: dict) -> None:
    ms = 1000
    print("\none process (no pipelining), medians: step, forward + backward per micro-batch, "
          "rest of the step, CPU time / wall")
    for (m, pin), one in sorted(singles.items()):
        print(f"  m={m} {'core 0' if pin else 'both cores'}: step {one['step'] * ms:.0f} ms, "
              f"f+b {one['per_microbatch'] * ms:.0f} ms/micro-batch, rest "
              f"{one['rest'] * ms:.0f} ms, cpu {one['cpu']:.2f}")
    print("\nsteady-state step, median; ratio = PP step / one process on one core; predicted = "
          "makespan + measured reduce/update")
    head = (f"{'schedule':<18}{'pin':>4}{'m':>3}{'step ms':>9}{'1 proc 1 core':>14}"
            f"{'1 proc 2 cores':>15}{'ratio':>7}{'bubble unit':>12}{'sim ms':>8}"
            f"{'meas/sim':>9}{'replay ms':>10}{'meas/replay':>12}{'buffered':>9}{'re-placed':>10}")
    print(head)
    for r in results:
        one, two = singles[(r["microbatches"], "0")], singles[(r["microbatches"], "")]
        print(f"{r['schedule']:<18}{'yes' if r['pinned'] else 'no':>4}{r['microbatches']:>3}"
              f"{r['step'] * ms:>9.0f}{one['step'] * ms:>14.0f}{two['step'] * ms:>15.0f}"
              f"{r['step'] / one['step']:>7.2f}{r['unit_bubble']:>12.3f}"
              f"{r['sim_step'] * ms:>8.0f}{r['step'] / r['sim_step']:>9.2f}"
              f"{r['replay_step'] * ms:>10.0f}{r['step'] / r['replay_step']:>12.2f}"
              f"{r['buffered_step'] * ms:>9.0f}{r['replaced_step'] * ms:>10.0f}")
    print("\nper stage (ms, medians per step): run = the schedule's part of the step; busy = "
          "F + B + W; transfer = in send/recv (of which wait = until the peer arrived); other = "
          "the rest of run; cpu = CPU time / wall over run (cpu T: over the transfers); rest = "
          "step - run (reduce, update)")
    print(f"{'schedule':<18}{'pin':>4}{'m':>3}{'stage':>6}{'run':>7}{'busy':>7}{'idle %':>7}"
          f"{'transfer':>9}{'wait':>7}{'other':>7}{'cpu':>6}{'cpu T':>6}{'rest':>7}{'t_f':>6}"
          f"{'t_b':>6}{'t_w':>6}{'move':>6}{'recomp x':>9}{'sumB/mb':>8}{'1proc/mb':>9}")
    for r in results:
        one = singles[(r["microbatches"], "0")]
        for s, st in enumerate(r["stages"]):
            print(f"{r['schedule']:<18}{'yes' if r['pinned'] else 'no':>4}{r['microbatches']:>3}"
                  f"{s:>6}{st['run'] * ms:>7.0f}{st['busy'] * ms:>7.0f}"
                  f"{100 * (1 - st['busy'] / st['run']):>7.1f}{st['transfer'] * ms:>9.0f}"
                  f"{st['wait'] * ms:>7.0f}{st['other'] * ms:>7.0f}{st['cpu_run']:>6.2f}"
                  f"{st['cpu_transfer']:>6.2f}"
                  f"{st['rest'] * ms:>7.0f}{r['t_f'] * ms:>6.0f}{r['t_b'] * ms:>6.0f}"
                  f"{(r['t_w'] or 0) * ms:>6.0f}"
                  f"{r['move'] * ms:>6.1f}{r['recompute_factor']:>9.2f}"
                  f"{r['sum_b_per_microbatch'] * ms:>8.0f}{one['per_microbatch'] * ms:>9.0f}")
    print("\nmeasured F/B per (stage, kind, virtual stage), ms:")
    for r in results:
        cells = ", ".join(f"{k} {v * ms:.0f}" for k, v in sorted(r["durations"].items()))
        print(f"  {r['schedule']} m={r['microbatches']} pin={r['pinned']}: {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbatches", default="4,8")
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--stages", type=int, default=2,
                        help="pipeline stages (ranks); the model has 4 layers")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--skip", type=int, default=2)
    parser.add_argument("--pin-ranks", action="store_true",
                        help="also run each schedule with rank r pinned to core r")
    parser.add_argument("--quick", action="store_true", help="a tiny model (a smoke test)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure here")
    parser.add_argument("--keep", metavar="DIR", help="keep the runs' directories here")
    parser.add_argument("--reanalyse", action="store_true",
                        help="with --keep: analyse the runs kept there, run nothing")
    args = parser.parse_args()
    model = QUICK if args.quick else MODEL
    with tempfile.TemporaryDirectory(prefix="mf-bench-pipeline-") as tmp:
        base = Path(args.keep or tmp)
        base.mkdir(parents=True, exist_ok=True)
        prefix = base / "tiny"
        if not args.reanalyse:
            subprocess.run([sys.executable, "-m", "mf_data", "preprocess", "--input",
                            str(ROOT / "examples" / "data" / "tiny.jsonl"), "--output-prefix",
                            str(prefix)], check=True, stdout=subprocess.DEVNULL)
        singles, results = {}, []
        for m in (int(x) for x in args.microbatches.split(",")):
            sets = overrides(prefix, m, args.steps, model)
            for pin in ("0", ""):
                name = f"one_m{m}_{'core0' if pin else 'free'}"
                print(f"running {name}", flush=True)
                timeline = (load(base / name) if args.reanalyse
                            else run_one(base / name, sets, pin))[0]
                singles[(m, pin)] = one_process(timeline, args.skip, m)
            for schedule in args.schedules.split(","):
                for pinned in (False, True) if args.pin_ranks else (False,):
                    name = f"pp{args.stages}_{schedule}_m{m}{'_pinned' if pinned else ''}"
                    print(f"running {name}", flush=True)
                    timelines = (sorted(load(base / name), key=lambda t: t["stage"])
                                 if args.reanalyse
                                 else run_pipeline(base / name, sets, schedule, pinned,
                                                   args.stages))
                    result = pipeline(timelines, args.skip, schedule, m)
                    results.append({**result, "pinned": pinned})
        report(results, singles)
        if args.json:
            Path(args.json).write_text(json.dumps(
                {"singles": {f"m{m} pin={pin or 'none'}": v for (m, pin), v in singles.items()},
                 "pipeline": results}, indent=1))


if __name__ == "__main__":
    main()
