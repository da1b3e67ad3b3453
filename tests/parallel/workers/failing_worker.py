"""Under msrun: rank 1 raises after init, or (with `hang`) blocks forever in a collective."""

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
    if mode == "raise":
        raise ValueError("rank 1 stops here on purpose")
    time.sleep(3600)
ops.AllReduce()(Tensor(np.ones(2, np.float32)))  # rank 0 waits for rank 1 here
