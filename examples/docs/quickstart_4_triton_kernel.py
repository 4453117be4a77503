"""custom-kernel-quickstart.md, "Writing a new kernel — Triton", run as written; the later scripts
import my_custom_op from here.

    python examples/docs/quickstart_4_triton_kernel.py
"""

import torch  # the block's wrapper uses torch without importing it

from _setup import DEVICE

# --- the document's block ---
import triton
import triton.language as tl

@triton.jit
def my_custom_kernel(
    input_ptr,
    output_ptr,
    n_elements,
    BLOCK_SIZE: tl.constexpr,
):
    pid = tl.program_id(0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements

    # load
    x = tl.load(input_ptr + offsets, mask=mask)

    # your computation
    output = x * 2.0  # example

    # store
    tl.store(output_ptr + offsets, output, mask=mask)

# Python wrapper
def my_custom_op(x):
    output = torch.empty_like(x)
    n_elements = x.numel()
    BLOCK_SIZE = 1024
    grid = lambda meta: (triton.cdiv(n_elements, meta['BLOCK_SIZE']),)

    my_custom_kernel[grid](x, output, n_elements, BLOCK_SIZE=BLOCK_SIZE)
    return output
# --- end of the block ---


def torch_reference(x):
    """What my_custom_op computes, in PyTorch (the later scripts compare against it)."""
    return x * 2.0


if __name__ == "__main__":
    x = torch.randn(3000, device=DEVICE)  # three blocks, the last one masked
    print("my_custom_op(x) == 2 * x:", torch.equal(my_custom_op(x), torch_reference(x)))
