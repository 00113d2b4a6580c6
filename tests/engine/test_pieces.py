"""posenc.engine.pieces: the device kernel's layout (:func:`~posenc.engine.pieces.device_lse`), checked on the CPU.

On CUDA the log-sum-exp pieces go to the memory-efficient kernel, which needs equal query and key heads and bias
rows aligned to 16 elements. The packing of a decode step's GQA query heads, the repeated keys of longer GQA calls
and the aligned copy of a bias (the Toeplitz kernel's strided views included) are the same code on every device;
here they run with :func:`~posenc.engine.pieces.math_lse` as the kernel and must equal the CPU flash kernel."""

from __future__ import annotations

import pytest
import torch

from posenc.engine import pieces


# ====================================================================== the device kernel's layout
@pytest.mark.parametrize("H,Hk", [(4, 4), (6, 2), (4, 1)])
@pytest.mark.parametrize("Nq,Nk", [(1, 37), (5, 70), (70, 70), (33, 130)])
@pytest.mark.parametrize("mask", ["none", "shared", "per_head", "toeplitz_view"])
def test_device_layout_equals_the_cpu_kernel(H, Hk, Nq, Nk, mask):
    """Packed decode steps, repeated keys, and aligned copies of every bias shape the backends pass (None, one
    mask for all heads, one per head, a strided Hankel view with stride 0 over the batch) give the CPU flash
    kernel's output and log-sum-exp."""
    g = torch.Generator().manual_seed(Nq * 131 + Nk)
    B, D = 2, 16
    q = torch.randn(B, H, Nq, D, generator=g) / 4
    k, v = (torch.randn(B, Hk, Nk, D, generator=g) for _ in range(2))
    bias = None
    if mask == "shared":
        bias = torch.randn(1, 1, Nq, Nk, generator=g)
    elif mask == "per_head":
        bias = torch.randn(B, H, Nq, Nk, generator=g)
    elif mask == "toeplitz_view":
        vec = torch.randn(H, Nq + Nk, generator=g)
        bias = vec.as_strided((B, H, Nq, Nk), (0, Nq + Nk, 1, 1))
    want = pieces._flash(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, q, k, v, bias)
    got = pieces.device_lse(pieces.math_lse, q, k, v, bias)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_device_layout_aligns_the_bias_rows():
    """The kernel receives a bias whose every stride but the last is a multiple of 16 elements (what the
    memory-efficient CUDA kernel requires) for key counts that are not."""
    seen = []

    def kernel(q, k, v, bias):
        seen.append(bias.stride())
        return pieces.math_lse(q, k, v, bias)

    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 37, 8), torch.randn(1, 2, 37, 8)
    pieces.device_lse(kernel, q, k, v, torch.zeros(1, 2, 3, 37))
    assert all(s % 16 == 0 for s in seen[0][:-1]) and seen[0][-1] == 1, seen
