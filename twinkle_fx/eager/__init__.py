"""The eager path: per-instance forward replacement, function patching, and their undo."""

from .function_patches import PatchedFunctions, apply_function_kernel, restore_functions
from .kernelize import Restored, kernelize_model, kernelized, undo_kernelize, verification_report
from .layers import restore_layers

__all__ = [
    "PatchedFunctions",
    "Restored",
    "apply_function_kernel",
    "kernelize_model",
    "kernelized",
    "restore_functions",
    "restore_layers",
    "undo_kernelize",
    "verification_report",
]
