"""Where a benchmark ran: device, library versions, date, commit (kept with every result, because a
ratio means nothing without them)."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

__all__ = ["describe_environment", "resolve_device"]

_PACKAGES = ("torch", "triton", "transformers", "liger-kernel", "kernels", "twinkle_fx")


def resolve_device(device: str | None, *, tiny: bool) -> torch.device:
    """``--device`` or the default: the CPU for ``--tiny``, else CUDA when present, else the CPU."""
    if device is not None:
        return torch.device(device)
    if tiny or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def describe_environment(device: torch.device) -> dict[str, Any]:
    """Device name, versions and date of this run."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        device_name = f"{props.name} ({props.total_memory / (1 << 30):.0f} GiB)"
    else:
        device_name = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    return {
        "device": device_name,
        "device_type": device.type,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "versions": {name: _version(name) for name in _PACKAGES} | {"python": platform.python_version(),
                                                                   "cuda": torch.version.cuda},
        "commit": _git_commit(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
    }
