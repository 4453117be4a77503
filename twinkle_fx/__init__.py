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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .core.version import VERSION as __version__  # noqa: F401  (the package's version, public as this name)

# Each public name and the module that defines it. Importing the package imports none of them (torch,
# transformers and triton take seconds), so ``twinkle-fx --help`` and a bad argument answer at once;
# the first public name used imports the library as a plain import of the package used to.
_PUBLIC = {
    "register_kernels": ".core.config",
    **dict.fromkeys(("kernelize_model", "kernelized", "undo_kernelize", "verification_report"), ".eager"),
    **dict.fromkeys(("KernelLoadError", "KernelSelectionError", "KernelVerificationError", "TwinkleError"),
                    ".core.errors"),
    "Mode": ".core.modes",
    **dict.fromkeys(("register_external_layer", "register_function_kernel", "register_layer_kernel"),
                    ".core.registration"),
    **dict.fromkeys(("get_registry", "scoped_registry"), ".core.registry"),
    **dict.fromkeys(("compile", "explain"), ".compiler.entry"),
    **dict.fromkeys(("decode", "release_decode_state", "use_decode_loop"), ".generation"),
    # the kernel author's tools, as a library (the command line and the harness run them)
    "check_kernels": ".checklist",
    **dict.fromkeys(("KernelTiming", "benchmark_kernel"), ".measure.kernel_timing"),
}
# a public name its module defines under another name: ``twinkle_fx.compile`` is ``compile_model``, a name
# that does not shadow the builtin where it is defined
_DEFINED_AS = {"compile": "compile_model"}
# what the package imported up front before it was lazy, imported at the first public name used: the
# library's packages (core, eager, compiler) stay attributes of the package once the library is in use,
# and "compiler" makes the backend name known to torch.compile
_LIBRARY = (".core.config", ".core.errors", ".core.modes", ".core.registration", ".core.registry", ".eager",
            ".compiler")

# ``from twinkle_fx import *`` leaves the builtin compile() alone
__all__ = sorted(set(_PUBLIC) - {"compile"}, key=str.lower)

# The backend name, known to torch.compile as soon as the package is imported. Cheap where the package
# is installed (its entry point names the backend); from a bare checkout it imports torch._dynamo.
from . import compiler as _compiler  # noqa: E402,F401

# The Hub loader and the kernels package's layer mapping, plugged into core (by name: nothing is
# imported until a kernel needs them), so every use of the library has them.
from . import integrations as _integrations  # noqa: E402,F401

if TYPE_CHECKING:
    from .checklist import check_kernels
    from .core.config import register_kernels
    from .core.errors import KernelLoadError, KernelSelectionError, KernelVerificationError, TwinkleError
    from .core.modes import Mode
    from .core.registration import register_external_layer, register_function_kernel, register_layer_kernel
    from .core.registry import get_registry, scoped_registry
    from .compiler.entry import compile_model as compile
    from .compiler.entry import explain
    from .eager import kernelize_model, kernelized, undo_kernelize, verification_report
    from .generation import decode, release_decode_state, use_decode_loop
    from .measure.kernel_timing import KernelTiming, benchmark_kernel


def _load_library() -> None:
    for module in _LIBRARY:
        importlib.import_module(module, __name__)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        _load_library()
        value = getattr(importlib.import_module(_PUBLIC[name], __name__), _DEFINED_AS.get(name, name))
        globals()[name] = value
        return value
    if not name.startswith("__"):
        _load_library()
        if name in globals():
            return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})

