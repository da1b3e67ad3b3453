"""Under msrun: rank 1 fails after init while rank 0 waits for it in a collective.

Usage: failing_worker.py MODE [TAG]

Modes: `raise` (a Python exception), `kill` (rank 1 sends itself SIGKILL), `exit` (status 3
without a traceback), `hang` (rank 1 sleeps for an hour). TAG is not used: a test passes its
directory so that it can find the job's processes by command line. Rank 1 prints the
wall-clock time just before it fails, so the launcher's reaction time can be measured.
"""

import os
import signal
import sys
import time

import mindspore as ms
import numpy as np
from mindspore import Tensor, communication, ops

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
communication.init()
mode = sys.argv[1]
if communication.get_rank() == 1:
    print(f"rank 1 fails at {time.time():.3f}", flush=True)
    if mode == "raise":
        raise ValueError("rank 1 stops here on purpose")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "exit":
        os._exit(3)
    time.sleep(3600)
ops.AllReduce()(Tensor(np.ones(2, np.float32)))  # rank 0 waits for rank 1 here
