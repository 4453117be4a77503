"""What importing ``twinkle_fx.compile`` wires up: the backend name, nothing else.

Idempotent, and avoids importing ``torch._dynamo`` (a second of import time) when the installed
entry point already names the backend. Registering a function kernel traces nothing: the backend
traces each registered function the first time it needs its pattern (:mod:`.regions.pattern_tracing`).
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

logger = logging.getLogger(__name__)

BACKEND_NAME = "twinkle"


def _register_backend_name() -> None:
    # With the package installed, torch.compile finds the backend through the entry point and
    # registers it itself; registering here too would make its lookup fail on a duplicate name.
    if BACKEND_NAME in entry_points(group="torch_dynamo_backends").names:
        return
    from ..core.torch_internals import dynamo_backend_names, register_dynamo_backend

    if BACKEND_NAME not in dynamo_backend_names():
        from .backend import twinkle_backend

        register_dynamo_backend(BACKEND_NAME, twinkle_backend)


def install() -> None:
    """Make the name "twinkle" known to ``torch.compile``."""
    _register_backend_name()
