"""NaN in, NaN out: a row of activations holding NaN or inf gives NaN outputs on every instruction set of the kernel
(via_sd/weights/lowbit_kernel.cpp), and the other rows of the call keep the bits they get alone."""

import pytest
import torch

from via_sd.weights import lowbit_kernel
from via_sd.weights.linears import Int4Linear, Int8Linear

from test_lowbit_kernel import int6_layer

pytestmark = pytest.mark.skipif(not lowbit_kernel.available(), reason=f"kernel not built: {lowbit_kernel.why_not()}")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_row_with_nan_or_inf_gives_nan_and_the_other_rows_their_own_bits(bad):
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(48, 256, generator=g) * 0.05, torch.randn(11, 256, generator=g)
    int4, int8 = Int4Linear.from_float(w, tiles=True), Int8Linear.from_float([w], tiles=True)
    int6 = int6_layer(48, 256)
    x[3, 40] = bad  # one value in one group of a row in the first block of 8 rows (AVX-512's)
    x[9, :32] = bad  # a whole group, in the second block
    broken, clean = [3, 9], [0, 1, 2, 4, 5, 6, 7, 8, 10]
    for path in range(lowbit_kernel.isa() + 1):  # generic, AVX2, AVX-512 VNNI: those this CPU runs
        for mm, weights in ((lowbit_kernel.int4_mm, (int4.packed, int4.scales)),
                            (lowbit_kernel.int6_mm, (int6.weight, int6.scales)),
                            (lowbit_kernel.int8_mm, (int8.weight, int8.scale))):
            y = mm(x, *weights, path)
            assert y[broken].isnan().all(), (mm.__name__, path)
            assert torch.equal(y[clean], mm(x[clean].contiguous(), *weights, path)), (mm.__name__, path)
            assert torch.equal(y[clean], mm(x[clean].contiguous(), *weights, 0)), (mm.__name__, path)
