"""helpers.fusion.triton_softmax: the fused row softmax equals torch.softmax (odd shapes, masked rows, large
values, fp16) and refuses what it cannot do; in Triton's interpreter on a CPU."""
import math

import pytest
import torch

from helpers.fusion import triton_softmax

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the Triton softmax runs where Triton compiles (or interprets)


# where the kernel cannot run (no triton; or an interpreter that fails here, e.g. Triton 3.6 under NumPy 2.5)
needs_kernel = pytest.mark.skipif(triton_softmax.BROKEN is not None, reason=str(triton_softmax.BROKEN))


@needs_kernel
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 100), (2, 3, 33)])
@pytest.mark.parametrize("max_block", [None, 16])  # 16: rows longer than 16 take the online two-pass path
def test_triton_softmax_equals_torch_on_odd_shapes(shape, max_block):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)) * 5
    got = triton_softmax.softmax(x.to(DEV), max_block).cpu()
    torch.testing.assert_close(got, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)


@needs_kernel
@pytest.mark.parametrize("max_block", [None, 16])
def test_triton_softmax_masked_rows_are_nan_like_torch_and_partly_masked_rows_finite(max_block):
    x = torch.randn(4, 50)
    x[1] = float("-inf")  # fully masked: NaN, as torch.softmax gives
    x[2, :20] = float("-inf")  # the first block (16 wide) entirely -inf: must stay finite
    x[3, 7] = float("-inf")
    y = triton_softmax.softmax(x.to(DEV), max_block).cpu()
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2, 3]]).all()
    torch.testing.assert_close(y, torch.softmax(x, -1), rtol=1e-5, atol=1e-6, equal_nan=True)
    assert (y[2, :20] == 0).all() and y[2].sum().item() == pytest.approx(1.0, abs=1e-5)


@needs_kernel
def test_triton_softmax_large_magnitudes_and_fp16():
    x = torch.randn(6, 70, generator=torch.Generator().manual_seed(2)) * 1e4  # exp would overflow without the max
    for mb in (None, 16):
        got = triton_softmax.softmax(x.to(DEV), mb).cpu()
        torch.testing.assert_close(got, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
    h = (torch.randn(5, 40) * 300).half().to(DEV)  # near fp16's range
    torch.testing.assert_close(triton_softmax.softmax(h, 16), triton_softmax.reference(h), rtol=2e-3, atol=1e-3)  # one fp16 rounding
    assert triton_softmax.softmax(h).dtype == torch.float16


@needs_kernel
def test_triton_softmax_refuses_what_it_cannot_do():
    assert triton_softmax.block_for(100) == (128, False) and triton_softmax.block_for(100, 32) == (32, True) and triton_softmax.block_for(3) == (16, False)
    for bad in (dict(n_cols=0), dict(n_cols=8, max_block=24), dict(n_cols=8, max_block=8)):
        with pytest.raises(ValueError):
            triton_softmax.block_for(**bad)
    with pytest.raises(ValueError, match="dtype"):
        triton_softmax.softmax(torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="last dimension"):
        triton_softmax.softmax(torch.ones(2, 0, device=DEV))
    assert math.isclose(triton_softmax.softmax(torch.zeros(1, 4, device=DEV))[0, 0].item(), 0.25)


@needs_kernel
def test_the_launch_runs_the_kernel_it_is_given():
    """Notebook 09 launches the kernel its own cell defines through `kernel=`: the launch must run that one."""
    import triton
    import triton.language as tl

    @triton.jit
    def copy_row(x_ptr, y_ptr, n_cols, x_stride, y_stride, BLOCK: tl.constexpr, ONLINE: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        row = tl.program_id(0)
        x = tl.load(x_ptr + row * x_stride + offs, mask=offs < n_cols, other=0.0)
        tl.store(y_ptr + row * y_stride + offs, x, mask=offs < n_cols)

    x = torch.randn(3, 20).to(DEV)
    torch.testing.assert_close(triton_softmax.softmax(x, kernel=copy_row), x)  # a copy, not a softmax
    torch.testing.assert_close(triton_softmax.softmax(x, kernel=triton_softmax.softmax_row_kernel), torch.softmax(x, -1))
