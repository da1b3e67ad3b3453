"""What msrun runs on each rank of `mf-train --nproc N`: validate, build, train.

Usage (by the launcher): rank_worker.py --config FILE --output-dir DIR [--set K=V ...]
The world size comes from msrun's environment (MS_WORKER_NUM); every rank validates the same
configuration again (cheap), so a rank never trains on a config another rank rejected.
"""

from __future__ import annotations

import os
import sys

from mf_train.cli import run_training

if __name__ == "__main__":
    raise SystemExit(run_training(sys.argv[1:], world_size=int(os.environ["MS_WORKER_NUM"])))
