"""torch.library wiring shared by every op: define ``twinkle::<op>`` once per process.

The package can be imported twice in one process under two module names: as ``twinkle_triton``
and by the Hugging Face ``kernels`` loader, which imports the same files under the ``id`` of
``metadata.json``. ``torch.library.custom_op`` silently replaces an existing definition, which
would leave the first copy's functions calling a destroyed operator (and graphs compiled against
it stale). So the first definition wins and later copies reuse it.
"""

from collections.abc import Callable, Sequence

import torch

NAMESPACE = "twinkle"


def define_op(
    name: str,
    impl: Callable,
    *,
    fake: Callable,
    mutates_args: Sequence[str] = (),
    backward: Callable | None = None,
    setup_context: Callable | None = None,
):
    """Define ``twinkle::<name>`` from a type-annotated ``impl`` with its fake and autograd.

    Returns the callable operator (``torch.ops.twinkle.<name>.default`` when another copy of this
    package defined it first).
    """
    if hasattr(getattr(torch.ops, NAMESPACE), name):
        return getattr(getattr(torch.ops, NAMESPACE), name).default
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", impl, mutates_args=tuple(mutates_args))
    op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    return op
