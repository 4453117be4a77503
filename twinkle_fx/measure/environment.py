"""Where a measurement ran: device, library versions, date, commit (kept with every benchmark result
and checklist report, because a ratio means nothing without them)."""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from ..core.version import VERSION

__all__ = ["describe_environment", "describe_source"]

_PACKAGES = ("torch", "triton", "transformers", "liger-kernel", "kernels", "twinkle_fx")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


_ROOT = Path(__file__).resolve().parents[2]
COMMIT_ENV = "TWINKLE_FX_COMMIT"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(_ROOT), *args], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _source_digest() -> str:
    """sha256 (first 12 hex) of the twinkle_fx and twinkle_triton sources that ran: identifies the code
    where there is no git checkout (a wheel, or a tree copied to a GPU machine without .git)."""
    import twinkle_triton

    digest = hashlib.sha256()
    for package in (Path(__file__).resolve().parents[1], Path(twinkle_triton.__file__).resolve().parent):
        for path in sorted(package.rglob("*.py")):
            digest.update(path.relative_to(package.parent).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def describe_source() -> dict[str, Any]:
    """Which code ran: ``$TWINKLE_FX_COMMIT`` when set (the caller that copied the tree knows its
    commit: the lent GPU machine's copy carries a .git whose HEAD is the session's first commit, not
    the tree sent), else the git commit and whether the tree had uncommitted changes; plus a digest
    of the sources."""
    commit = os.environ.get(COMMIT_ENV) or None
    dirty = None
    if commit is None:
        commit = _git("rev-parse", "--short", "HEAD") or None
        status = _git("status", "--porcelain", "--untracked-files=no") if commit is not None else None
        dirty = bool(status) if status is not None else None
    return {"commit": commit, "commit_dirty": dirty, "source_sha256": _source_digest()}


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
                                                                   "cuda": torch.version.cuda,
                                                                   "twinkle_fx": VERSION},
        **describe_source(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
    }
