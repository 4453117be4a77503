"""What importing ``twinkle_fx.compile`` wires up: the backend name and the pattern-tracing hook.

Both are idempotent and avoid importing ``torch._dynamo`` (a second of import time) until needed.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from ..registry import FUNCTION_REGISTRATION_HOOKS, FunctionRegistration, get_registry

logger = logging.getLogger(__name__)

BACKEND_NAME = "twinkle"


def _trace_on_registration(registration: FunctionRegistration) -> None:
    _trace(registration.target)


def _trace(target: str) -> None:
    from .pattern_tracing import trace_registered_function  # imports torch._dynamo: only when needed

    trace_registered_function(target)


def _register_backend_name() -> None:
    # With the package installed, torch.compile finds the backend through the entry point and
    # registers it itself; registering here too would make its lookup fail on a duplicate name.
    if BACKEND_NAME in entry_points(group="torch_dynamo_backends").names:
        return
    from torch._dynamo import list_backends, register_backend

    if BACKEND_NAME not in list_backends(exclude_tags=()):
        from .backend import twinkle_backend

        register_backend(compiler_fn=twinkle_backend, name=BACKEND_NAME)


def install() -> None:
    """Install the registration hook (and trace functions registered before it), register the name."""
    if _trace_on_registration not in FUNCTION_REGISTRATION_HOOKS:
        FUNCTION_REGISTRATION_HOOKS.append(_trace_on_registration)
        for target in get_registry().function_targets():
            _trace(target)
    _register_backend_name()
