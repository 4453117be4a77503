"""Calls of registered functions that no rewrite swapped, reported with the reason.

Inlined calls leave only their stack trace (file, line and name of every frame,
:func:`~..dynamo_internals.stack_frames`), so a node belongs to a call of ``module.func`` when one
of its frames is ``func`` in that module's file. The pattern pass swaps these calls (and copies of
the function elsewhere); this pass reports each call it did not take, so a registration that
never fires is visible, and each copy (a function of the same name in another module: each
transformers family has its own ``apply_rotary_pos_emb``) whose computation the pattern did not
match, labelled with the copy's own name (GLM4's interleaved and GPT-OSS's chunked rotary compute
something else than Qwen2's).
"""

from __future__ import annotations

import inspect
import sys

import torch.fx as fx

from ...core.swaps import patched_functions
from ..graph.dynamo import module_stack, stack_frames
from ..pipeline import Kept, Outcome, PassState
from ...core.reasons import Reason, ReasonKind
from .function_patterns import region_location, registered_patterns

__all__ = ["run", "function_call_regions"]


def function_call_regions(state: PassState, target: str, *, copies: bool = False) -> dict[tuple, list[fx.Node]]:
    """Nodes of each inlined call of ``target``, keyed by the call site (file of the function called,
    caller frames, module keys); with ``copies``, of same-named functions in other files instead."""
    module_name, _, func_name = target.rpartition(".")
    filename = getattr(sys.modules.get(module_name), "__file__", None)
    calls: dict[tuple, list[fx.Node]] = {}
    if filename is None:
        return calls
    for node in state.gm.graph.nodes:
        if node.op not in ("call_function", "call_method") or node in state.scratch.kernel_calls:
            continue
        site = _site(node, func_name, filename, copies)
        if site is not None:
            calls.setdefault(site, []).append(node)
    return calls


def _site(node: fx.Node, func_name: str, filename: str, copies: bool) -> tuple | None:
    """Which call of the function ``node`` belongs to: (its file, caller frames, module keys), or None."""
    frames = stack_frames(node)
    for depth, frame in enumerate(frames):
        if frame.name == func_name and (frame.filename != filename if copies else frame.filename == filename):
            return frame.filename, tuple(frames[:depth]), tuple(f.key for f in module_stack(node))
    return None


def _sites_taken(state: PassState, target: str, *, copies: bool) -> set[tuple]:
    """Call sites of ``target`` (or its copies) the pattern pass matched: the rest of such a call (a
    partial rotary's slices and concatenation) is not reported as unmatched."""
    module_name, _, func_name = target.rpartition(".")
    filename = getattr(sys.modules.get(module_name), "__file__", None)
    if filename is None:
        return set()
    return {site for n in state.scratch.pattern_nodes if (site := _site(n, func_name, filename, copies)) is not None}


def _installed_kernel_files() -> set[str]:
    """Files of the kernels ``kernelize_model`` / ``apply_function_kernel`` patched in: a patched
    ``apply_rotary_pos_emb`` runs the kernel's own function of that name, which is no unmatched copy."""
    files = set()
    for target in patched_functions():
        module_name, _, func_name = target.rpartition(".")
        current = getattr(sys.modules.get(module_name), func_name, None)
        code = getattr(inspect.unwrap(current), "__code__", None) if callable(current) else None
        if code is not None:
            files.add(code.co_filename)
    return files


def _module_named_by_file(filename: str) -> str | None:
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == filename:
            return name
    return None


def _own_files(targets: list[str]) -> dict[str, str]:
    """Each target's module file (targets whose module was never imported have no call in any graph)."""
    files = {}
    for target in targets:
        filename = getattr(sys.modules.get(target.rpartition(".")[0]), "__file__", None)
        if filename is not None:
            files[target] = filename
    return files


def run(state: PassState) -> list[Outcome]:
    """One Kept outcome per call of a registered function that the pattern pass did not take."""
    registered = registered_patterns(state)
    missing, traced = registered.missing, registered.traced_through
    outcomes: list[Outcome] = []
    targets = state.registry.function_targets()
    own_files = _own_files(targets)
    # a function's file -> the registered targets defined there (a call in such a file is no copy to report)
    registered_files: dict[str, set[str]] = {}
    for target, filename in own_files.items():
        registered_files.setdefault(target.rpartition(".")[2], set()).add(filename)
    reported: set[tuple] = set()
    for target in targets:
        if own_files.get(target) not in traced.get(target.rpartition(".")[2], ()):
            continue  # no call of it in this graph: nothing to look for
        taken = _sites_taken(state, target, copies=False)
        for site, nodes in function_call_regions(state, target).items():
            _, callers, _ = site
            if site in taken:
                continue  # the pattern pass matched this call and reported it
            where = str(callers[-1]) if callers else nodes[0].name
            if target in missing:
                reason = Reason(ReasonKind.NO_PATTERN, missing[target])
            else:
                reason = Reason(ReasonKind.NOT_MATCHED, (
                    "its pattern did not match this call (traced differently here: other arguments, a "
                    "different code path, or part of it outside this graph)"))
            outcomes.append(Kept("function", target, where, reason))
    kernels = _installed_kernel_files()
    for target in targets:
        func_name = target.rpartition(".")[2]
        if target in missing or not traced.get(func_name, set()) - registered_files.get(func_name, set()) - kernels:
            continue  # every function of its name called here is registered itself, or a kernel
        taken = _sites_taken(state, target, copies=True)
        for site, nodes in function_call_regions(state, target, copies=True).items():
            filename, callers, _ = site
            copy = f"{_module_named_by_file(filename) or filename}.{target.rpartition('.')[2]}"
            if copy in targets or (copy, site) in reported or site in taken or filename in kernels:
                continue  # registered itself, matched (and reported) by the pattern pass, or a kernel itself
            reported.add((copy, site))
            where = region_location(nodes)
            outcomes.append(Kept("function", copy, where, Reason(ReasonKind.NOT_MATCHED, (
                f"a function of the same name as {target} computes something else here (its pattern did "
                "not match), so that kernel does not apply"))))
    return outcomes
