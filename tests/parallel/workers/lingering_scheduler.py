"""Under msrun, without MindSpore: the scheduler stays for 10 minutes (as MindSpore's sleeps
up to 5 s before it sees that the last worker has left); each worker prints a line and exits
2 s later (as a rank that trains takes seconds), rank 1 with the status given (0 by default).

Usage: lingering_scheduler.py TAG [RANK_1_STATUS]

TAG is not used: a test passes its directory so that it can find the job's processes by
command line.
"""

import os
import sys
import time

if os.environ.get("MS_ROLE") != "MS_WORKER":
    time.sleep(600)
    sys.exit(0)
print(f"rank {os.environ['RANK_ID']} done", flush=True)
time.sleep(2)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 and os.environ["RANK_ID"] == "1" else 0)
