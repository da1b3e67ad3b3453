"""Where one host's ranks sit in a job over several hosts (msrun's nodes): `Nodes`.

msrun numbers the ranks node by node: node `r` of a job with `k` ranks per node runs the
global ranks `r*k` to `r*k + k - 1`, and every node connects to the scheduler that msrun
starts on the node whose address is `master_addr`.

Pure Python: it never imports MindSpore.
"""

from __future__ import annotations

import attrs

#: msrun's own default scheduler port, used when a job over several nodes names none.
DEFAULT_MASTER_PORT = 8118


@attrs.frozen(kw_only=True)
class Nodes:
    """This host's place in the job: how many nodes, which one this is, where the scheduler is.

    Args:
        count: the number of nodes (hosts) of the job, each running the same number of ranks.
        rank: this node's index, 0 to `count - 1`; node 0 runs the scheduler.
        master_addr: the address of node 0, as every node reaches it.
        master_port: the scheduler's port on node 0; None: a free port on this host (one node
            only: other nodes could not know it).
    """

    count: int = 1
    rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None

    def __attrs_post_init__(self) -> None:
        problem = nodes_problem(self)
        if problem is not None:
            raise ValueError(problem)

    def local_ranks(self, nproc: int) -> range:
        """The global ranks msrun starts on this node when each node runs `nproc`."""
        return range(self.rank * nproc, (self.rank + 1) * nproc)

    @property
    def msrun_log(self) -> str:
        """The name of msrun's own log: one per node, so nodes can share a log directory."""
        return "msrun.log" if self.count == 1 else f"msrun_node{self.rank}.log"


def nodes_problem(nodes: Nodes) -> str | None:
    """What is wrong with `nodes` in words, or None."""
    if nodes.count < 1:
        return f"the number of nodes must be >= 1, got {nodes.count}"
    if not 0 <= nodes.rank < nodes.count:
        return (f"the node rank must be between 0 and {nodes.count - 1} (a job of "
                f"{nodes.count} node{'s' if nodes.count > 1 else ''}), got {nodes.rank}")
    if not nodes.master_addr.strip():
        return "the master address is empty"
    if nodes.master_port is not None and not 1 <= nodes.master_port <= 65535:
        return f"the master port must be between 1 and 65535, got {nodes.master_port}"
    if nodes.count > 1 and nodes.master_port is None:
        return "a job over several nodes needs a master port every node knows"
    return None
