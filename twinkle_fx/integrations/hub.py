"""The only place that talks to the Hugging Face ``kernels`` package (imported lazily).

twinkle_fx works without ``kernels`` for direct, repo-object and plain local-package kernels; only
Hub kernels and local repos in the Hugging Face layout need it.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from ..core.errors import KernelLoadError

__all__ = ["is_namespace_folder", "load_hub_kernel", "load_local_hf_kernel", "publish_to_hub_cache"]


def is_namespace_folder(module: ModuleType) -> bool:
    """Whether ``module`` is a folder without ``__init__.py`` imported as a namespace package, not an installed
    package: where the Hugging Face ``kernels`` is not installed, ``import kernels`` finds any ``kernels/`` folder on
    ``sys.path`` that way (this repository's, or a project's), and transformers' availability check imports it."""
    return getattr(module, "__file__", None) is None and hasattr(module, "__path__")


def _kernels_package(where: str):
    install = "pip install 'kernels>=0.17,<0.18'"
    try:
        import kernels
    except ImportError as e:
        raise KernelLoadError(f"{where}: the Hugging Face `kernels` package is needed for this kernel; {install}.") from e
    if is_namespace_folder(kernels):
        raise KernelLoadError(
            f"{where}: the Hugging Face `kernels` package is needed for this kernel, and `import kernels` found the "
            f"folder {', '.join(map(str, kernels.__path__))} instead (no __init__.py: not the package); {install}."
        )
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
    if isinstance(version, str):
        if not version.strip().isdigit():
            # the documents show version="0.1.0"; kernels 0.17 resolves only whole versions (tag v<N>)
            raise KernelLoadError(
                f"{where}: version={version!r} is not a whole number: the kernels package pins versions as "
                f"integers (version=1 loads tag v1); for a tag or branch named {version!r} pass "
                f"revision={version!r} (or revision='v{version}') instead.")
        version = int(version)
    if version is not None:
        kwargs["version"] = version
    else:
        kwargs["revision"] = revision or "main"
    try:
        return kernels.get_kernel(repo_id, **kwargs)
    except Exception as e:
        raise KernelLoadError(f"{where}: kernels.get_kernel failed ({type(e).__name__}: {e}); {_hint(e)}.") from e


_NETWORK_ERRORS = ("ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout", "MaxRetryError",
                   "NameResolutionError", "OfflineModeIsEnabled", "gaierror")


def _network_failure(error: BaseException) -> bool:
    """Whether the Hub could not be reached: a connection error anywhere in the exception's chain.
    kernels 0.17 checks the publisher's trust first, so with the network down its error speaks of
    trust_remote_code while the cause is the connection."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ConnectionError) or type(error).__name__ in _NETWORK_ERRORS:
            return True
        error = error.__cause__ or error.__context__
    return False


def _hint(error: Exception) -> str:
    """What to do about a ``kernels.get_kernel`` failure, from its (kernels 0.17.2) message and cause."""
    text = str(error)
    if _network_failure(error):
        return ("the Hugging Face Hub could not be reached (network down, a proxy, or a DNS failure): check the "
                "connection, or set HF_HUB_OFFLINE=1 to use the local cache")
    if "trust_remote_code" in text:
        return "pass trust_remote_code=True, or a list of repo ids, to load kernels from publishers the Hub does not trust"
    if "Cannot parse metadata" in text or "build variant" in text or "metadata.json" in text:
        return "the kernel repo was found but refused: check its metadata.json and build/<variant>/ layout"
    if _offline() and "local" in text:
        return ("HF_HUB_OFFLINE is set and the kernel is not in the local cache: download it once online "
                "(or point LOCAL_KERNELS at a local copy)")
    return "check the repo id, the revision/version, your network and trust_remote_code"


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


def publish_to_hub_cache(
    package_dir: str | Path,
    repo_id: str,
    *,
    hf_home: str | Path,
    commit: str = "0" * 39 + "1",
    version: int | None = 1,
    package_name: str | None = None,
) -> Path:
    """Lay out a Python kernel package as a Hugging Face Hub cache entry, for offline use.

    ``kernels.get_kernel(repo_id, revision="main")`` (and ``version=version``) then loads it with
    ``HF_HOME=hf_home HF_HUB_OFFLINE=1``, through the real resolver: the tests and examples use this
    to exercise the Hub path without a network. Layout written::

        <hf_home>/hub/kernels--<org>--<name>/refs/main            (holds <commit>)
        <hf_home>/hub/kernels--<org>--<name>/refs/v<version>
        <hf_home>/hub/kernels--<org>--<name>/snapshots/<commit>/build/torch-universal/<package>/...
        .../torch-universal/metadata.json

    Args:
        package_dir: the package folder to copy (it must have an ``__init__.py``).
        repo_id (`str`): "org/name".
        package_name (`str`, *optional*): the package's name inside the repo; defaults to the repo name.

    Returns:
        The snapshot folder.

    Examples:
        >>> # not run by the doctest test: it writes a Hub cache (the test suite's offline Hub is built with it)
        >>> publish_to_hub_cache("kernels/twinkle_triton", "kernels-community/activation",
        ...                      hf_home="/tmp/hf")  # doctest: +SKIP
    """
    import json
    import shutil

    import torch

    package_dir = Path(package_dir)
    if not (package_dir / "__init__.py").is_file():
        raise ValueError(f"{package_dir} is not a Python package (no __init__.py).")
    org, _, name = repo_id.partition("/")
    if not org or not name:
        raise ValueError(f"repo_id must look like 'org/name', got {repo_id!r}.")
    package_name = package_name or name.replace("-", "_")
    repo_dir = Path(hf_home) / "hub" / f"kernels--{org}--{name}"
    snapshot = repo_dir / "snapshots" / commit
    variant = snapshot / "build" / "torch-universal"
    target = variant / package_name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(package_dir, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    metadata = {
        "id": f"{package_name}_{commit[:7]}",
        "name": package_name.replace("_", "-"),  # kernel names are dashed; the loader imports python_name
        "version": version,
        "license": "Apache-2.0",
        "backend": {"type": "cuda" if torch.version.cuda else "cpu"},
        "python-depends": [],
    }
    (variant / "metadata.json").write_text(json.dumps(metadata, indent=2))
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)
    if version is not None:
        (repo_dir / "refs" / f"v{version}").write_text(commit)
    return snapshot
