"""A kernel author's registrations, for ``twinkle-fx check --setup examples/my_kernels_setup.py``.

``twinkle-fx check`` runs this file before checking, so the checklist covers these kernels (next to
the built-in ones unless ``--no-builtin``): here the user-written Triton ``fast_add`` of
``examples/my_pkg/fast_ops.py`` replacing ``my_pkg.math_ops.add``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # my_pkg

from my_pkg.fast_ops import fast_add  # noqa: E402

from twinkle_fx import register_function_kernel  # noqa: E402

for device in ("cuda", "cpu"):  # on the CPU the Triton kernel runs through the interpreter
    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add,
                             device=device, mode="inference")
