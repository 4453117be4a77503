"""twinkle_fx: put fast kernels into PyTorch models, eagerly or under ``torch.compile``.

One registry serves both paths:

>>> from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP
>>> from twinkle_fx import kernelize_model, register_layer_kernel, register_external_layer
>>> registration = register_layer_kernel(kernel_name="MyAwesomeMLP", repo_path="/path/to/local/repo",
...                                      package_name="my_kernels", layer_name="Qwen2MLPTrainingKernel",
...                                      device="cuda", mode="train")   # lazy: nothing is loaded yet
>>> register_external_layer(Qwen2MLP, "MyAwesomeMLP")

then, with a model and the repo on a GPU machine (not run here)::

    model = kernelize_model(model, mode="train", device="cuda")   # eager swap
    compiled = torch.compile(model, backend="twinkle")             # graph rewrite
"""

from .config import register_kernels
from .eager import kernelize_model, kernelized, undo_kernelize, verification_report
from .errors import KernelLoadError, KernelSelectionError, KernelVerificationError, TwinkleError
from .modes import Mode
from .registration import register_external_layer, register_function_kernel, register_layer_kernel
from .registry import get_registry, scoped_registry
from . import compile as _compile  # noqa: E402,F401  the "twinkle" backend name and the pattern-tracing hook
from .explain import explain

__version__ = "0.1.0"

# the tools (the kernel checklist, the timer) import on first use: the library does not depend on them
_TOOLS = {"check_kernels": ".cli.checklist", "benchmark_kernel": ".benchmark", "KernelTiming": ".benchmark"}


def __getattr__(name: str):
    if name in _TOOLS:
        import importlib

        value = getattr(importlib.import_module(_TOOLS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "KernelLoadError",
    "KernelSelectionError",
    "KernelTiming",
    "KernelVerificationError",
    "Mode",
    "TwinkleError",
    "benchmark_kernel",
    "check_kernels",
    "explain",
    "get_registry",
    "kernelize_model",
    "kernelized",
    "register_external_layer",
    "register_function_kernel",
    "register_kernels",
    "register_layer_kernel",
    "scoped_registry",
    "undo_kernelize",
    "verification_report",
]
