"""kernels-community/linear, as the examples' offline Hub cache serves it: a Triton matmul and the
``Linear`` layer built on it (``layers.Linear`` replaces ``torch.nn.Linear.forward``).

Published into a Hugging Face cache by ``examples/make_offline_hub_cache.py`` (and the tests), so
``register_layer_kernel(kernel_name="linear", repo_id="kernels-community/linear", ...)`` loads it
through the real ``kernels.get_kernel`` without a network.
"""

from . import layers
from .matmul import linear, matmul

__all__ = ["layers", "linear", "matmul"]
