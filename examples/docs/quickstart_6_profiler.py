"""custom-kernel-quickstart.md, "Performance advice" 2: the profiler, run as written (writes
trace.json in the current folder; on the CPU torch warns that CUDA profiling is off).

    python examples/docs/quickstart_6_profiler.py
"""

import torch

from _setup import DEVICE
from quickstart_4_triton_kernel import my_custom_op

x = torch.randn(4096, device=DEVICE)

# --- the document's block ---
from torch.profiler import profile, ProfilerActivity

with profile(
    activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
    record_shapes=True,
) as prof:
    output = my_custom_op(x)

print(prof.key_averages().table(sort_by="cuda_time_total"))
prof.export_chrome_trace("trace.json")
# --- end of the block ---
