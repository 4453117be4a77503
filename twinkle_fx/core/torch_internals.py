"""Every access twinkle_fx makes to a private torch, Dynamo or Inductor name, one accessor each.

None of these is a public torch API, so each may move between torch releases; keeping them here
means a torch upgrade is checked in one file, and ``tests/core/test_torch_internals.py`` has one
test per accessor that fails when the name it reaches moves. Imports of ``torch._dynamo`` and
``torch._inductor`` happen inside the accessors: importing this module costs nothing, and Dynamo
(a second of import time) loads only where it is used. The Triton kernels' launch-time accesses
(``kernels/twinkle_triton/_launch.py``) stay with the kernels, which import nothing from here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["inductor_config_values"]


def inductor_config_values() -> dict[str, Any]:
    """A copy of ``torch._inductor.config``: every key (dotted for nested ones) and its current value."""
    from torch._inductor import config

    return config.get_config_copy()
