"""How Dynamo cut and nested a graph: the graph break that ended it, the frame being compiled, and the
activation-checkpoint bodies inside it.

As for :mod:`.dynamo`, none of these is a public torch API and each has a test
(``tests/compile/test_dynamo_internals.py``); the private names (Dynamo's counters, the checkpoint
operator, the compiling frame) come from :mod:`twinkle_fx.core.torch_internals`:

- ``gm.compile_subgraph_reason``: why the graph ended, and the user stack at a graph break
  (:func:`graph_break`);
- ``torch.ops.higher_order.tag_activation_checkpoint(body, *operands, ...)``: how Dynamo records a
  ``torch.utils.checkpoint`` call, the checkpointed code in the submodule ``body``
  (:func:`checkpoint_bodies`, :func:`detach_checkpoint_bodies`).
"""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from ...core.caches import owns_cache
from ...core.torch_internals import checkpoint_operator, compiling_translator, dynamo_graph_break_counts
from .dynamo import Frame

__all__ = ["GraphBreak", "graph_break", "graph_breaks_counted", "compiled_code", "CheckpointBody", "checkpoint_bodies",
           "detach_checkpoint_bodies"]


# --- graph breaks -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphBreak:
    """Why Dynamo ended a graph early: its own words (first line) and the user stack, outer to inner."""

    reason: str
    user_stack: tuple[Frame, ...]

    def __str__(self) -> str:
        where = str(self.user_stack[-1]) if self.user_stack else "unknown location"
        return f"{self.reason} ({where})"


def graph_break(gm: fx.GraphModule, counted: list[str] | None = None) -> GraphBreak | None:
    """The graph break that ended ``gm``, or None when it ended normally (or is not Dynamo's).

    Where Dynamo compiled up to a checkpoint it records only "step_unsupported"; the break it hit
    is then the last one it counted before this graph (``counted``, from
    :func:`graph_breaks_counted`), and that is the reason given.
    """
    reason = getattr(gm, "compile_subgraph_reason", None)
    if reason is None or not getattr(reason, "graph_break", False):
        return None
    text = str(getattr(reason, "reason", "") or "").strip()
    if text == "step_unsupported" and counted:
        text = counted[-1].strip()
    stack = tuple(Frame(f.filename, f.lineno, f.name) for f in getattr(reason, "user_stack", None) or ())
    return GraphBreak(text.splitlines()[0] if text else "?", stack)


_COUNTED_BREAKS: dict[str, int] = {}


def _forget_counted_breaks() -> None:
    """Take Dynamo's graph-break counters as they are now as seen: a reset must not make every
    break counted before it look new to the next compile."""
    global _COUNTED_BREAKS
    _COUNTED_BREAKS = dynamo_graph_break_counts()


owns_cache(__name__, _forget_counted_breaks)


def graph_breaks_counted() -> list[str]:
    """First lines of the graph breaks Dynamo counted since the previous call (oldest first)."""
    global _COUNTED_BREAKS
    now = dynamo_graph_break_counts()
    if any(now.get(message, 0) < count for message, count in _COUNTED_BREAKS.items()):
        _COUNTED_BREAKS = {}  # the counters were cleared (torch.compiler.reset())
    new = [message for message, count in now.items() if count > _COUNTED_BREAKS.get(message, 0)]
    _COUNTED_BREAKS = now
    return [message.strip().splitlines()[0] for message in new if message.strip()]


def compiled_code() -> types.CodeType | None:
    """The code object of the frame being compiled (a ``forward``, or Dynamo's resume function
    for the rest of one after a graph break: same file, lines inside it); None outside a compile."""
    frame = compiling_translator()
    code = getattr(frame, "f_code", None)
    return code if isinstance(code, types.CodeType) else None


# --- activation checkpointing ----------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointBody:
    """One ``torch.utils.checkpoint`` call in a graph (transformers >= 5.23 checkpoints inside every
    decoder layer's ``forward`` once gradient checkpointing is on).

    Dynamo records it as ``tag_activation_checkpoint(body, *operands, use_reentrant=False, ...)``:
    the checkpointed code is the submodule ``body``, whose placeholders take ``operands`` in order.
    AOTAutograd traces through the call under a policy that marks every op of the body for
    recompute, and a plain ``eager`` inner compiler runs it through ``torch.utils.checkpoint``:
    rewriting inside ``body`` keeps the checkpointing either way.
    """

    call: fx.Node  # the higher-order op call in the outer graph
    attribute: str  # the name under which the outer graph module holds ``body``
    body: fx.GraphModule
    operands: tuple[Any, ...]  # what the call passes to the body's placeholders, in order (outer nodes)

    @property
    def inputs(self) -> dict[fx.Node, Any]:
        """Each placeholder of the body -> the value of the outer graph passed to it."""
        placeholders = [n for n in self.body.graph.nodes if n.op == "placeholder"]
        return dict(zip(placeholders, self.operands))


def _is_checkpoint_call(node: fx.Node) -> bool:
    checkpoint = checkpoint_operator()  # None on a torch that records no checkpoint this way
    return checkpoint is not None and node.op == "call_function" and node.target is checkpoint


def checkpoint_bodies(gm: fx.GraphModule) -> list[CheckpointBody]:
    """The activation-checkpoint calls of ``gm``'s graph (not those nested in their bodies), in graph order."""
    found = []
    for node in gm.graph.nodes:
        if not _is_checkpoint_call(node) or not node.args:
            continue
        getter = node.args[0]
        if not isinstance(getter, fx.Node) or getter.op != "get_attr" or not isinstance(getter.target, str):
            continue
        body = getattr(gm, getter.target, None)
        if isinstance(body, fx.GraphModule):
            found.append(CheckpointBody(node, getter.target, body, tuple(node.args[1:])))
    return found


def detach_checkpoint_bodies(gm: fx.GraphModule) -> None:
    """Give ``gm`` its own copy of each checkpoint body (nested ones included) before a rewrite.

    A copy of the outer graph (``verify``'s reference, the graph without swaps that runs when a
    lifted float differs) shares its submodules with ``gm``: rewritten in place, a body would be
    rewritten in the reference too. The copy keeps the body's ``meta`` (a selective-checkpoint
    policy, ``_checkpoint_context_fn``, lives there).
    """
    for found in checkpoint_bodies(gm):
        body = fx.GraphModule(found.body, copy.deepcopy(found.body.graph))
        body.meta = dict(found.body.meta)
        setattr(gm, found.attribute, body)
        detach_checkpoint_bodies(body)
