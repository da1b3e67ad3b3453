"""A model one capped process cannot train, trained by 4 ranks under the same cap each.

layout_memory.py's 127M-parameter Qwen3 (AdamW, sequence 128, global batch 4, 2 steps and a
checkpoint), run twice with every rank process in its own memory cgroup limited to `--cap`
GiB (the kernel kills a process that needs more): once as one process, once as FSDP on 4
ranks (`optim_grads_params`, one micro-batch of 1 per rank). A rank is moved into its cgroup
as soon as the launcher has started it (polled every 20 ms, while it is still importing), so
what it allocated before the move, a few MiB, is charged outside the cap.

Each run reports its return code, whether the cap killed a rank (`memory.failcnt` and the
kernel's out-of-memory count of its cgroup) and each rank's peak usage under the cap
(`memory.max_usage_in_bytes`: resident memory plus the page cache it caused, which the kernel
reclaims before it kills).

Needs a writable cgroup v1 memory hierarchy (root in this container); says so and stops
otherwise. Usage: python benchmarks/capped_memory.py [--cap 2.6]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import layout_memory  # a sibling script: its model, corpus and overrides

GIB = 2**30
MEMORY_ROOT = Path("/sys/fs/cgroup/memory")


def own_memory_cgroup() -> Path | None:
    """This process's cgroup v1 memory directory, when it exists and is writable."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            directory = MEMORY_ROOT / path.lstrip("/")
            return directory if os.access(directory, os.W_OK) else None
    return None


class CappedGroups:
    """One child cgroup per rank process, each limited to `cap` bytes."""

    def __init__(self, parent: Path, name: str, cap: int):
        self.parent, self.name, self.cap = parent, name, cap
        self.groups: dict[int, Path] = {}

    def adopt(self, pid: int) -> None:
        if pid in self.groups:
            return
        group = self.parent / f"{self.name}-{len(self.groups)}"
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(self.cap))
        try:
            (group / "cgroup.procs").write_text(str(pid))
        except OSError:  # the process ended first
            group.rmdir()
            return
        self.groups[pid] = group

    def report(self) -> list[dict[str, float | int]]:
        """Per rank: peak usage, failures to charge, out-of-memory kills. A group that never
        held a byte (a short-lived process msrun starts with a worker's environment, gone
        before it allocated) is left out."""
        rows = []
        for group in self.groups.values():
            if int((group / "memory.max_usage_in_bytes").read_text()) == 0:
                continue
            oom = dict(line.split() for line in
                       (group / "memory.oom_control").read_text().splitlines())
            rows.append({"peak_gib": int((group / "memory.max_usage_in_bytes").read_text())
                         / GIB,
                         "failcnt": int((group / "memory.failcnt").read_text()),
                         "oom_kills": int(oom.get("oom_kill", 0))})
        return rows

    def remove(self) -> None:
        for group in self.groups.values():
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except OSError:  # a process still leaving
                    time.sleep(0.1)


def run_capped(command: list[str], groups: CappedGroups, log: Path, single: bool) -> int:
    """Run `command`, moving the single process (`single`) or each rank process (msrun's
    `MS_ROLE=MS_WORKER`) into its own capped cgroup; the return code."""
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        root = psutil.Process(process.pid)
        if single:
            groups.adopt(process.pid)
        while process.poll() is None:
            if not single:
                try:
                    children = root.children(recursive=True)
                except psutil.Error:
                    children = []
                for child in children:
                    try:  # msrun's scheduler runs the same command line, as MS_SCHED;
                        # a rank's own child processes stay in its cgroup
                        if (child.environ().get("MS_ROLE") == "MS_WORKER"
                                and child.ppid() not in groups.groups):
                            groups.adopt(child.pid)
                    except psutil.Error:
                        pass
            time.sleep(0.02)
    return process.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=float, default=2.6, help="GiB per rank process")
    args = parser.parse_args()
    parent = own_memory_cgroup()
    if parent is None:
        print("no writable cgroup v1 memory hierarchy here: cannot cap a process")
        return
    cap = int(args.cap * GIB)
    with tempfile.TemporaryDirectory(prefix="mf-capped-") as tmp_name:
        tmp = Path(tmp_name)
        config, _, _ = layout_memory.prepare(tmp, None)
        print(f"cap {args.cap} GiB per rank process")
        print("| run | return code | killed by the cap | peak under the cap, GiB (per rank) |")
        print("|---|---|---|---|")
        for label, ranks, strategy in (("one process", 1, "plain"),
                                       ("FSDP on 4 ranks", 4, "optim_grads_params")):
            groups = CappedGroups(parent, f"mf-cap-{os.getpid()}-{ranks}", cap)
            command = ["mf-train", "--config", str(config), "--nproc", str(ranks),
                       "--output-dir", str(tmp / f"out-{ranks}"),
                       *layout_memory.overrides(ranks, strategy)]
            try:
                code = run_capped(command, groups, tmp / f"log-{ranks}.txt", ranks == 1)
                rows = groups.report()
            finally:
                groups.remove()
            killed = sum(row["oom_kills"] for row in rows)
            peaks = ", ".join(f"{row['peak_gib']:.2f}" for row in rows)
            print(f"| {label} | {code} | {'yes' if killed else 'no'} ({killed}) | {peaks} |",
                  flush=True)
            if code:
                print((tmp / f"log-{ranks}.txt").read_text()[-1500:], file=sys.stderr)


if __name__ == "__main__":
    main()
