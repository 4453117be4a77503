"""Device names: which registration keys serve the device a model runs on."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["parse_device", "registration_keys", "infer_device", "ANY_DEVICE"]

ANY_DEVICE = "any"
KNOWN_DEVICES = ("cpu", "cuda", "rocm", "xpu", "mps", "metal", "npu")


def parse_device(device: Any, *, allow_any: bool = False) -> str:
    """Validate a device (``"cuda"``, ``"cuda:1"``, ``torch.device``) and return its type.

    Raises:
        ValueError: the device type is not one of cpu, cuda, rocm, xpu, mps, metal, npu.

    Example:
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
