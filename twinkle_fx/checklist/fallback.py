"""The fallback item: the swap keeps the original. After undo, the layer's forward / the module's
function is the original object again and gives bit-identical outputs."""

from __future__ import annotations

import importlib

import torch

from ..core.registry import get_registry
from .inputs import sizes
from .report import FAIL, PASS
from .runner import Runner, tensors

__all__ = ["check_fallback"]


def check_fallback(runner: Runner) -> tuple[str, str]:
    """Swap through twinkle_fx, undo, and check the original is back exactly: (verdict, note)."""
    from ..eager import kernelize_model, undo_kernelize
    from ..eager.function_patches import apply_function_kernel

    rows, width = sizes(runner.tiny)[0]
    inputs = runner.inputs(rows, width, runner.dtypes[0])
    original, _ = runner.calls(inputs)
    with torch.no_grad():
        before = tensors(original())
    if runner.t.kind == "layer":
        module = inputs.module
        scope = get_registry().binding_scope(type(module))
        root = module if scope is None else _under_parent(module, scope[0])
        kernelize_model(root, mode=runner.t.mode, device=runner.device.type, use_fallback=True)
        swapped = "forward" in vars(module)
        undo_kernelize(module)
        restored = "forward" not in vars(module)
        with torch.no_grad():
            after = tensors(module(*inputs.args, **inputs.kwargs))
    else:
        module_name, func = runner.t.name.rsplit(".", 1)
        target_module = importlib.import_module(module_name)
        patched = apply_function_kernel(target_module=module_name, device=runner.device.type, mode=runner.t.mode,
                                        use_fallback=True)
        swapped = getattr(target_module, func) is not runner.t.original
        patched.restore()
        restored = getattr(target_module, func) is runner.t.original
        with torch.no_grad():
            after = tensors(getattr(target_module, func)(*inputs.args, **inputs.kwargs))
    identical = before.keys() == after.keys() and all(
        torch.allclose(before[k], after[k], rtol=0, atol=0, equal_nan=True) for k in before)
    if not swapped:
        return FAIL, "kernelize did not swap the kernel in, so its fallback could not be exercised"
    if restored and identical:
        return PASS, "undo restores the original, bit-identical outputs; elsewhere the original runs (use_fallback)"
    return FAIL, f"after undo: original restored {restored}, bit-identical outputs {identical}"


def _under_parent(module: torch.nn.Module, parent_cls: type) -> torch.nn.Module:
    """``module`` as the child of a bare ``parent_cls`` (its own ``__init__`` not run: it needs a
    config), so that a binding limited to that parent (``register_external_layer(within=...)``) serves it."""
    parent = parent_cls.__new__(parent_cls)
    torch.nn.Module.__init__(parent)
    parent.child = module
    return parent
