""":func:`check_kernels` (the library side of ``twinkle-fx check``): the kernel author's checklist, run
for every registered kernel against the original it replaces; one module per item.

For each target (a layer class bound to a kernel name, or a registered function), on one device:

===============  ==========================================================================================
correctness      outputs and gradients (inputs and parameters) of the kernel vs the original, for several
                 sizes (odd ones included) and dtypes against an fp64 run of the original: the kernel's
                 error norm within PyTorch's own (same dtype) plus the tolerances of
                 :mod:`twinkle_fx.core.tolerances`; an inference-only kernel is checked forward only
speed-up         median time of the original / the kernel (forward + backward when the kernel has one),
                 eager at every size, and both under ``torch.compile`` (Inductor) where the kernel can
                 compile; the guide's bar is 1.2x. Under the Triton interpreter (CPU) times say nothing
                 about speed: N/A
sizes            the kernel is not slower than the original at any size checked
memory           (GPU) peak memory of one call above what was allocated before it, kernel vs original
fallback         the swap keeps the original: after undo, the layer's forward / the module's function is
                 the original object again and gives bit-identical outputs
profiler         the top rows of ``torch.profiler`` for the kernel's call (device time on a GPU)
documented       the kernel carries a docstring
===============  ==========================================================================================

Inputs: the built-in targets (transformers RMSNorm / MLP / ForCausalLM classes of a model family,
their ``apply_rotary_pos_emb``) are built from a small config of their family; other modules are
built with no arguments (``torch.nn.Linear`` / ``LayerNorm`` with the width) and get one
``(rows, width)`` tensor; other functions get one such tensor per required parameter. Anything
else takes ``inputs={target: make}`` (see :class:`CheckInputs`); a target whose inputs cannot be
made is reported as not checked, with the reason.
"""

from .checklist import check_kernels
from .report import (CHECKLIST, SPEEDUP_BAR, CheckInputs, CheckReport, CorrectnessCase, KernelCheck,
                     SpeedCase)

__all__ = ["CHECKLIST", "SPEEDUP_BAR", "CheckInputs", "CheckReport", "CorrectnessCase", "KernelCheck", "SpeedCase",
           "check_kernels"]
