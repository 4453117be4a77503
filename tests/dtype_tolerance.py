"""``assert_close`` at a dtype's tolerance (``twinkle_fx.core.tolerances``), for the tests of every folder.

(A uniquely named top-level module: test folders have no ``__init__.py``, and ``tests/`` is on ``sys.path``
through its conftest, as for ``device_under_test``.)"""

import torch

from twinkle_fx.core.tolerances import tolerance


def assert_close(actual, expected, dtype: torch.dtype, what: str) -> None:
    """Plain comparison with the tolerances of ``dtype``."""
    rtol, atol = tolerance(dtype).rtol, tolerance(dtype).atol
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{what} ({dtype}): {m}")
