"""Every access twinkle_fx makes to a private torch, Dynamo or Inductor name, one accessor each.

None of these is a public torch API, so each may move between torch releases; keeping them here
means a torch upgrade is checked in one file, and ``tests/core/test_torch_internals.py`` has one
test per accessor that fails when the name it reaches moves. Imports of ``torch._dynamo`` and
``torch._inductor`` happen inside the accessors: importing this module costs nothing, and Dynamo
(a second of import time) loads only where it is used. The Triton kernels, which import nothing
from twinkle_fx, have a door of their own (``kernels/twinkle_triton/_torch_internals.py``).
Reading Dynamo's graph metadata (``node.meta``) is compile-only and lives in
``twinkle_fx.compiler.graph.dynamo``, which reaches private names through this module.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = [
    "inductor_config_values", "inductor_config_patch", "inductor_cudagraphs_requested", "inductor_mode_options",
    "inductor_compile", "inductor_inner_compiler", "cudagraphs_logger", "cudagraph_tree_manager",
    "is_inductor_tensor_box", "generate_ttir", "set_generate_ttir", "is_static_input", "clear_static_input",
    "dynamo_source", "dynamo_graph_break_counts", "checkpoint_operator", "compiling_translator",
    "current_compile_context", "same_compile_invocation", "dynamo_backend_names", "register_dynamo_backend", "dynamo_config_patch",
    "shorten_traceback_base", "aot_eager", "boxed_nop", "optimize_ddp", "set_optimize_ddp", "active_ddp_module",
    "ddp_ignore", "ddp_ignored_names", "set_ddp_ignored_names", "compiled_call", "set_compiled_call",
    "fake_tensor_type", "fake_tensor_mode", "fake_tensor_logger", "quiet_fake_tensor_errors", "nn_sdpa", "nn_linear",
    "autograd_inside_custom_op", "global_module_hooks_set", "reparametrize_module", "queue_backward_callback",
    "dropout_classes", "module_hook_dicts", "has_forward_hooks", "tree_leaves", "tree_flatten", "tree_map_only",
    "foreach_zero", "set_gemm_sm_carveout", "POST_GRAD_PRE_PASS", "inductor_post_grad_pass", "inductor_pass_uuid",
    "inductor_post_grad_pre_pass", "known_equal", "op_namespace", "is_higher_order_op", "donated_backward_inputs",
    "capture_cuda_graph", "fsdp_unit", "fsdp_comm_bases", "symmetric_memory",
]


# --- Inductor ---------------------------------------------------------------------------------------


def inductor_config_values() -> dict[str, Any]:
    """A copy of ``torch._inductor.config``: every key (dotted for nested ones) and its current value."""
    from torch._inductor import config

    return config.get_config_copy()


def inductor_config_patch(patches: dict[str, Any]) -> contextlib.AbstractContextManager:
    """``torch._inductor.config.patch(patches)``: the config with ``patches`` applied inside the block."""
    from torch._inductor import config

    return config.patch(patches)


# Inductor's config key for passes on each graph after AOTAutograd (forward, backward, inference), before its own
POST_GRAD_PRE_PASS = "post_grad_custom_pre_pass"


def inductor_post_grad_pass(run: Callable[[torch.fx.Graph], None], uuid: Callable[[], Any]) -> Any:
    """An Inductor ``CustomGraphPass`` (the value of :data:`POST_GRAD_PRE_PASS`): ``run(graph)`` rewrites a
    graph in place; ``uuid()`` is the pass's part of Inductor's and AOTAutograd's cache keys, so a graph
    compiled with the pass is never served to a compile without it (None: such graphs are not cached)."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class _Pass(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            run(graph)

        def uuid(self) -> Any:
            return uuid()

    return _Pass()


def inductor_pass_uuid(custom_pass: Any) -> Any:
    """The cache-key part of a value of :data:`POST_GRAD_PRE_PASS` (a pass, a list of them, or None);
    None where a pass is a plain callable, which Inductor does not cache."""
    if isinstance(custom_pass, (list, tuple)):
        uuids = tuple(inductor_pass_uuid(p) for p in custom_pass)
        return None if None in uuids else uuids
    uuid = getattr(custom_pass, "uuid", None)
    return uuid() if callable(uuid) else None


def inductor_post_grad_pre_pass() -> Any:
    """The :data:`POST_GRAD_PRE_PASS` Inductor's config holds now (the user's own, or None)."""
    from torch._inductor import config

    return getattr(config, POST_GRAD_PRE_PASS)


def inductor_cudagraphs_requested() -> bool:
    """Whether Inductor's config (as patched now) asks for CUDA graphs (``triton.cudagraphs``)."""
    from torch._inductor import config

    return bool(config.triton.cudagraphs)


def inductor_mode_options(mode: str | None = None) -> dict[str, Any]:
    """Inductor's config for torch.compile's ``mode`` ("max-autotune", ...), as ``backend="inductor"``
    expands it; with no mode, every mode name as a key."""
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode)) if mode is not None else dict(list_mode_options())


def inductor_compile(gm: torch.fx.GraphModule, example_inputs: list[Any], *, inner_compile: Callable[..., Any],
                     config_patches: dict[str, Any] | None) -> Callable[..., Any]:
    """Inductor's ``compile_fx`` (AOTAutograd, then ``inner_compile`` for each graph it produces)."""
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=config_patches)


def inductor_inner_compiler() -> Callable[..., Any]:
    """Inductor's ``compile_fx_inner``, which ``inner_compile`` wrappers call on each graph."""
    from torch._inductor.compile_fx import compile_fx_inner

    return compile_fx_inner


def cudagraphs_logger() -> logging.Logger:
    """The logger Inductor writes its "skipping cudagraphs due to ..." messages to."""
    from torch._inductor.cudagraph_utils import cudagraphs_log

    return cudagraphs_log


def cudagraph_tree_manager(device_index: int) -> Any:
    """Inductor's CUDA-graph tree manager of one GPU, or None when nothing ran with CUDA graphs there."""
    from torch._inductor import cudagraph_trees

    return cudagraph_trees.get_manager(device_index, create_if_none_exists=False)


def is_inductor_tensor_box(value: Any) -> bool:
    """Whether ``value`` is an Inductor ``TensorBox``; False before Inductor loaded its IR (none exists then)."""
    ir = sys.modules.get("torch._inductor.ir")
    return ir is not None and isinstance(value, ir.TensorBox)


def _triton_kernel_wrap() -> types.ModuleType | None:
    try:
        from torch._higher_order_ops import triton_kernel_wrap as module
    except ImportError:  # no Triton: no user-defined kernels to analyse
        return None
    return module if callable(getattr(module, "generate_ttir", None)) else None


def generate_ttir() -> Callable[..., Any] | None:
    """What torch's analysis of each user Triton kernel launch runs Triton's front end with
    (``triton_kernel_wrap.generate_ttir``, as patched now), or None without Triton or with a torch
    that has no ``generate_ttir``."""
    module = _triton_kernel_wrap()
    return None if module is None else module.generate_ttir


def set_generate_ttir(function: Callable[..., Any]) -> None:
    """Make ``function`` what torch's launch analysis runs Triton's front end with (process-wide; to
    undo, set what :func:`generate_ttir` returned before). Without Triton or ``generate_ttir`` there
    is nothing to replace: a ``RuntimeError`` says so."""
    module = _triton_kernel_wrap()
    if module is None:
        raise RuntimeError("set_generate_ttir: this torch has no triton_kernel_wrap.generate_ttir to replace (no "
                           "Triton, or another torch release); check generate_ttir() is not None first")
    module.generate_ttir = function


# --- Dynamo -----------------------------------------------------------------------------------------

_STATIC_INPUT = "_dynamo_static_input_type"  # Dynamo's mark of an input read at a fixed address


def is_static_input(placeholder: torch.fx.Node) -> bool:
    """Whether Dynamo marked the graph input ``placeholder`` static (an ``nn.Parameter``, a buffer)."""
    return _STATIC_INPUT in (placeholder.meta.get("tensor_dict") or {})


def clear_static_input(placeholder: torch.fx.Node) -> None:
    """Drop Dynamo's static mark from ``placeholder`` (only the graph's copy of the tensor's attributes)."""
    attributes = placeholder.meta.get("tensor_dict") or {}
    placeholder.meta["tensor_dict"] = {k: v for k, v in attributes.items() if k != _STATIC_INPUT}


def dynamo_source(placeholder: torch.fx.Node) -> Any:
    """Dynamo's ``Source`` of a graph input (where the value comes from), or None."""
    return getattr(placeholder, "_dynamo_source", None)


def dynamo_graph_break_counts() -> dict[str, int]:
    """Dynamo's graph-break counters as they are now: message -> how many times it was counted."""
    from torch._dynamo.utils import counters

    return dict(counters.get("graph_break", {}))


def checkpoint_operator() -> Any:
    """The higher-order op Dynamo calls an activation-checkpoint body with, or None on a torch without it."""
    try:
        from torch._higher_order_ops.wrap import tag_activation_checkpoint
    except ImportError:  # a torch without the op records no checkpoint this way
        return None
    return tag_activation_checkpoint


def compiling_translator() -> Any:
    """Dynamo's translator of the frame being compiled (``f_locals``, ``f_globals``), while a backend
    runs inside it; None otherwise (a backend called directly)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        return InstructionTranslator.current_tx()
    except (ImportError, AttributeError, IndexError, AssertionError):  # no frame is being compiled
        return None


def current_compile_context() -> Any:
    """The compilation in progress (one object for every graph of one frame's compile), or None."""
    return torch._guards.CompileContext.try_get()


@contextlib.contextmanager
def same_compile_invocation() -> Iterator[None]:
    """Run a nested ``torch.compile`` call without it counting as a new call of the user's compiled code.

    Entering any compiled function advances Dynamo's generation counter, and CUDA-graph trees take a new
    generation for the start of a new step: the outputs of graphs replayed earlier in the step (a whole
    model split at graph breaks hands the rotary's cos and sin from one graph to the next) are then
    treated as free to overwrite. A backend that traces a helper with Dynamo while compiling a later graph
    of a step must leave the counter where the user's call put it.
    """
    from torch._dynamo.mutation_guard import GenerationTracker

    generation = GenerationTracker.generation
    try:
        yield
    finally:
        GenerationTracker.generation = generation


def dynamo_backend_names() -> list[str]:
    """The names ``torch.compile(backend=...)`` knows, whatever their tags."""
    from torch._dynamo import list_backends

    return list_backends(exclude_tags=())


def register_dynamo_backend(name: str, compiler_fn: Callable[..., Any]) -> None:
    """Make ``torch.compile(backend=name)`` call ``compiler_fn``."""
    from torch._dynamo import register_backend

    register_backend(compiler_fn, name=name)


def dynamo_config_patch(patches: dict[str, Any]) -> contextlib.AbstractContextManager:
    """``torch._dynamo.config.patch(patches)``: Dynamo's config with ``patches`` applied inside the block
    (``optimize_ddp``, ``compiled_autograd``: Dynamo reads them when it compiles a frame)."""
    import torch._dynamo.config as dynamo_config

    return dynamo_config.patch(patches)


def shorten_traceback_base() -> type:
    """Dynamo's ``ShortenTraceback``: an error raised by a backend that subclasses it reaches the caller
    as it is, not wrapped in ``BackendCompilerFailed``."""
    from torch._dynamo.exc import ShortenTraceback

    return ShortenTraceback


def aot_eager(gm: torch.fx.GraphModule, example_inputs: list[Any], **compilers: Any) -> Callable[..., Any]:
    """Dynamo's ``aot_eager`` backend (AOTAutograd, no code generation); ``compilers``: its
    ``fw_compiler`` / ``bw_compiler``."""
    from torch._dynamo.backends.debugging import aot_eager as backend

    return backend(gm, example_inputs, **compilers)


def boxed_nop(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Dynamo's do-nothing AOT compiler: runs ``gm`` as it is, taking its inputs as one list."""
    from torch._dynamo.backends.debugging import boxed_nop as nop

    return nop(gm, example_inputs)


def set_gemm_sm_carveout(sms: int | None) -> None:
    """cuBLAS GEMMs launched from now on target ``sms`` fewer SMs than the GPU has (``None``: all of them);
    process-wide, read when each GEMM is launched (a CUDA graph keeps what its capture saw)."""
    torch._C._set_sm_carveout_experimental(sms)


def optimize_ddp() -> Any:
    """``torch._dynamo.config.optimize_ddp``: whether (and how) Dynamo splits graphs at DDP's buckets."""
    import torch._dynamo.config as dynamo_config

    return dynamo_config.optimize_ddp


def set_optimize_ddp(value: Any) -> None:
    """Set ``torch._dynamo.config.optimize_ddp`` (process-wide; Dynamo reads it when it compiles a frame)."""
    import torch._dynamo.config as dynamo_config

    dynamo_config.optimize_ddp = value


def active_ddp_module() -> torch.nn.Module | None:
    """The ``DistributedDataParallel`` module whose forward is running, or None."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel._active_ddp_module


def ddp_ignore(module: torch.nn.Module, names: list[str]) -> None:
    """Have every ``DistributedDataParallel`` built on ``module`` from now on leave the parameters and
    buffers ``names`` (qualified names) out of its buckets
    (``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model``: it also marks them)."""
    from torch.nn.parallel import DistributedDataParallel

    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, names)


def ddp_ignored_names(module: torch.nn.Module) -> list[str] | None:
    """The names a ``DistributedDataParallel`` built on ``module`` leaves out of its buckets, or None
    when none were given (``module._ddp_params_and_buffers_to_ignore``)."""
    return getattr(module, "_ddp_params_and_buffers_to_ignore", None)


def set_ddp_ignored_names(module: torch.nn.Module, names: list[str] | None) -> None:
    """Put back what :func:`ddp_ignored_names` returned (None: no names), for the wrappers built next."""
    if names is None:
        module.__dict__.pop("_ddp_params_and_buffers_to_ignore", None)
    else:
        module._ddp_params_and_buffers_to_ignore = names


# --- nn.Module, fake tensors, the dispatcher ---------------------------------------------------------


def compiled_call(module: torch.nn.Module) -> Callable[..., Any] | None:
    """What ``module(...)`` runs after ``module.compile()`` (None before)."""
    return module._compiled_call_impl


def set_compiled_call(module: torch.nn.Module, call: Callable[..., Any]) -> None:
    """Make ``module(...)`` run ``call`` in place of what ``module.compile()`` installed."""
    module._compiled_call_impl = call


def op_namespace(target: Any) -> str | None:
    """The namespace of an ATen-level graph node's target that is an operator overload (``"aten"``, ``"prims"``, a
    custom op's library), or None for anything else (a Python function, a higher-order op)."""
    return target.namespace if isinstance(target, torch._ops.OpOverload) else None


def is_higher_order_op(target: Any) -> bool:
    """Whether a graph node's target is a higher-order operator (``triton_kernel_wrapper_functional``, the launches
    of a ``triton_op`` as AOTAutograd traces it; ``auto_functionalized``; ...)."""
    return isinstance(target, torch._ops.HigherOrderOperator)


def known_equal(a: Any, b: Any) -> bool:
    """Whether two sizes (ints or SymInts of a traced graph) are equal for every value the graph may take,
    without adding a guard (``torch.fx.experimental.symbolic_shapes.statically_known_true``)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(a == b))


def donated_backward_inputs() -> frozenset[int] | None:
    """The positions, among its placeholders, of the backward graph's inputs AOTAutograd donates to it (saved
    tensors only the backward reads, once: a backward with ``retain_graph=True`` compiles with none), while
    AOTAutograd compiles a backward; None outside one (``torch._inductor.utils.get_donated_idxs``)."""
    from torch._inductor.utils import get_donated_idxs

    donated = get_donated_idxs()
    return None if donated is None else frozenset(donated)


def fake_tensor_type() -> type:
    """torch's ``FakeTensor`` class (the example values Dynamo and the backend's checks hold)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor


def fake_tensor_mode() -> Any:
    """A new fake-tensor mode that also takes real tensors as inputs (it fakes them)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def fake_tensor_logger() -> logging.Logger:
    """The logger fake tensors report their failures to (at ERROR, before raising)."""
    return logging.getLogger("torch._subclasses.fake_tensor")


class _HandledFakeTensorErrors(logging.Filter):
    """Fake tensors log an op that fails on them at ERROR, with its traceback, before raising. Inside
    :func:`quiet_fake_tensor_errors` the caller catches that error and reports it its own way, so the record
    goes to DEBUG instead; only in the thread that entered the block (a filter runs in the logging thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not getattr(self.depth, "value", 0):
            return True
        logging.getLogger(__name__).debug("a fake tensor error the caller handles: %s", record.getMessage(),
                                          exc_info=record.exc_info)
        return False


_HANDLED = _HandledFakeTensorErrors()
_HANDLED_LOCK = threading.Lock()


@contextlib.contextmanager
def quiet_fake_tensor_errors() -> Iterator[None]:
    """Inside the block, this thread's fake tensor errors are logged at DEBUG, not at ERROR: for code that
    runs something on fake tensors expecting it may fail, and handles the failure (keeps a region and says why
    in the report, tries the next shape plan). Other threads' records are untouched; the logger's level too."""
    logger = fake_tensor_logger()
    with _HANDLED_LOCK:
        if _HANDLED not in logger.filters:
            logger.addFilter(_HANDLED)
    depth = _HANDLED.depth
    depth.value = getattr(depth, "value", 0) + 1
    try:
        yield
    finally:
        depth.value -= 1


def nn_sdpa() -> Callable[..., Any]:
    """The C function Dynamo records for ``F.scaled_dot_product_attention``."""
    return torch._C._nn.scaled_dot_product_attention


def nn_linear() -> Callable[..., Any]:
    """The C function Dynamo records for ``F.linear``."""
    return torch._C._nn.linear


@contextlib.contextmanager
def autograd_inside_custom_op() -> Iterator[None]:
    """Re-enable autograd for the block inside a custom op's implementation.

    The dispatcher runs an op's implementation with the autograd keys excluded (below autograd),
    so ``torch.enable_grad()`` alone records nothing there.
    """
    keys = [torch._C.DispatchKey.AutogradFunctionality, torch._C.DispatchKey.AutogradOther,
            torch._C.DispatchKey.AutogradNestedTensor]
    saved = [(k, torch._C._dispatch_tls_is_dispatch_key_excluded(k)) for k in keys]
    for key in keys:
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
    try:
        with torch.enable_grad():
            yield
    finally:
        for key, excluded in saved:
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, excluded)


def global_module_hooks_set() -> bool:
    """Whether any hook was registered for every module (``torch.nn.modules.module.register_module_*_hook``)."""
    from torch.nn.modules import module as nn_module

    return bool(nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks
                or nn_module._global_backward_hooks or nn_module._global_backward_pre_hooks)


def reparametrize_module(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> contextlib.AbstractContextManager:
    """``module`` with the parameters and buffers named in ``tensors`` replaced inside the block
    (torch's ``_reparametrize_module``, what ``torch.func.functional_call`` runs on)."""
    from torch.nn.utils.stateless import _reparametrize_module

    return _reparametrize_module(module, tensors)


def queue_backward_callback(callback: Callable[[], None]) -> None:
    """Run ``callback`` when the backward pass now running ends (autograd's engine callback queue)."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def dropout_classes() -> tuple[type, ...]:
    """The base class of torch's dropout modules (``Dropout``, ``Dropout1d``, ... all have ``p``)."""
    return (torch.nn.modules.dropout._DropoutNd,)


def module_hook_dicts(module: torch.nn.Module, *, backward: bool = True) -> tuple[dict, ...]:
    """The hooks registered on ``module`` itself (``register_forward_hook`` and the rest), as the dicts
    ``nn.Module`` keeps them in: forward and forward-pre, then (with ``backward``) backward and
    backward-pre. Live views: reading one later sees hooks added or removed since."""
    dicts = (module._forward_hooks, module._forward_pre_hooks)
    return (*dicts, module._backward_hooks, module._backward_pre_hooks) if backward else dicts


def has_forward_hooks(module: torch.nn.Module) -> bool:
    """Whether a forward hook is registered on ``module`` itself; one attribute read (replays call it per layer)."""
    return bool(module._forward_hooks)


# --- pytree: torch's flattening of nested containers (lists, tuples, dicts, transformers' ModelOutput) ---


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of ``tree`` in torch's flattening order (``torch.utils._pytree.tree_leaves``)."""
    from torch.utils import _pytree

    return _pytree.tree_leaves(tree)


def tree_flatten(tree: Any) -> tuple[list[Any], Any]:
    """``(leaves, spec)`` of ``tree``; two trees of one structure have equal specs."""
    from torch.utils import _pytree

    return _pytree.tree_flatten(tree)


def tree_map_only(kind: type, fn: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` with ``fn`` applied to each leaf of type ``kind``, every other leaf kept."""
    from torch.utils import _pytree

    return _pytree.tree_map_only(kind, fn, tree)


# --- tensors ----------------------------------------------------------------------------------------


def foreach_zero(tensors: list[torch.Tensor]) -> None:
    """Zero ``tensors`` in place with one multi-tensor kernel per device and dtype
    (``torch._foreach_zero_``), where ``zero_()`` on each would launch one kernel per tensor."""
    torch._foreach_zero_(tensors)


# --- FSDP2 and symmetric memory ------------------------------------------------------------------------


def fsdp_unit(module: torch.nn.Module) -> tuple[torch.device, Any] | None:
    """``(device, shard process group)`` of ``module`` when it is an FSDP2 unit (``fully_shard`` made it one and it
    holds parameters of its own), else None. Under HSDP the shard group is the mesh's shard dimension."""
    get_state = getattr(module, "_get_fsdp_state", None)
    group = get_state()._fsdp_param_group if get_state is not None else None
    if group is None:
        return None
    return group.device, group._all_gather_process_group


def fsdp_comm_bases() -> tuple[type, type]:
    """FSDP2's interfaces for a custom all-gather and reduce-scatter (``FSDPModule.set_custom_all_gather``)."""
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

    return AllGather, ReduceScatter


def symmetric_memory() -> types.ModuleType:
    """``torch.distributed._symmetric_memory``: buffers every rank of a group maps (``get_mem_pool``,
    ``rendezvous``)."""
    import torch.distributed._symmetric_memory as symm_mem

    return symm_mem


# --- CUDA graphs ------------------------------------------------------------------------------------


@contextlib.contextmanager
def capture_cuda_graph(graph: torch.cuda.CUDAGraph, pool: Any = None,
                       stream: torch.cuda.Stream | None = None) -> Iterator[None]:
    """``torch.cuda.graph(graph, pool=pool, stream=stream)`` in which only this thread's calls can spoil the capture,
    and which leaves the process as it was when the capture fails.

    ``capture_error_mode="thread_local"`` (as Inductor's CUDA graph trees capture): under torch's default
    ("global") a call another thread makes meanwhile that CUDA does not allow during a capture (pinning host
    memory for a data loader, loading a compiled kernel) invalidates it.

    torch's ``graph.__exit__`` ends the capture first; when that raises (a capture the block invalidated, say by a
    host sync) it neither restores the ambient stream nor runs the epilogue of the CUDA generator's capture, and
    the default generator stays in capture mode: every later eager random op (dropout, ``torch.rand``) then fails
    or draws from the graph's offsets. On a failure the ambient stream is restored and the generator gets back a
    copy of its state from before the capture (the failed graph is never replayed, so the offsets it reserved are
    not needed).

    Python's cyclic garbage collector does not run during the capture (torch's ``graph.__enter__`` collects just
    before it begins). A collection there can free an earlier graph left in a reference cycle (a dropped decode
    step's, a replaced cache's), and a graph's destructor (``CUDAGraph::reset``) is a call CUDA refuses in the
    capturing thread: the capture is spoiled ("operation not permitted when stream is capturing").
    """
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    # graph-safe generator states (torch >= 2.5): a copy taken outside any capture
    saved = generator.clone_state() if hasattr(generator, "clone_state") else None
    capture = torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local")
    collecting = gc.isenabled()
    try:
        with capture:
            gc.disable()
            yield
    except BaseException:
        if torch.cuda.current_stream() == capture.capture_stream:  # capture_end raised before the stream's exit
            capture.stream_ctx.__exit__(None, None, None)
        if saved is not None:
            generator.graphsafe_set_state(saved)
        raise
    finally:
        if collecting:
            gc.enable()
