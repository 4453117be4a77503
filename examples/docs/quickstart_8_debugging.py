"""custom-kernel-quickstart.md, "Debugging", run as written. Its peak-memory half uses
``torch.cuda`` statistics, which a CPU build of torch does not have: without a GPU, the block's
correctness half runs as written and the memory half is reported as not run.

    python examples/docs/quickstart_8_debugging.py
"""

import torch

from _setup import DEVICE
from quickstart_4_triton_kernel import my_custom_op, torch_reference as reference_implementation

x = torch.randn(4096, device=DEVICE)

if torch.cuda.is_available():
    # --- the document's block ---
    output_custom = my_custom_op(x)
    output_reference = reference_implementation(x)
    assert torch.allclose(output_custom, output_reference, rtol=1e-5)
    print(f"Max diff: {(output_custom - output_reference).abs().max()}")

    torch.cuda.reset_peak_memory_stats()
    output = my_custom_op(x)
    mem = torch.cuda.max_memory_allocated() / 1024**2
    print(f"Peak memory: {mem:.2f} MB")
    # --- end of the block ---
else:
    output_custom = my_custom_op(x)
    output_reference = reference_implementation(x)
    assert torch.allclose(output_custom, output_reference, rtol=1e-5)
    print(f"Max diff: {(output_custom - output_reference).abs().max()}")
    print("Peak memory: not measured (torch.cuda statistics need a GPU)")
