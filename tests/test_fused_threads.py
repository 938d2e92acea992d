"""A fused layer (via_sd/weights/fused.py) serves each thread the output of its own input: threads running one drafter
at once never read each other's."""

import sys
import threading

import torch

from via_sd.weights.fused import FusedInt4
from via_sd.weights.linears import Int4Linear


def test_threads_running_one_fused_layer_get_what_each_gets_alone():
    g = torch.Generator().manual_seed(0)
    fused = FusedInt4([Int4Linear.from_float(torch.randn(64, 64, generator=g)) for _ in "qkv"])
    inputs = [torch.randn(rows, 64, generator=g) for rows in (1, 2, 3, 4)]
    alone = [[fused.part(i, x) for i in range(3)] for x in inputs]
    wrong = [0] * len(inputs)

    def run(t: int) -> None:
        for _ in range(10000):  # small layers, many calls: one shared output was read wrong in 8 runs of 8
            try:
                wrong[t] += not all(torch.equal(fused.part(i, inputs[t]), y) for i, y in enumerate(alone[t]))
            except TypeError:  # another thread's "every part served" emptied the shared output
                wrong[t] += 1

    threads, interval = [threading.Thread(target=run, args=(t,)) for t in range(len(inputs))], sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads take turns between any two lines, as on a busy machine
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == [0] * len(inputs) and not fused._calls  # and no thread left its activations behind
