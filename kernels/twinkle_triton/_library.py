"""torch.library wiring shared by every op: define ``twinkle::<op>`` once per process, and call it
without the dispatcher when nothing needs it.

The package can be imported twice in one process under two module names: as ``twinkle_triton``
and by the Hugging Face ``kernels`` loader, which imports the same files under the ``id`` of
``metadata.json``. ``torch.library.custom_op`` silently replaces an existing definition, which
would leave the first copy's functions calling a destroyed operator (and graphs compiled against
it stale). So the first definition wins and later copies reuse it.

Eager calls skip the custom op. A ``custom_op`` call is a Python dispatcher round trip, and its
registered autograd another one in backward; measured on an H200 host (torch 2.11) that is about
0.3 ms of CPU per forward + backward of one op (0.58 ms for rotary's two outputs), more than the
kernels' GPU time (25-180 us at LLM shapes), so the GPU starved between launches. A
``torch.autograd.Function`` running the same impl, setup_context and backward costs a fraction of
that. The custom op stays the only path whenever something may trace or intercept the call:
torch.compile/export (``is_compiling``), fake or functional tensors (any tensor subclass but
``nn.Parameter``), a ``TorchDispatchMode`` (make_fx, FakeTensorMode, FlopCounter) or a functorch
transform (vmap, grad). Both paths run the same functions, so their results are identical.
"""

from collections.abc import Callable, Sequence

import torch

NAMESPACE = "twinkle"

_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def _runs_eagerly(args: tuple) -> bool:
    """True when a call with ``args`` may bypass the dispatcher (see the module docstring)."""
    if (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack()
        or torch._C._are_functorch_transforms_active()
    ):
        return False
    for a in args:
        if isinstance(a, torch.Tensor) and type(a) not in _PLAIN_TENSOR_TYPES:
            return False
    return True


class TwinkleOp:
    """``twinkle::<name>``: callable like the custom op; eager calls take a lean path.

    ``op`` is the custom op (``torch.ops.twinkle.<name>.default`` semantics). Calling the object
    runs ``impl`` directly (ops without autograd) or through a ``torch.autograd.Function`` built
    from the same ``setup_context``/``backward`` (ops with autograd) when ``_runs_eagerly``.
    """

    def __init__(self, name: str, op, impl: Callable, backward: Callable | None, setup_context: Callable | None):
        self.name, self.op, self.impl = name, op, impl
        self._function = None
        if backward is not None:
            def forward(ctx, *args):
                out = impl(*args)
                setup_context(ctx, args, out)
                return out

            self._function = type(
                f"{name}_function", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)},
            )

    def __call__(self, *args):
        if not _runs_eagerly(args):
            return self.op(*args)
        if self._function is None or not torch.is_grad_enabled():
            return self.impl(*args)
        return self._function.apply(*args)

    def __repr__(self) -> str:
        return f"<TwinkleOp {NAMESPACE}::{self.name}>"


def define_op(
    name: str,
    impl: Callable,
    *,
    fake: Callable,
    mutates_args: Sequence[str] = (),
    backward: Callable | None = None,
    setup_context: Callable | None = None,
) -> TwinkleOp:
    """Define ``twinkle::<name>`` from a type-annotated ``impl`` with its fake and autograd.

    Returns a :class:`TwinkleOp` whose ``op`` is the custom op (``torch.ops.twinkle.<name>.default``
    when another copy of this package defined it first).
    """
    if hasattr(getattr(torch.ops, NAMESPACE), name):
        op = getattr(getattr(torch.ops, NAMESPACE), name).default
    else:
        op = torch.library.custom_op(f"{NAMESPACE}::{name}", impl, mutates_args=tuple(mutates_args))
        op.register_fake(fake)
        if backward is not None:
            op.register_autograd(backward, setup_context=setup_context)
    return TwinkleOp(name, op, impl, backward, setup_context)
