"""Under msrun: rank 1 reaches the first collective SECONDS after rank 0 (as a rank still
compiling or loading does), then both all-reduce a vector of ones and print its sum.

Usage: late_rank.py SECONDS
"""

import sys
import time

import mindspore as ms
import numpy as np
from mindspore import Tensor, communication, mint

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
communication.init()
if communication.get_rank() == 1:
    time.sleep(float(sys.argv[1]))
ones = Tensor(np.ones(2, np.float32))
mint.distributed.all_reduce(ones)
print(f"sum {ones.asnumpy()[0]:g}", flush=True)
