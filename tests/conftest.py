"""Test-wide setup.

TRITON_INTERPRET must be set before any ``triton.jit`` runs, so it is set here, before the kernels
are imported, whenever no GPU is present (CI runs on CPU only).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
