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
    decorates a kernel, so it must be set before twinkle_triton is imported; if something imported
    it already, the ``twinkle-fx`` command starts over in a fresh interpreter with the variable set.

    Raises:
        RuntimeError: twinkle_triton was imported already and this is not the ``twinkle-fx`` command.
    """
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    os.environ["TRITON_INTERPRET"] = "1"
    if "twinkle_triton" not in sys.modules:
        return
    main_spec = getattr(sys.modules["__main__"], "__spec__", None)
    if (main_spec is not None and main_spec.name == "twinkle_fx.__main__") or os.path.basename(sys.argv[0]) == "twinkle-fx":
        print(f"{command}: restarting with TRITON_INTERPRET=1 (twinkle_triton was imported before it was set)",
              file=sys.stderr, flush=True)
        os.execv(sys.executable, sys.orig_argv)
    raise RuntimeError("twinkle_triton was imported before TRITON_INTERPRET=1 was set, so its kernels cannot run "
                       "on the CPU in this process; set TRITON_INTERPRET=1 before importing it.")
