"""Function kernels: register a replacement for ``module.func`` and apply it.

Examples:
    >>> from twinkle_fx.function import register_function_kernel, apply_function_kernel, restore_functions
    >>> from my_pkg.fast_ops import fast_add   # examples/my_pkg: a Triton add
    >>> _ = register_function_kernel(func_name="add", target_module="my_pkg.math_ops",
    ...                              func_impl=fast_add, device="cpu", mode="inference")
    >>> patched = apply_function_kernel(target_module="my_pkg.math_ops", device="cpu",
    ...                                 mode="inference", use_fallback=True, strict=False)
    >>> patched
    ['my_pkg.math_ops.add']
    >>> restore_functions()
    1
"""

from .core.registration import register_function_kernel
from .core.swaps import patched_functions
from .eager.function_patches import PatchedFunctions, apply_function_kernel, restore_functions

__all__ = ["register_function_kernel", "apply_function_kernel", "restore_functions", "patched_functions", "PatchedFunctions"]
