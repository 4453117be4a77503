"""The device the suite runs on: the GPU when there is one, else the CPU through the Triton interpreter.

One rule for every test (``tests/conftest.py`` turns it into the ``device`` fixture and the ``gpu`` /
``interpreter`` markers); helper modules that build models at import time read ``DEVICE`` from here.
``TRITON_INTERPRET=1`` set by the caller wins: the suite then runs on the CPU even on a GPU machine
(the interpreter cannot run kernels on CUDA tensors).
"""

import os

import torch

if not torch.cuda.is_available():
    # must happen before any triton.jit runs, i.e. before the kernels are imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"
