"""Where a kernel comes from: a direct implementation, a repo object, a local repo, the Hub.

Every source has ``load()`` (lazy, cached, thread-safe; any failure becomes a
:class:`~twinkle_fx.core.errors.KernelLoadError` that names the source) and ``describe()``.
A Hub or Hugging Face-layout source loads through the Hub loader plugged into
:mod:`twinkle_fx.core.plugins` (the ``kernels`` package, imported only then).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

import torch

from .errors import KernelLoadError
from .plugins import hub_loader

__all__ = [
    "FuncRepositoryProtocol",
    "KernelSource",
    "ImplSource",
    "RepoObjectSource",
    "LocalRepoSource",
    "HubSource",
    "make_source",
]


@runtime_checkable
class FuncRepositoryProtocol(Protocol):
    """Any object with ``load()`` returning the kernel (an nn.Module class, an instance, or a callable)."""

    def load(self) -> Any: ...


class KernelSource:
    """Base class: subclasses implement ``_load()`` and ``describe()``; ``load()`` caches both outcomes.

    Failures are cached too, so an offline Hub repo is not retried (and not re-logged) on every call.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded: Any = None
        self._error: KernelLoadError | None = None
        self._done = False

    def load(self) -> Any:
        with self._lock:
            if not self._done:
                try:
                    self._loaded = self._load()
                except KernelLoadError as e:
                    self._error = e
                except Exception as e:  # any failure of user/kernel code is a load failure
                    self._error = KernelLoadError(f"{self.describe()}: {type(e).__name__}: {e}")
                    self._error.__cause__ = e
                self._done = True
            if self._error is not None:
                raise self._error
            return self._loaded

    def _load(self) -> Any:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


class ImplSource(KernelSource):
    """A kernel given directly (``layer=`` / ``func_impl=``)."""

    def __init__(self, impl: Any) -> None:
        super().__init__()
        if impl is None:
            raise ValueError("The kernel implementation is None; pass a class, module or callable.")
        self.impl = impl

    def _load(self) -> Any:
        return self.impl

    def describe(self) -> str:
        return f"impl {getattr(self.impl, '__qualname__', type(self.impl).__qualname__)}"


class RepoObjectSource(KernelSource):
    """A repository object whose ``load()`` returns the kernel."""

    def __init__(self, repo: Any) -> None:
        super().__init__()
        if not callable(getattr(repo, "load", None)):
            raise TypeError(f"repo={repo!r} has no load() method; it must follow FuncRepositoryProtocol.")
        self.repo = repo

    def _load(self) -> Any:
        loaded = self.repo.load()
        if loaded is None:
            raise KernelLoadError(f"{self.describe()}: load() returned None.")
        return loaded

    def describe(self) -> str:
        return f"repo {type(self.repo).__qualname__}"


def _attribute(module: ModuleType, name: str, where: str, *, prefer_layers: bool) -> Any:
    """``module.layers.<name>`` (layers) or ``module.<name>``, with an error listing what exists."""
    holders = []
    layers = getattr(module, "layers", None)
    if prefer_layers and isinstance(layers, ModuleType):
        holders.append(layers)
    holders.append(module)
    for holder in holders:
        if hasattr(holder, name):
            return getattr(holder, name)
    available = sorted(
        n for holder in holders for n in vars(holder) if not n.startswith("_") and n[0].isupper() == prefer_layers
    )
    kind = "layer" if prefer_layers else "function"
    raise KernelLoadError(
        f"{where}: no {kind} named {name!r}; available: {', '.join(available) or '(none)'}."
    )


def _is_hf_layout(path: Path) -> bool:
    return (path / "build").is_dir() or (path / "metadata.json").is_file()


class LocalRepoSource(KernelSource):
    """A kernel repository on disk.

    Two layouts are accepted:
    - a plain Python package ``<repo_path>/<package_name>/`` whose ``layers.py`` (or top level)
      defines ``<attr>``; it is imported under a private module name, so it never clashes with an
      installed package of the same name;
    - the Hugging Face kernel layout (``metadata.json`` or ``build/<variant>/``), loaded through
      ``kernels.get_local_kernel``.
    """

    def __init__(
        self,
        repo_path: str | Path,
        package_name: str | None,
        attr: str,
        *,
        is_layer: bool,
        trust_remote_code: bool | list[str] = False,
    ) -> None:
        super().__init__()
        self.repo_path = Path(repo_path).expanduser()
        self.package_name = package_name
        self.attr = attr
        self.is_layer = is_layer
        self.trust_remote_code = trust_remote_code

    def describe(self) -> str:
        return f"local repo {self.repo_path} package {self.package_name!r} {'layer' if self.is_layer else 'function'} {self.attr!r}"

    def _load(self) -> Any:
        if not self.repo_path.is_dir():
            raise KernelLoadError(f"{self.describe()}: repo_path {str(self.repo_path)!r} does not exist or is not a directory.")
        package_dir = self.repo_path / self.package_name if self.package_name else None
        if package_dir is not None and (package_dir / "__init__.py").is_file():
            module = _import_package(package_dir, self.describe())
        elif _is_hf_layout(self.repo_path):
            module = hub_loader(self.describe()).load_local_hf_kernel(
                self.repo_path, trust_remote_code=self.trust_remote_code, where=self.describe())
        elif not self.package_name:
            raise KernelLoadError(f"{self.describe()}: package_name is required for a plain Python package repo.")
        else:
            raise KernelLoadError(
                f"{self.describe()}: package {self.package_name!r} not found: expected "
                f"{package_dir / '__init__.py'} (or a Hugging Face kernel layout with metadata.json / build/)."
            )
        return _attribute(module, self.attr, self.describe(), prefer_layers=self.is_layer)


def _import_package(package_dir: Path, where: str) -> ModuleType:
    # A private, path-derived name: two repos with the same package name never collide, and an
    # installed package of that name is not shadowed.
    digest = hashlib.sha1(str(package_dir.resolve()).encode()).hexdigest()[:10]
    name = f"_twinkle_local_{package_dir.name}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, package_dir / "__init__.py", submodule_search_locations=[str(package_dir)]
    )
    if spec is None or spec.loader is None:
        raise KernelLoadError(f"{where}: cannot import {package_dir}.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        for sub in [m for m in sys.modules if m.startswith(name + ".")]:
            sys.modules.pop(sub, None)
        raise KernelLoadError(f"{where}: importing {package_dir} raised {type(e).__name__}: {e}") from e
    return module


class HubSource(KernelSource):
    """A kernel from the Hugging Face Hub, loaded with ``kernels.get_kernel`` (offline from cache too)."""

    def __init__(
        self,
        repo_id: str,
        attr: str,
        *,
        is_layer: bool,
        revision: str | None = None,
        version: int | str | None = None,
        trust_remote_code: bool | list[str] = False,
    ) -> None:
        super().__init__()
        if revision is not None and version is not None:
            raise ValueError(f"Hub kernel {repo_id!r}: pass either revision= or version=, not both.")
        self.repo_id = repo_id
        self.attr = attr
        self.is_layer = is_layer
        self.revision = revision
        self.version = version
        self.trust_remote_code = trust_remote_code

    def pin(self) -> str:
        if self.version is not None:
            return f"version {self.version}"
        return f"revision {self.revision or 'main'}"

    def describe(self) -> str:
        return f"hub {self.repo_id} ({self.pin()}) {'layer' if self.is_layer else 'function'} {self.attr!r}"

    def _load(self) -> Any:
        module = hub_loader(self.describe()).load_hub_kernel(
            self.repo_id,
            revision=self.revision,
            version=self.version,
            trust_remote_code=self.trust_remote_code,
            where=self.describe(),
        )
        return _attribute(module, self.attr, self.describe(), prefer_layers=self.is_layer)


def _check_source_arguments(what: str, is_layer: bool, impl: Any, impl_arg: str, repo_path: Any, package_name: Any,
                            attr: Any, revision: Any, version: Any, trust_remote_code: Any) -> None:
    """Type checks that name the argument, so a wrong type fails here and not deep in a loader."""
    if impl is not None and not isinstance(impl, type) and not isinstance(impl, torch.nn.Module):
        if not callable(impl):
            raise TypeError(f"{what}: {impl_arg}= must be {'an nn.Module class, an instance or ' if is_layer else ''}"
                            f"a callable, got {type(impl).__name__} {impl!r:.60}.")
        if is_layer:
            try:
                inspect.signature(impl)
            except (TypeError, ValueError):
                raise TypeError(f"{what}: layer={impl!r} has no Python signature, so it cannot be checked against "
                                "the layer's forward; wrap it in def forward(self, ...) or an nn.Module class.") from None
    if repo_path is not None and not isinstance(repo_path, (str, os.PathLike)):
        raise TypeError(f"{what}: repo_path must be a path (str or pathlib.Path), got {type(repo_path).__name__} {repo_path!r}.")
    for name, value in (("package_name", package_name), ("revision", revision),
                        ("layer_name" if is_layer else "kernel_func_name", attr)):
        if value is not None and (not isinstance(value, str) or not value):
            raise TypeError(f"{what}: {name} must be a non-empty string, got {type(value).__name__} {value!r}.")
    if version is not None and (isinstance(version, bool) or not isinstance(version, (int, str))):
        raise TypeError(f"{what}: version must be an int or a version string such as '0.1.0', got "
                        f"{type(version).__name__} {version!r}.")
    if not (isinstance(trust_remote_code, bool) or (isinstance(trust_remote_code, (list, tuple))
                                                    and all(isinstance(o, str) for o in trust_remote_code))):
        raise TypeError(f"{what}: trust_remote_code must be True, False or a list of organisation names, got "
                        f"{trust_remote_code!r}.")


def make_source(
    *,
    what: str,
    is_layer: bool,
    impl: Any = None,
    repo: Any = None,
    repo_id: str | None = None,
    repo_path: str | Path | None = None,
    package_name: str | None = None,
    attr: str | None = None,
    revision: str | None = None,
    version: int | str | None = None,
    trust_remote_code: bool | list[str] = False,
    impl_arg: str = "layer",
) -> KernelSource:
    """Build exactly one source from registration keywords, validating the combination.

    Args:
        what: the registration, for error messages (``"layer kernel 'MyMLP'"``).
        impl_arg: the user-facing name of ``impl`` (``"layer"`` or ``"func_impl"``).

    Raises:
        ValueError: none or several of impl / repo / repo_id / repo_path, both revision and version,
            or a missing ``attr`` for repo_id / repo_path.
    """
    _check_source_arguments(what, is_layer, impl, impl_arg, repo_path, package_name, attr, revision, version,
                            trust_remote_code)
    given = [name for name, value in ((impl_arg, impl), ("repo", repo), ("repo_id", repo_id), ("repo_path", repo_path)) if value is not None]
    if len(given) != 1:
        raise ValueError(
            f"{what}: pass exactly one of {impl_arg}=, repo=, repo_id=, repo_path= "
            f"(got {', '.join(given) if given else 'none'})."
        )
    if revision is not None and version is not None:
        raise ValueError(f"{what}: pass either revision= or version=, not both.")
    if (revision is not None or version is not None) and repo_id is None:
        raise ValueError(f"{what}: revision=/version= only apply to repo_id= (Hub) kernels.")
    if impl is not None:
        return ImplSource(impl)
    if repo is not None:
        return RepoObjectSource(repo)
    if not attr:
        raise ValueError(f"{what}: {'layer_name' if is_layer else 'func_name'} is required with repo_id=/repo_path=.")
    if repo_id is not None:
        if not isinstance(repo_id, str) or repo_id.count("/") != 1:
            raise ValueError(f"{what}: repo_id must look like 'org/name', got {repo_id!r}.")
        return HubSource(repo_id, attr, is_layer=is_layer, revision=revision, version=version, trust_remote_code=trust_remote_code)
    return LocalRepoSource(repo_path, package_name, attr, is_layer=is_layer, trust_remote_code=trust_remote_code)
