"""The flags that place `mf-train` in a job over several hosts, checked before anything starts.

`--nnodes N --node-rank R --master-addr HOST [--master-port P] --nproc K` runs this host's K
ranks as node R of an N-node job (msrun on every host, the same address and port on each):
the job, and every check made before it starts, has N*K ranks.
"""

from __future__ import annotations

import argparse

from mf_parallel.nodes import DEFAULT_MASTER_PORT, Nodes


class FlagError(ValueError):
    """A launcher flag is wrong; the message names the flag and what is allowed."""


def add_node_flags(parser: argparse.ArgumentParser) -> None:
    """--nnodes, --node-rank, --master-addr and --master-port."""
    parser.add_argument("--nnodes", type=int, default=1, metavar="N",
                        help="hosts of the job, each running --nproc ranks (default 1)")
    parser.add_argument("--node-rank", type=int, default=None, metavar="R",
                        help="this host's index in the job, 0 to N-1 (node 0 runs the "
                             "scheduler; required with --nnodes > 1)")
    parser.add_argument("--master-addr", default=None, metavar="HOST",
                        help="address of node 0 as every node reaches it (required with "
                             "--nnodes > 1; default with one node: 127.0.0.1)")
    parser.add_argument("--master-port", type=int, default=None, metavar="PORT",
                        help=f"the scheduler's port on node 0 (default with --nnodes > 1: "
                             f"{DEFAULT_MASTER_PORT}; with one node: a free port)")


NODE_OPTIONS = ("--nnodes", "--node-rank", "--master-addr", "--master-port")
"""The launcher's own options, with a value each (the ranks do not get them)."""


def nodes_from(args: argparse.Namespace) -> Nodes:
    """The node flags as `Nodes`, after checking them against each other and --nproc.

    Raises:
        FlagError: a flag is out of range, missing, or would have no effect.
    """
    if args.nnodes < 1:
        raise FlagError(f"--nnodes must be >= 1, got {args.nnodes}")
    if args.nnodes > 1:
        return _several(args)
    if args.node_rank not in (None, 0):
        raise FlagError(f"--node-rank {args.node_rank} is not a node of a one-node job; "
                        "give --nnodes with the number of hosts")
    if args.nproc == 1 and (args.master_addr is not None or args.master_port is not None):
        raise FlagError("--master-addr and --master-port place the ranks msrun starts, and "
                        "one process on one node trains without msrun; give --nproc > 1 or "
                        "--nnodes > 1, or leave them out")
    return _checked(master_addr=args.master_addr or "127.0.0.1", master_port=args.master_port)


def _several(args: argparse.Namespace) -> Nodes:
    missing = [flag for flag, value in (("--node-rank", args.node_rank),
                                        ("--master-addr", args.master_addr)) if value is None]
    if missing:
        raise FlagError(f"--nnodes {args.nnodes} needs {' and '.join(missing)}: every host "
                        "runs mf-train with its own --node-rank (0 to "
                        f"{args.nnodes - 1}) and the address of node 0")
    if not 0 <= args.node_rank < args.nnodes:
        raise FlagError(f"--node-rank must be between 0 and {args.nnodes - 1} for --nnodes "
                        f"{args.nnodes}, got {args.node_rank}")
    port = DEFAULT_MASTER_PORT if args.master_port is None else args.master_port
    return _checked(count=args.nnodes, rank=args.node_rank, master_addr=args.master_addr,
                    master_port=port)


def _checked(**fields: object) -> Nodes:
    """`Nodes(**fields)`; an address or port it refuses is a FlagError naming the flag."""
    port, addr = fields.get("master_port"), fields.get("master_addr")
    if port is not None and not 1 <= port <= 65535:
        raise FlagError(f"--master-port must be between 1 and 65535, got {port}")
    if not str(addr).strip():
        raise FlagError("--master-addr is empty: give the address of node 0")
    return Nodes(**fields)
