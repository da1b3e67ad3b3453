"""What msrun runs on each rank of `mf-train --nproc N`: validate, build, train.

Installed as the `mf-train-rank` console script, which the launcher gives msrun on every node.
Usage (by the launcher): mf-train-rank --config FILE --output-dir DIR [--set K=V ...]
The world size comes from msrun's environment (MS_WORKER_NUM: every node's ranks); every rank
validates the same configuration again (cheap), so a rank never trains on a config another
rank rejected.
"""

from __future__ import annotations

import os
import sys

from mf_train.cli import run_training


def main() -> int:
    """Entry point of the `mf-train-rank` script."""
    return run_training(sys.argv[1:], world_size=int(os.environ["MS_WORKER_NUM"]))


if __name__ == "__main__":
    raise SystemExit(main())
