"""What the backend reads from Dynamo's node metadata, and the one way to find a module instance.

None of these is a public torch API; each accessor has a test (``tests/compile/test_dynamo_internals.py``)
so a torch upgrade that changes one breaks here, and only here. The private torch names these reach
(the fake-tensor class, the compiling frame) come from :mod:`twinkle_fx.core.torch_internals`. How
Dynamo cut and nested the graph (graph breaks, checkpoint bodies) is :mod:`.structure`.

- ``node.meta["nn_module_stack"]``: ``{str(id(module)) or "id@N": (source path, class)}``, outer to inner
  (:func:`module_stack`; a module's parent in the module tree, :func:`parent_class`);
- ``node.meta["example_value"]`` / ``["val"]``: the fake value of a node (:func:`example_value`);
- ``node.meta["grapharg"]``: ``.example`` (the real tensor behind a graph input, :func:`real_input`) and
  ``.source.name`` (where Dynamo read it, :func:`input_source`, parsed by :func:`parse_source`; a
  module's float attribute read there, :func:`lifted_attribute`);
- ``node.meta["stack_trace"]``: the frames of inlined calls (:func:`stack_frames`);
- ``Node._erased`` (:func:`is_erased`);
- the frame being compiled (``InstructionTranslator.current_tx()``), the models the caller named
  (:func:`known_modules`) and, where neither answers, a ``gc.get_referrers`` heap scan:
  :class:`ModuleLookup`, the one way to find a module instance.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import gc
import logging
import re
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from ...core.torch_internals import compiling_translator, fake_tensor_type

logger = logging.getLogger(__name__)

__all__ = [
    "ModuleFrame", "module_stack", "parent_class", "provenance", "common_provenance", "example_value", "set_example_value",
    "real_input", "input_source", "SourceRef", "parse_source", "lifted_attribute", "Frame", "stack_frames", "is_erased",
    "ModuleLookup", "module_lookup", "known_modules", "module_roots", "heap_instances",
]


# --- nn_module_stack -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModuleFrame:
    """One ``nn_module_stack`` entry: a call of module instance ``instance_id`` of class ``cls``."""

    key: str  # Dynamo's key: "140211..." or, for the N-th repeated call of one instance, "140211...@N"
    source: str  # where Dynamo found the module: "L['self'].model.layers.0.mlp"
    cls: Any  # the module's class (a type; Dynamo may record something else for exotic modules)

    @property
    def instance_id(self) -> int | None:
        try:
            return int(self.key.split("@", 1)[0])
        except ValueError:
            return None

    @property
    def location(self) -> str:
        """The module path under the compiled root ("model.layers.0.mlp"; "<root>"), with "@N" on repeat calls."""
        ref = parse_source(self.source)
        path = ref.path if ref is not None else self.source
        path = path or "<root>"
        return f"{path}@{self.key.split('@', 1)[1]}" if "@" in self.key else path

    @property
    def local(self) -> bool:
        """Reached from a local of the compiled frame (``L[...]``), not from a global (``G[...]``)."""
        return self.source.startswith("L[")


def module_stack(node: fx.Node) -> list[ModuleFrame]:
    """The modules ``node`` came from, outer to inner (empty for nodes outside any module)."""
    return [ModuleFrame(key, path, cls) for key, (path, cls) in (node.meta.get("nn_module_stack") or {}).items()]


def parent_class(stack: list[ModuleFrame], index: int, lookup: ModuleLookup | None = None) -> type | None:
    """The class of the module holding ``stack[index]``'s module as a submodule: its parent in the
    module tree, the parent ``kernelize_model`` sees (``register_external_layer(..., within=...)``).

    That is the enclosing entry whose source path is this one's without its last name
    (``L['self'].model.layers.0`` for ``L['self'].model.layers.0.input_layernorm``). The compiled
    root is never on the stack, and a container (``nn.ModuleList``) or a module that did not make
    the call is not either: then ``lookup`` resolves the parent's path from the frame being compiled.
    None when neither answers (a module reached from no path, or the compiled root itself).
    """
    ref = parse_source(stack[index].source)
    if ref is None or not ref.modules:
        return None
    want = (ref.root, ref.modules[:-1])
    for frame in reversed(stack[:index]):
        other = parse_source(frame.source)
        if other is not None and other.member is None and (other.root, other.modules) == want:
            return frame.cls if isinstance(frame.cls, type) else None
    if lookup is not None:
        owner = lookup.resolve(dataclasses.replace(ref, modules=ref.modules[:-1], member=None, attribute=None))
        if isinstance(owner, torch.nn.Module):
            return type(owner)
    return None


_PROVENANCE = ("nn_module_stack", "stack_trace", "source_fn_stack")


def provenance(node: fx.Node) -> dict[str, Any]:
    """The metadata saying where ``node`` came from (module stack, stack trace, source function),
    to copy onto a node that stands for it."""
    return {k: v for k, v in node.meta.items() if k in _PROVENANCE}


def common_provenance(nodes: list[fx.Node]) -> dict[str, Any]:
    """Provenance for one node standing for ``nodes``: the first one's stack trace and the module
    stack they share (outer to inner, up to the first difference)."""
    meta = {k: v for k, v in nodes[0].meta.items() if k in ("stack_trace", "source_fn_stack")}
    stacks = [list((n.meta.get("nn_module_stack") or {}).items()) for n in nodes]
    common = []
    for entries in zip(*stacks):
        if any(entry != entries[0] for entry in entries):
            break
        common.append(entries[0])
    meta["nn_module_stack"] = dict(common)
    return meta


# --- graph inputs -----------------------------------------------------------------------------------


def example_value(node: fx.Node) -> Any:
    """Dynamo's example value of ``node`` (a FakeTensor, SymInt, or Python value)."""
    return node.meta.get("example_value", node.meta.get("val"))


def set_example_value(node: fx.Node, value: Any) -> None:
    """Record ``value`` as the fake value of a node the backend made (what Dynamo's own nodes carry)."""
    node.meta["example_value"] = value


def is_ddp_piece(example_inputs: list[Any]) -> bool:
    """Whether the graph is one of DDPOptimizer's pieces: it compiles each gradient bucket's piece of
    a DDP model's graph on fake copies of its inputs, where Dynamo hands a whole graph real ones."""
    fake = fake_tensor_type()
    return any(isinstance(value, fake) for value in example_inputs)


def real_input(placeholder: fx.Node, value: Any) -> Any:
    """The real tensor behind a graph input the backend was handed as a FakeTensor, else ``value``.

    DDPOptimizer (``torch.compile`` of a DDP model with several buckets) compiles each bucket's
    subgraph on fake copies of its inputs; parameters are recognised by identity, so without this
    every layer region of a split graph reads as "state from outside the module".
    """
    fake = fake_tensor_type()
    if isinstance(value, fake):
        real = getattr(placeholder.meta.get("grapharg"), "example", None)
        if isinstance(real, torch.Tensor) and not isinstance(real, fake):
            return real
    return value


def input_source(placeholder: fx.Node) -> str | None:
    """Where Dynamo read a graph input: ``"L['self']._modules['norm']._parameters['weight']"``, or None."""
    name = getattr(getattr(placeholder.meta.get("grapharg"), "source", None), "name", None)
    name = name() if callable(name) else name
    return name if isinstance(name, str) else None


@dataclass(frozen=True)
class SourceRef:
    """A source name taken apart: ``scope['name']`` then submodules, then what was read from the last one."""

    scope: str  # "L" (a local of the compiled frame) or "G" (a global)
    name: str  # the local or global name ("self", "model")
    modules: tuple[str, ...]  # submodule names from the root ("model", "layers", "0", "norm")
    member: str | None  # "parameter", "buffer", "attribute" or None (the source is a module)
    attribute: str | None  # the parameter / buffer / dotted attribute name
    # indices into the local before the first submodule: a frame whose module arrives through
    # ``*args`` (a decorator's ``wrapper(*args, **kwargs)``, as transformers' ``deprecate_kwarg``
    # wraps ``*ForCausalLM.forward``) reads it as ``L['args'][0]``; the root is that element
    items: tuple[int, ...] = ()

    @property
    def root(self) -> tuple[str, str, tuple[int, ...]]:
        """Which object of the frame the path starts from: scope, name and indices."""
        return self.scope, self.name, self.items

    @property
    def path(self) -> str:
        """The dotted module path as the model names it: ``m.forward.__self__`` is ``m``, and a local that is a bound
        method is its module (``torch.compile(seq.forward)`` of an ``nn.Sequential`` sees ``L['fn'].__self__.0``)."""
        names: list[str] = []
        for name in self.modules:  # a bound method's __self__: back to the object the method was read from
            names = names[:-1] if name == "__self__" else [*names, name]
        return ".".join(names)


_ROOT = re.compile(r"^(?P<scope>[LG])\['(?P<name>[^']+)'\]")
_ITEM = re.compile(r"\[(?P<index>\d+)\]")
_TOKEN = re.compile(r"\._modules\['(?P<module>[^']+)'\]|\._(?P<kind>parameters|buffers)\['(?P<member>[^']+)'\]"
                    r"|\[(?P<index>\d+)\]|\['(?P<key>[^']+)'\]|\.(?P<name>[A-Za-z_0-9]\w*)")


def parse_source(source: str | None) -> SourceRef | None:
    """Parse a source name (a graph input's, or an ``nn_module_stack`` path); None for other forms.

    Attribute names after the last submodule are kept dotted (``"rotary.scale"``); a name that is
    a digit is a submodule (``layers.0``). Which dotted names are submodules is only known by
    resolving the path, so ``L['self'].norm.eps`` reads as modules ``("norm", "eps")``: callers
    that need the split use :meth:`ModuleLookup.resolve`.
    """
    if not source:
        return None
    root = _ROOT.match(source)
    if root is None:
        return None
    modules: list[str] = []
    items: list[int] = []
    pos = root.end()
    while (item := _ITEM.match(source, pos)) is not None:
        items.append(int(item.group("index")))
        pos = item.end()
    while pos < len(source):
        token = _TOKEN.match(source, pos)
        if token is None:
            return None
        pos = token.end()
        if token.group("kind"):
            if pos != len(source):
                return None
            kind = "parameter" if token.group("kind") == "parameters" else "buffer"
            return SourceRef(root["scope"], root["name"], tuple(modules), kind, token.group("member"), tuple(items))
        modules.append(next(g for g in token.group("module", "index", "key", "name") if g is not None))
    return SourceRef(root["scope"], root["name"], tuple(modules), None, None, tuple(items))


def lifted_attribute(source: str | None, owner: str, module: torch.nn.Module, value: Any) -> tuple[str, float] | None:
    """``(attribute path, value)`` when the graph input Dynamo read from ``source`` is a float attribute
    of ``module``, the module at ``owner``, that Dynamo lifted to a graph input (it does so once two
    instances of a class differ in it: ``eps``), else None. ``value`` is what the graph input holds."""
    ref, owner_ref = parse_source(source), parse_source(owner)
    if ref is None or owner_ref is None or ref.member is not None or ref.root != owner_ref.root:
        return None
    if ref.modules[: len(owner_ref.modules)] != owner_ref.modules or len(ref.modules) == len(owner_ref.modules):
        return None
    attribute = ".".join(ref.modules[len(owner_ref.modules):])
    try:
        current = functools.reduce(getattr, attribute.split("."), module)
    except AttributeError:
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not isinstance(value, fake_tensor_type()):
        value = value.item()
    if not isinstance(current, float) or not isinstance(value, float):
        return None
    return attribute, value


# --- stack traces of inlined calls ------------------------------------------------------------------

@dataclass(frozen=True)
class Frame:
    """One frame of a stack: file, line, function name."""

    filename: str
    lineno: int
    name: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno} in {self.name}"


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)')


def stack_frames(node: fx.Node) -> list[Frame]:
    """The frames of ``node.meta["stack_trace"]``, outer to inner (empty for nodes Dynamo made itself)."""
    return stack_frames_of(node.meta.get("stack_trace"))


def stack_frames_of(stack_trace: str | None) -> list[Frame]:
    """The frames of a node's ``stack_trace`` text, outer to inner."""
    return [Frame(file, int(line), name) for file, line, name in _FRAME.findall(stack_trace or "")]


def is_erased(node: fx.Node) -> bool:
    """Whether ``node`` was removed from its graph (a match still holds it after a rewrite)."""
    return bool(getattr(node, "_erased", False))


# --- module instances -------------------------------------------------------------------------------


def heap_instances(classes: Iterable[type]) -> list[Any]:
    """Every live instance of exactly one of ``classes`` (a full heap walk: the last resort)."""
    classes = tuple(classes)
    if not classes:
        return []
    wanted = set(classes)
    return [obj for obj in gc.get_referrers(*classes) if type(obj) in wanted]


class ModuleLookup:
    """Finds module instances of one compile: the one way the passes reach a module.

    Dynamo records a module's id and class (``nn_module_stack``) and where it found it (a source
    path under a local or global of the compiled frame). The lookup resolves that path from the
    frame being compiled, which costs a few attribute reads; models given up front (``explain``)
    are indexed by id; only a module reached neither way costs a heap scan, once per class per
    compile. One lookup serves every graph of a compile (DDP's split graphs share it). It holds
    modules and the frame weakly: a compiled graph must not keep a model alive.
    """

    def __init__(self, roots: tuple[torch.nn.Module, ...] = (), frame: Any = None) -> None:
        self._by_id: dict[int, weakref.ref] = {id(m): weakref.ref(m) for root in roots for m in root.modules()}
        self._frame = None if frame is None else weakref.ref(frame)
        self._scanned: set[type] = set()
        self.heap_scans = 0  # how many heap walks this lookup made (tests and DEBUG logs read it)

    def resolve(self, ref: SourceRef) -> Any:
        """The object a parsed source names: its module (``member`` None) or the parameter/buffer/attribute."""
        frame = None if self._frame is None else self._frame()
        if frame is None:
            return None
        namespace = getattr(frame, "f_locals" if ref.scope == "L" else "f_globals", None) or {}
        obj = namespace.get(ref.name)
        for item in ref.items:
            if not isinstance(obj, (tuple, list)) or item >= len(obj):
                return None
            obj = obj[item]
        for name in ref.modules:
            modules = getattr(obj, "_modules", None)
            if isinstance(modules, dict) and name in modules:
                obj = modules[name]
            elif name.isidentifier() and hasattr(obj, name):
                obj = getattr(obj, name)
            else:
                return None
        if ref.member == "parameter":
            return getattr(obj, "_parameters", {}).get(ref.attribute)
        if ref.member == "buffer":
            return getattr(obj, "_buffers", {}).get(ref.attribute)
        return obj

    def _known(self, wanted: int) -> Any:
        ref = self._by_id.get(wanted)
        return None if ref is None else ref()

    def find(self, frame: ModuleFrame) -> torch.nn.Module | None:
        """The instance behind an ``nn_module_stack`` entry, or None (never an instance of another class)."""
        wanted = frame.instance_id
        if wanted is None or not isinstance(frame.cls, type):
            return None
        module = self._known(wanted)
        if module is None:
            ref = parse_source(frame.source)
            candidate = self.resolve(ref) if ref is not None else None
            if candidate is not None and id(candidate) == wanted:
                module = candidate
                self._by_id[wanted] = weakref.ref(candidate)
        if module is None and frame.cls not in self._scanned:
            self._scanned.add(frame.cls)
            self.heap_scans += 1
            for obj in heap_instances([frame.cls]):
                self._by_id.setdefault(id(obj), weakref.ref(obj))
            module = self._known(wanted)
        return module if module is not None and type(module) is frame.cls else None

    def instances(self, classes: tuple[type, ...]) -> list[torch.nn.Module]:
        """Every live instance of ``classes`` (one heap walk, for the few questions no path answers)."""
        self.heap_scans += 1
        return heap_instances(classes)


# the lookup of the frame compile in progress: DDP's split graphs (one backend call each) reuse it
_CURRENT: tuple[weakref.ref, tuple[weakref.ref, ...], ModuleLookup] | None = None


def module_lookup() -> ModuleLookup:
    """The :class:`ModuleLookup` of the frame compile in progress (shared by all its graphs), which
    indexes the models :func:`known_modules` names first."""
    global _CURRENT
    roots = module_roots()
    frame = compiling_translator()
    if frame is not None and _CURRENT is not None:
        current, current_roots, lookup = _CURRENT
        if current() is frame and [r() for r in current_roots] == list(roots):
            return lookup
    lookup = ModuleLookup(roots, frame)
    _CURRENT = None if frame is None else (weakref.ref(frame), tuple(weakref.ref(r) for r in roots), lookup)
    return lookup


_ROOTS: contextvars.ContextVar[tuple[torch.nn.Module, ...]] = contextvars.ContextVar("twinkle_fx_module_roots", default=())


def module_roots() -> tuple[torch.nn.Module, ...]:
    """Models known to be compiled in this context (set by :func:`twinkle_fx.explain`)."""
    return _ROOTS.get()


@contextlib.contextmanager
def known_modules(*roots: torch.nn.Module) -> Iterator[None]:
    """Tell the backend which models it compiles (the module lookup indexes them first)."""
    token = _ROOTS.set(_ROOTS.get() + roots)
    try:
        yield
    finally:
        _ROOTS.reset(token)
