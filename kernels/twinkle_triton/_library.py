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
On the eager path the impl's launches skip Triton's JIT dispatch too (``_launch.CachedLauncher``:
the same compiled kernel with the same arguments), and nothing on it is a context manager.

On a GPU the ops are ``torch.library.triton_op``s: when AOTAutograd traces them for Inductor it
records each ``wrap_triton(kernel)[grid](...)`` launch of the impl, and Inductor calls the kernels
from its generated code like its own, with no custom-op dispatch per call. Measured on an H200
(torch 2.11) in the Qwen2-0.5B training step, the opaque custom ops cost 86-167 us of CPU per call
(rms_norm_backward 167, rotary 97 + 105, silu_mul 90 + 106) for 4-50 us kernels, so the compiled
step waited on the host. The Triton interpreter (``TRITON_INTERPRET=1``, CPU) keeps
``torch.library.custom_op``: ``triton_op`` + ``wrap_triton`` does not run under the interpreter
inside torch.compile. ``TWINKLE_TRITON_OP=0``/``1`` overrides the choice (read once, at import).

Tensors on a device without a Triton backend (the CPU without ``TRITON_INTERPRET=1``, MPS, ...) run
the op's PyTorch reference instead, with one logging WARNING per device type; meta tensors run the
op's fake implementation (meta outputs of the right shape and dtype). The decision is made here,
for every op, from the device of the op's first argument: on CUDA it costs one ``is_cuda`` test.
"""

import inspect
import logging
import os
import threading
import typing
from collections.abc import Callable, Sequence

import torch

from ._launch import cached_launcher
from ._torch_internals import dispatch_modes_active, functorch_transforms_active, is_wrap_triton_enabled

NAMESPACE = "twinkle"


def _use_triton_op() -> bool:
    override = os.environ.get("TWINKLE_TRITON_OP")
    if override is not None:
        if override not in ("0", "1"):
            raise ValueError(f"TWINKLE_TRITON_OP={override!r}; set it to 0 (torch.library.custom_op) or 1 "
                             "(torch.library.triton_op), or unset it to choose by device.")
        return override == "1"
    return os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available()


# Whether ops are defined with torch.library.triton_op (True) or torch.library.custom_op (False).
USE_TRITON_OP = _use_triton_op()

# Whether Triton runs the kernels on CPU tensors (its interpreter). Read once, at import, as
# triton.jit reads it when the kernels below it are defined.
KERNELS_RUN_ON_CPU = os.environ.get("TRITON_INTERPRET") == "1"

logger = logging.getLogger(__name__)

# Device types whose fallback to the references was already logged (once each per process).
_FALLBACK_LOGGED: set[str] = set()


def reset() -> None:
    """Log the fallback to the references again on its next use; for test fixtures."""
    _FALLBACK_LOGGED.clear()


class _EagerCall(threading.local):
    """Per thread: True while a :class:`TwinkleOp` runs its impl directly (no dispatcher, no tracing)."""

    active = False


_eager_call = _EagerCall()


def wrap_triton(kernel):
    """How an impl launches ``kernel``: ``torch.library.wrap_triton(kernel)`` while a ``triton_op``
    impl is being traced; otherwise the kernel's :class:`~._launch.CachedLauncher` (the
    compiled kernel launched without the JIT's dispatch; ``kernel`` itself under the interpreter).

    Launch sites spell ``wrap_triton(<kernel>)[grid](...)`` with the kernel's global name: torch
    reads the impl's source for those calls to put the kernels' source in its compile-cache keys.
    """
    if USE_TRITON_OP and not _eager_call.active and is_wrap_triton_enabled():
        return torch.library.wrap_triton(kernel)
    return cached_launcher(kernel)

_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


class TwinkleOp:
    """``twinkle::<name>``: callable like the custom op; eager calls take a lean path.

    ``op`` is the custom op (``torch.ops.twinkle.<name>.default`` semantics). Calling the object
    runs ``impl`` directly (ops without autograd) or through a ``torch.autograd.Function`` built
    from the same ``setup_context``/``backward`` (ops with autograd) when nothing may trace or
    intercept the call (see the module docstring); otherwise it calls ``op``. On a device without a
    Triton backend it runs ``reference`` (plain, differentiable PyTorch) instead, or ``op`` (its
    fake) for meta tensors.
    """

    def __init__(self, name: str, op, impl: Callable, backward: Callable | None, setup_context: Callable | None,
                 reference: Callable | None = None):
        self.name, self.op, self.impl, self.reference = name, op, impl, reference
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
        # Everything in one frame: this runs a few hundred times a training step.
        first = args[0]
        if not first.is_cuda and not (KERNELS_RUN_ON_CPU and first.device.type == "cpu"):
            return self._without_kernels(first.device.type, args)
        if (
            torch.compiler.is_compiling()
            or dispatch_modes_active()
            or functorch_transforms_active()
        ):
            return self.op(*args)
        for a in args:
            if isinstance(a, torch.Tensor) and type(a) not in _PLAIN_TENSOR_TYPES:
                return self.op(*args)
        state = _eager_call
        if state.active:  # nested (an op calling another): the flag is already set
            return self._run(args)
        # No context manager on this path: a try/finally costs a fraction of contextlib's frames.
        state.active = True
        try:
            if self._function is None or not torch.is_grad_enabled():
                return self.impl(*args)
            return self._function.apply(*args)
        finally:
            state.active = False

    def _without_kernels(self, device: str, args: tuple):
        """The call on a device Triton cannot launch on: the fake for meta tensors, else the reference."""
        if device == "meta":
            return self.op(*args)
        if self.reference is None:
            raise RuntimeError(
                f"{NAMESPACE}::{self.name}: Triton has no backend for {device} tensors here and this op has no "
                "PyTorch reference to run instead;\npass CUDA tensors, or set TRITON_INTERPRET=1 before importing "
                "twinkle_triton to run the kernels on the CPU through Triton's interpreter."
            )
        # Not from inside a graph being traced: the log call would break it, and the eager run logs.
        if not torch.compiler.is_compiling() and device not in _FALLBACK_LOGGED:
            _FALLBACK_LOGGED.add(device)
            logger.warning(
                "twinkle_triton: Triton has no backend for %s tensors here (%s was called on them); the ops run "
                "their PyTorch references (<op>_reference) on %s: same results, none of the kernels' speed.\n"
                "Pass CUDA tensors, or set TRITON_INTERPRET=1 before importing twinkle_triton to run the "
                "kernels on the CPU through Triton's interpreter (slow; for tests).",
                device, self.name, device,
            )
        return self.reference(*args)

    def _run(self, args: tuple):
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
    inline_kernels: bool = True,
    reference: Callable | None = None,
) -> TwinkleOp:
    """Define ``twinkle::<name>`` from a type-annotated ``impl`` with its fake and autograd.

    ``impl``'s first argument is a tensor: its device decides between the kernels and
    ``reference``, a plain-PyTorch (differentiable) function of the same arguments that calls on a
    device without a Triton backend run instead. It returns what the op's callers use: outputs that
    only the kernels' backward needs (saved statistics, gradients computed in the forward) may be None.

    With ``USE_TRITON_OP`` and ``inline_kernels`` the op is a ``torch.library.triton_op``: ``impl``
    may then use only torch ops and ``wrap_triton(kernel)[grid](...)`` launches (no ``data_ptr``,
    ``item`` or branches on tensor values; shapes, strides and dtypes are fine). Otherwise it is a
    ``torch.library.custom_op``, opaque to Inductor. ``fake`` serves both (for a ``triton_op`` it
    replaces tracing ``impl`` on fake tensors).

    Returns a :class:`TwinkleOp` whose ``op`` is the custom op (``torch.ops.twinkle.<name>.default``
    when another copy of this package defined it first).
    """
    if hasattr(getattr(torch.ops, NAMESPACE), name):
        op = getattr(getattr(torch.ops, NAMESPACE), name).default
    else:
        define = torch.library.triton_op if USE_TRITON_OP and inline_kernels else torch.library.custom_op
        op = define(f"{NAMESPACE}::{name}", impl, mutates_args=tuple(mutates_args))
        op.register_fake(fake)
        if backward is not None:
            op.register_autograd(backward, setup_context=setup_context)
    return TwinkleOp(name, op, impl, backward, setup_context, reference)


def define_differentiable_op(
    name: str,
    impl: Callable,
    *,
    fake: Callable,
    backward: Callable,
    backward_fake: Callable,
    saved: Sequence[str],
    gradients: Callable[[tuple, list], tuple] | None = None,
    non_differentiable: Sequence[str] = (),
    inline_kernels: bool = True,
    reference: Callable | None = None,
) -> TwinkleOp:
    """Define ``twinkle::<name>`` and ``twinkle::<name>_backward`` with the autograd wiring between
    them generated from a declaration, instead of a hand-written ``setup_context`` and backward.
    ``reference`` is :func:`define_op`'s.

    ``backward(*output_gradients, *saved)`` is the backward op's impl (type-annotated, like ``impl``):
    it receives the gradient of each differentiable output of ``impl``, then the values named in
    ``saved``: names of ``impl``'s parameters (tensors, ``Tensor | None`` included, are kept with
    ``save_for_backward``, other values on the context) or ``"output"`` / ``"output[i]"`` for (one of)
    its outputs. Its results (a tensor or a tuple) are by default the gradients of ``impl``'s tensor
    parameters, in order, and every other parameter gets None; ``gradients(results, saved_values)``
    maps them to one entry per parameter instead (for gradients shared by two inputs, or inputs that
    get none).
    ``non_differentiable`` names outputs (``"output[i]"``) that only the backward reads, such as saved
    softmax statistics: they are marked non-differentiable and their gradients are not passed to
    ``backward``. An op whose autograd this declaration cannot express wires it by hand with
    :func:`define_op` and says why at its declaration.

    Example:
        ```python
        _rms_norm_op = define_differentiable_op(
            "rms_norm", _rms_norm_impl, fake=_rms_norm_fake,
            backward=_rms_norm_backward_impl, backward_fake=_rms_norm_backward_fake,
            saved=("x", "weight", "eps"),   # backward(grad, x, weight, eps) -> (grad_x, grad_weight)
        )
        ```
    """
    parameters = list(inspect.signature(impl).parameters)
    hints = typing.get_type_hints(impl)
    is_tensor = [_is_tensor_hint(hints.get(p)) for p in parameters]
    layout: list[tuple[bool, int, bool]] = []  # (from the outputs, index, kept as a tensor)
    for item in saved:
        if item == "output" or item.startswith("output["):
            layout.append((True, int(item[7:-1]) if item != "output" else -1, True))
        elif item in parameters:
            i = parameters.index(item)
            layout.append((False, i, is_tensor[i]))
        else:
            raise ValueError(f"define_differentiable_op({name!r}): saved names {item!r}, which is neither a "
                             f"parameter of {impl.__name__} ({', '.join(parameters)}) nor 'output[i]'.")
    statistics = tuple(_output_index(name, item) for item in non_differentiable)
    tensor_positions = tuple(i for i, t in enumerate(is_tensor) if t)
    n_inputs = len(parameters)
    backward_op = define_op(f"{name}_backward", backward, fake=backward_fake, inline_kernels=inline_kernels)

    def setup_context(ctx, inputs, output):
        tensors, others = [], []
        for from_output, i, as_tensor in layout:
            value = (output if i < 0 else output[i]) if from_output else inputs[i]
            (tensors if as_tensor else others).append(value)
        ctx.save_for_backward(*tensors)
        ctx.others = others
        if statistics:
            ctx.mark_non_differentiable(*(output[i] for i in statistics))
            # autograd would fill a tensor of zeros as each statistic's gradient, which nothing reads (the
            # projections of the MoE experts: 150 MB a layer); a differentiable output the loss does not use
            # gets its zeros in autograd_backward instead
            ctx.set_materialize_grads(False)
            ctx.gradient_like = [(o.shape, o.dtype, o.device) for i, o in enumerate(output) if i not in statistics]

    def autograd_backward(ctx, *output_gradients):
        if statistics:
            output_gradients = [g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
                                for g, (shape, dtype, device) in zip(
                                    (g for i, g in enumerate(output_gradients) if i not in statistics),
                                    ctx.gradient_like)]
        tensors, others = iter(ctx.saved_tensors), iter(ctx.others)
        values = [next(tensors) if as_tensor else next(others) for _, _, as_tensor in layout]
        results = backward_op(*output_gradients, *values)
        results = results if isinstance(results, tuple) else (results,)
        if gradients is not None:
            return tuple(gradients(results, values))
        grads = [None] * n_inputs
        for position, grad in zip(tensor_positions, results):
            grads[position] = grad
        return tuple(grads)

    autograd_backward.__name__ = f"{name}_autograd_backward"
    return define_op(name, impl, fake=fake, backward=autograd_backward, setup_context=setup_context,
                     inline_kernels=inline_kernels, reference=reference)


def _output_index(name: str, item: str) -> int:
    """``i`` of ``"output[i]"``."""
    if item.startswith("output[") and item.endswith("]") and item[7:-1].isdigit():
        return int(item[7:-1])
    raise ValueError(f"define_differentiable_op({name!r}): non_differentiable names {item!r}; name outputs "
                     "as 'output[i]'.")


def _is_tensor_hint(hint) -> bool:
    """``Tensor`` or ``Tensor | None`` (``Optional[Tensor]``)."""
    return hint is torch.Tensor or torch.Tensor in typing.get_args(hint)
