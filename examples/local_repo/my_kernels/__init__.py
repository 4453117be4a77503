"""A local kernel repository in the plain-package layout: ``<repo_path>/my_kernels/layers.py``.

twinkle_fx loads it with ``register_layer_kernel(repo_path=..., package_name="my_kernels",
layer_name=...)``. The layers run the Triton kernels of ``twinkle_triton``.
"""

from . import layers  # noqa: F401
