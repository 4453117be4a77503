"""Process-level switches read from the environment (read at call time, so tests can set them)."""

from __future__ import annotations

import os
import sys

__all__ = ["kernels_disabled", "use_triton_interpreter", "DISABLE_ENV"]

DISABLE_ENV = "TWINKLE_FX_DISABLE_KERNELS"


def kernels_disabled() -> bool:
    """True when ``TWINKLE_FX_DISABLE_KERNELS`` is 1/true/yes/on: every swap is skipped (logged)."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def use_triton_interpreter(*, command: str) -> None:
    """Run Triton kernels through the interpreter (no GPU). The variable is read when ``triton.jit``
    decorates a kernel, so it must be set before triton is imported: ``command`` (the caller, named in
    the error) calls this before importing anything that imports triton.

    Raises:
        RuntimeError: triton was imported before, so its kernels are bound to the compiler.
    """
    if os.environ.get("TRITON_INTERPRET") == "1":
        _check_interpreter()
        return
    # triton.language's own helpers (tl.sum, ...) are triton.jit functions too: once triton is
    # imported (torch._dynamo imports it on a machine with a GPU) they are bound to the compiler
    if "twinkle_triton" in sys.modules or "triton" in sys.modules:
        raise RuntimeError(f"triton was imported before TRITON_INTERPRET=1 was set, so {command} cannot run the "
                           "twinkle_triton kernels on the CPU; set TRITON_INTERPRET=1 before importing "
                           "torch and twinkle_fx (or in the shell).")
    os.environ["TRITON_INTERPRET"] = "1"
    _check_interpreter()


def _check_interpreter() -> None:
    """Refuse up front a Triton interpreter that cannot run the kernels, instead of failing in one.

    Triton's interpreter turns a loop bound into an int with ``int(array)`` on a 1-element array;
    NumPy 2.4 refuses that ("only 0-dimensional arrays can be converted to Python scalars"), and
    triton 3.6 (the version torch 2.11 pins) has no fix (triton 3.9 squeezes the array first).
    """
    import numpy as np

    try:
        int(np.ones(1))
        return
    except TypeError:
        pass
    import inspect

    import triton
    from triton.runtime import interpreter

    if "int(self.handle.data))" in inspect.getsource(interpreter):
        raise RuntimeError(
            f"The Triton interpreter of triton {triton.__version__} cannot run with numpy {np.__version__} (it "
            f"converts 1-element arrays with int(), which numpy >= 2.4 refuses): run on a GPU, or install "
            f"numpy<2.4 or a newer triton for CPU runs.")
