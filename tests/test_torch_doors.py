"""Private torch names are reached through the doors, and nowhere else.

A private torch name (``torch._dynamo.config``, ``torch._C._cuda_getDevice``, ``torch._foreach_zero_``) may
move in any torch release. The project reaches each one from a door module, one named function (or
name) each with its own test (``tests/core/test_torch_internals.py``), so a torch upgrade is checked in
the doors. This test reads every module of ``twinkle_fx/`` and ``kernels/`` (its syntax tree, nothing
is imported) and names each access outside a door as ``path:line``.

An access is an import of a private torch module (``import torch._dynamo``, ``from torch._library
import ...``), a private name imported from torch (``from torch import _dynamo``, ``from torch.utils
import _pytree``), an attribute chain that starts at torch, or at a name imported from it, with a
part that starts with ``_`` (``torch._C._cuda_getDevice``, ``nn.Module._call_impl``; dunders such as
``torch.__version__`` are public), ``getattr`` of such a name given as a string, and
``importlib.import_module("torch._...")``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("twinkle_fx", "kernels")

# The doors, and why each is one. Nothing else may reach a private torch name.
DOORS = {
    "twinkle_fx/core/torch_internals.py": "the library's door: every torch, Dynamo and Inductor internal the "
                                          "eager path, the compile backend and the tools use",
    "twinkle_fx/compiler/graph/dynamo.py": "the compile backend's door to Dynamo's graph metadata (node.meta, "
                                              "sources, module stacks), which only the backend reads",
    "kernels/twinkle_triton/_torch_internals.py": "the kernel repo's own door: twinkle_triton loads without "
                                                  "twinkle_fx (a local or Hub kernel repo), so it cannot use the "
                                                  "library's",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None when it does not start at a plain name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _torch_names(tree: ast.AST) -> dict[str, str]:
    """Names bound to torch or to something imported from it, and the dotted path each stands for."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    if alias.asname is not None:
                        bound[alias.asname] = alias.name
                    else:
                        bound["torch"] = "torch"
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def private_accesses(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """``(line, what)`` for each access to a private torch name in ``source``."""
    tree = ast.parse(source, filename)
    torch_names = _torch_names(tree)
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names
                      if a.name.split(".")[0] == "torch" and any(map(_private, a.name.split(".")))]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "torch":
            found += [(node.lineno, f"from {node.module} import {a.name}") for a in node.names
                      if any(map(_private, node.module.split("."))) or _private(a.name)]
        elif isinstance(node, ast.Attribute) and id(node) not in inner:  # the whole chain, once
            parts = _chain(node)
            if parts is not None and parts[0] in torch_names and any(map(_private, parts[1:])):
                found.append((node.lineno, ".".join([torch_names[parts[0]], *parts[1:]])))
        elif isinstance(node, ast.Call) and node.args:
            func = _chain(node.func) or []
            text = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if func[-1:] in (["import_module"], ["__import__"]) and text and text[0].split(".")[0] == "torch" \
                    and any(map(_private, text[0].split("."))):
                found.append((node.lineno, f"import_module({text[0]!r})"))
            elif func == ["getattr"] and len(node.args) >= 2 and len(text) == 1 and _private(text[0]):
                owner = _chain(node.args[0])
                if owner is not None and owner[0] in torch_names:
                    found.append((node.lineno, f"getattr({'.'.join([torch_names[owner[0]], *owner[1:]])}, {text[0]!r})"))
    return sorted(set(found))


def _modules() -> list[Path]:
    return sorted(path for top in SCANNED for path in (ROOT / top).rglob("*.py"))


def test_private_torch_names_are_reached_through_the_doors_only():
    leaks = [f"{path.relative_to(ROOT).as_posix()}:{line}: {what}"
             for path in _modules() if path.relative_to(ROOT).as_posix() not in DOORS
             for line, what in private_accesses(path.read_text(), str(path))]
    assert leaks == [], (
        "private torch names reached outside the doors (add a named function for each to "
        "twinkle_fx/core/torch_internals.py, or kernels/twinkle_triton/_torch_internals.py in the kernels, "
        "with a test in tests/core/test_torch_internals.py, and call that):\n" + "\n".join(leaks))


@pytest.mark.parametrize("door", sorted(DOORS))
def test_each_door_is_a_module_of_the_scanned_packages(door):
    assert (ROOT / door).is_file() and door.split("/")[0] in SCANNED, f"{door} is listed as a door but is no module"


def test_the_scan_finds_every_kind_of_access():
    source = "\n".join([
        "import torch",                                      # 1
        "import torch._dynamo",                              # 2
        "import torch.nn.functional as F",                   # 3
        "from torch._library.triton import enabled",         # 4
        "from torch import _dynamo, nn",                     # 5
        "from torch.utils import _pytree",                   # 6
        "torch._C._cuda_getDevice()",                        # 7
        "nn.Module._call_impl",                              # 8
        "F._canonical_mask(x)",                              # 9
        "getattr(torch.ops, '_private')",                    # 10
        "importlib.import_module('torch._inductor.ir')",     # 11
        "torch.__version__, torch.nn.Module.__init__",       # 12: dunders are public
        "torch.compiler.reset(); nn.functional.gelu(x)",     # 13: public
        "module._modules, other._C",                         # 14: not torch
    ])
    assert private_accesses(source) == [
        (2, "import torch._dynamo"),
        (4, "from torch._library.triton import enabled"),
        (5, "from torch import _dynamo"),
        (6, "from torch.utils import _pytree"),
        (7, "torch._C._cuda_getDevice"),
        (8, "torch.nn.Module._call_impl"),
        (9, "torch.nn.functional._canonical_mask"),
        (10, "getattr(torch.ops, '_private')"),
        (11, "import_module('torch._inductor.ir')"),
    ]
