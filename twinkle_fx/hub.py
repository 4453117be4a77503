"""The only place that talks to the Hugging Face ``kernels`` package (imported lazily).

twinkle_fx works without ``kernels`` for direct, repo-object and plain local-package kernels; only
Hub kernels and local repos in the Hugging Face layout need it.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from .errors import KernelLoadError

__all__ = ["load_hub_kernel", "load_local_hf_kernel"]


def _kernels_package(where: str):
    try:
        import kernels
    except ImportError as e:
        raise KernelLoadError(
            f"{where}: the Hugging Face `kernels` package is needed for this kernel; pip install 'kernels>=0.17,<0.18'."
        ) from e
    return kernels


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def load_hub_kernel(
    repo_id: str,
    *,
    revision: str | None,
    version: int | str | None,
    trust_remote_code: bool | list[str],
    where: str,
) -> ModuleType:
    """``kernels.get_kernel`` with errors that say what failed and how to fix it."""
    kernels = _kernels_package(where)
    kwargs: dict = {"trust_remote_code": trust_remote_code}
    if version is not None:
        kwargs["version"] = version
    else:
        kwargs["revision"] = revision or "main"
    try:
        return kernels.get_kernel(repo_id, **kwargs)
    except Exception as e:
        hint = (
            "HF_HUB_OFFLINE is set and the kernel is not in the local cache: download it once online "
            "(or point LOCAL_KERNELS at a local copy)"
            if _offline()
            else "check the repo id, the revision/version, your network and trust_remote_code"
        )
        raise KernelLoadError(f"{where}: kernels.get_kernel failed ({type(e).__name__}: {e}); {hint}.") from e


def load_local_hf_kernel(path: Path, *, trust_remote_code: bool | list[str], where: str) -> ModuleType:
    """``kernels.get_local_kernel`` for a repo in the Hugging Face layout (metadata.json / build/)."""
    kernels = _kernels_package(where)
    try:
        return kernels.get_local_kernel(Path(path), trust_remote_code=trust_remote_code)
    except Exception as e:
        raise KernelLoadError(
            f"{where}: kernels.get_local_kernel refused {path} ({type(e).__name__}: {e}); "
            "check metadata.json and the build/<variant>/ layout."
        ) from e
