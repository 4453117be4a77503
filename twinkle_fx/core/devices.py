"""Device names: which registration keys serve the device a model runs on."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import torch

from .caches import owns_cache

logger = logging.getLogger(__name__)

__all__ = ["parse_device", "parse_devices", "registration_keys", "infer_device", "check_device_available",
           "check_model_device", "triton_interpreter_problem", "ANY_DEVICE"]

ANY_DEVICE = "any"
KNOWN_DEVICES = ("cpu", "cuda", "rocm", "xpu", "mps", "metal", "npu")


def parse_device(device: Any, *, allow_any: bool = False) -> str:
    """Validate a device (``"cuda"``, ``"cuda:1"``, ``torch.device``) and return its type.

    Raises:
        ValueError: the device type is not one of cpu, cuda, rocm, xpu, mps, metal, npu.

    Examples:
        >>> parse_device("cuda:1")
        'cuda'
    """
    if device is None and allow_any:
        return ANY_DEVICE
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str):
        kind = device.split(":", 1)[0].strip().lower()
        if allow_any and kind == ANY_DEVICE:
            return ANY_DEVICE
        if kind in KNOWN_DEVICES:
            return kind
    raise ValueError(f"Unknown device {device!r}; valid device types: {', '.join(KNOWN_DEVICES)}.")


def registration_keys(device_type: str) -> tuple[str, ...]:
    """Registration device keys that serve ``device_type``, best first."""
    if device_type == "cuda" and torch.version.hip:
        return ("rocm", "cuda", ANY_DEVICE)
    if device_type == "mps":
        return ("metal", "mps", ANY_DEVICE)
    return (device_type, ANY_DEVICE)


def infer_device(model: torch.nn.Module) -> str:
    """The device type of the model's first parameter or buffer.

    Raises:
        ValueError: the model has neither (pass ``device=`` explicitly).
    """
    for tensor in model.parameters():
        return tensor.device.type
    for tensor in model.buffers():
        return tensor.device.type
    raise ValueError(
        f"Cannot determine the device of {type(model).__name__}: it has no parameters or buffers; "
        "pass device= to kernelize_model."
    )


def parse_devices(devices: str | torch.device | Sequence[str | torch.device]) -> tuple[str, ...]:
    """One device or several, validated: ``"cpu"`` is the single device "cpu", not "c", "p", "u".

    Examples:
        >>> parse_devices("cpu"), parse_devices(("cuda", "cpu"))
        (('cpu',), ('cuda', 'cpu'))
    """
    items = (devices,) if isinstance(devices, (str, torch.device)) else devices
    if not isinstance(items, Sequence) or not items:
        raise ValueError(f"devices must be a device name or a non-empty list of them, got {devices!r}.")
    for item in items:
        parse_device(item)
    return tuple(str(item) for item in items)


def check_device_available(device_type: str) -> None:
    """Refuse a CUDA / ROCm device on a machine where torch sees none (kernels there could never run).

    Raises:
        ValueError: naming the device and what to pass instead.
    """
    if device_type in ("cuda", "rocm") and not torch.cuda.is_available():
        raise ValueError(f"device={device_type!r} but torch sees no GPU here (torch.cuda.is_available() is False); "
                         "pass device='cpu' (Triton kernels then need TRITON_INTERPRET=1) or run on a GPU machine.")


def check_model_device(model: torch.nn.Module, device_type: str) -> None:
    """Refuse kernelizing a model for another device than the one its weights are on.

    A model on the meta device (weights not loaded yet) may be kernelized for any device, and one on
    the CPU for an accelerator, with a WARNING: kernelizing first and moving the model afterwards is
    how the Hugging Face ``kernels`` documents (and ours) write it; calling it before the move would
    hand CPU tensors to GPU kernels.

    Raises:
        ValueError: weights on an accelerator and another device asked for, naming both and the two ways out.
    """
    for tensor in model.parameters():
        break
    else:
        tensor = next(iter(model.buffers()), None)
    if tensor is None or tensor.device.type == "meta":
        return
    actual = tensor.device.type
    wanted = "cuda" if device_type == "rocm" else ("mps" if device_type == "metal" else device_type)
    if actual == wanted:
        return
    if actual == "cpu":
        logger.warning("kernelized %s for device=%r while its weights are on the CPU: move it (model.to(%r)) "
                       "before calling it", type(model).__name__, device_type, wanted)
        return
    raise ValueError(f"device={device_type!r} but {type(model).__name__}'s weights are on {actual!r}: move the "
                     f"model first (model.to({wanted!r})) or pass device={actual!r}.")


# package -> (len(sys.modules) when scanned, found): rescanned only after more modules were imported
_TRITON_PACKAGES: dict[str, tuple[int, bool]] = {}
owns_cache(__name__, _TRITON_PACKAGES.clear)


def _compiled_triton_kernels(root: str) -> bool:
    """Whether modules of package ``root`` hold Triton kernels jitted for a GPU (not interpreted)."""
    cached = _TRITON_PACKAGES.get(root)
    if cached is None or cached[0] != len(sys.modules):
        from triton.runtime.jit import JITFunction, KernelInterface

        found = False
        for name, module in list(sys.modules.items()):
            if module is None or (name != root and not name.startswith(root + ".")):
                continue
            for value in list(vars(module).values()):
                # under TRITON_INTERPRET=1 triton.jit gives an InterpretedFunction, no JITFunction; an
                # Autotuner / Heuristics (a KernelInterface) wraps the JITFunction in .fn
                if isinstance(value, KernelInterface) and not isinstance(value, JITFunction):
                    value = getattr(value, "fn", None)
                if isinstance(value, JITFunction):
                    found = True
                    break
            if found:
                break
        _TRITON_PACKAGES[root] = cached = (len(sys.modules), found)
    return cached[1]


def triton_interpreter_problem(kernel: Any, device_type: str) -> str | None:
    """Why ``kernel`` cannot run on ``device_type``: its package jitted Triton kernels for a GPU and
    the device is the CPU (only the Triton interpreter runs them there). None when it can.

    Cheap enough for swap time (one scan per package, cached); never on the call path.
    """
    if device_type != "cpu" or "triton" not in sys.modules:
        return None
    module_name = getattr(kernel, "__module__", None) or type(kernel).__module__
    if not isinstance(module_name, str):
        return None
    # the kernel's package: its Triton kernels usually sit in sibling modules (twinkle_triton.layers
    # calls twinkle_triton.rms_norm); torch and triton themselves hold Triton kernels of Inductor's
    package = module_name.rpartition(".")[0] or module_name
    if package.split(".", 1)[0] in ("torch", "triton") or not _compiled_triton_kernels(package):
        return None
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    when = ("was imported before TRITON_INTERPRET=1 was set" if interpret else "was imported without TRITON_INTERPRET=1")
    return (f"runs Triton kernels jitted for a GPU ({package} {when}); on the CPU set TRITON_INTERPRET=1 before "
            f"importing {package} (slow: for tests), or kernelize on a GPU")
