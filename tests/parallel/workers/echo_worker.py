"""Under msrun, without MindSpore: rank 0 prints known lines, waits until GO_FILE exists (the
test creates it once it has seen those lines echoed, so they must arrive while the job runs),
then prints more, the last without a newline. Rank 1 prints a line that must not be echoed.

Usage: echo_worker.py GO_FILE
"""

import os
import sys
import time
from pathlib import Path

if os.environ.get("MS_ROLE") != "MS_WORKER":  # msrun's scheduler runs this script too
    sys.exit(0)
go = Path(sys.argv[1])
if os.environ["RANK_ID"] != "0":
    print("rank 1 has nothing to say")
    sys.exit(0)
for n in (1, 2, 3):
    print(f"echo {n}")  # no flush: the launcher asks for unbuffered output when it echoes
deadline = time.monotonic() + 120
while not go.exists():
    if time.monotonic() > deadline:
        raise TimeoutError(f"{go} never appeared: the lines were not echoed while rank 0 ran")
    time.sleep(0.1)
print("echo 4")
sys.stdout.write("echo 5 without a newline")
