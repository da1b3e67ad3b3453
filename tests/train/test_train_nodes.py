"""`mf-train --nnodes 2 --node-rank R --master-addr HOST --master-port P`: one job over two
hosts, here two "nodes" of one rank each on this host over 127.0.0.1; and the node flags'
errors, given before anything starts."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runs import QWEN3, QWEN3_4_LAYERS, steps
from runs import arguments as train_arguments

from mf_parallel.msrun import free_port, kill_group
from mf_train.launch.cli import run

SETS = (*QWEN3_4_LAYERS, "training.steps=3", "checkpoint.enable_save=false",
        "parallelism.data_parallel_shard=1")


def arguments(prefix: str, output: Path) -> list[str]:
    return train_arguments(QWEN3, output, prefix, SETS)


def losses(output: Path) -> list[float]:
    return [step["loss"] for step in steps(output)]


@pytest.mark.parametrize(("flags", "message"), [
    (["--nnodes", "0"], "--nnodes must be >= 1, got 0"),
    (["--nnodes", "2", "--master-addr", "10.0.0.1"],
     "--nnodes 2 needs --node-rank: every host runs mf-train with its own --node-rank (0 to 1) "
     "and the address of node 0"),
    (["--nnodes", "2"], "--nnodes 2 needs --node-rank and --master-addr: every host runs"),
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "10.0.0.1"],
     "--node-rank must be between 0 and 1 for --nnodes 2, got 2"),
    (["--nnodes", "2", "--node-rank", "-1", "--master-addr", "10.0.0.1"],
     "--node-rank must be between 0 and 1 for --nnodes 2, got -1"),
    (["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "0"],
     "--master-port must be between 1 and 65535, got 0"),
    (["--nnodes", "2", "--node-rank", "1", "--master-addr", " "],
     "--master-addr is empty: give the address of node 0"),
    (["--node-rank", "1"], "--node-rank 1 is not a node of a one-node job; give --nnodes"),
    (["--master-port", "8118"], "--master-addr and --master-port place the ranks msrun starts"),
])
def test_bad_node_flags_stop_before_anything_starts(flags, message, tmp_path, capsys) -> None:
    assert run(["--config", str(tmp_path / "absent.yaml"), "--output-dir",
                str(tmp_path / "out"), *flags]) == 2
    assert capsys.readouterr().err.startswith(f"mf-train: {message}")
    assert not (tmp_path / "out").exists()


def test_the_checks_see_every_node_s_ranks(data_prefix, tmp_path, capsys) -> None:
    """The plan is made for the whole job's ranks (2 nodes x 2), before any rank starts."""
    pytest.importorskip("mindspore")
    args = [*arguments(data_prefix, tmp_path / "out"), "--set",
            "parallelism.data_parallel_shard=3", "--nnodes", "2", "--node-rank", "1",
            "--master-addr", "127.0.0.1", "--nproc", "2"]
    assert run(args) == 2
    assert capsys.readouterr().err == (
        "mf-train: data_parallel_shard (3) must divide the data-parallel degree 4 (world size 4 "
        "/ (tensor 1 x context 1 x pipeline 1))\n")
    assert not (tmp_path / "out").exists()


def _wait_until_listening(port: int, process: subprocess.Popen, deadline: float) -> None:
    """Until something (node 0's scheduler) holds `port` on 127.0.0.1: node 0's scheduler
    must own the port before node 1's msrun starts its own, which then fails to bind (see
    mf_parallel.launch); fails if node 0 ends or the deadline passes."""
    while time.monotonic() < deadline and process.poll() is None:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return
        time.sleep(0.2)
    raise AssertionError(f"node 0 never listened on port {port} (exit {process.poll()})")


@pytest.mark.ranks
def test_two_nodes_on_one_host_match_one_process(data_prefix, tmp_path) -> None:
    """Two mf-train processes, node 0 and node 1 of one rank each, over 127.0.0.1: the job's
    losses equal one process's with the same global batch, and each node has its rank's log."""
    pytest.importorskip("mindspore")
    assert run(arguments(data_prefix, tmp_path / "one")) == 0
    port = free_port()
    nodes: list[subprocess.Popen] = []
    try:
        for rank in (0, 1):
            command = [sys.executable, "-m", "mf_train.launch.cli",
                       *arguments(data_prefix, tmp_path / f"node{rank}"), "--nnodes", "2",
                       "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                       "--master-port", str(port), "--timeout", "120"]
            log = open(tmp_path / f"node{rank}.out", "wb")  # noqa: SIM115 - closed below
            nodes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
            log.close()
            if rank == 0:
                _wait_until_listening(port, nodes[0], time.monotonic() + 120)
        codes = [node.wait(timeout=180) for node in nodes]
    finally:
        for node in nodes:
            kill_group(node)
    outputs = [(tmp_path / f"node{rank}.out").read_text(errors="replace") for rank in (0, 1)]
    assert codes == [0, 0], outputs
    assert losses(tmp_path / "node0") == pytest.approx(losses(tmp_path / "one"), rel=1e-5)
    assert len(losses(tmp_path / "one")) == 3
    assert (tmp_path / "node0" / "logs" / "worker_0.log").exists()
    assert (tmp_path / "node1" / "logs" / "worker_1.log").exists()
    assert not (tmp_path / "node1" / "metrics.jsonl").exists()  # rank 0 writes the metrics
    assert "node 1 finished its ranks 1-1" in outputs[1]


@pytest.mark.ranks
def test_a_busy_master_port_ends_every_node_with_one_line(data_prefix, tmp_path) -> None:
    """--master-port held by another program: node 0 refuses it before starting anything, and
    node 1, whose ranks would retry the port for ever, ends once no rank joined for the hang
    timeout, naming the port. Both in bounded time."""
    pytest.importorskip("mindspore")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        nodes: list[subprocess.Popen] = []
        try:
            for rank in (0, 1):
                command = [sys.executable, "-m", "mf_train.launch.cli",
                           *arguments(data_prefix, tmp_path / f"node{rank}"), "--nnodes", "2",
                           "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                           "--master-port", str(port), "--timeout", "300",
                           "--hang-timeout", "40"]
                nodes.append(subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.PIPE, start_new_session=True))
            errors = [node.communicate(timeout=240)[1].decode() for node in nodes]
        finally:
            for node in nodes:
                kill_group(node)
    assert [node.returncode for node in nodes] == [1, 1], errors
    assert errors[0].splitlines()[-1] == (
        f"mf-train: the master port {port} is in use on 127.0.0.1 (another job's scheduler, "
        "or another program); choose another --master-port")
    last = errors[1].splitlines()[-1]
    assert last.startswith(f"mf-train: node 1: the ranks found no scheduler answering at "
                           f"127.0.0.1:{port} in "), errors[1]
    assert last.endswith(f"logs in {tmp_path / 'node1' / 'logs'}")
