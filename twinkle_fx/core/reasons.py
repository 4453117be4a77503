"""Why a kernel was not used, as data: a :class:`ReasonKind` and the detail.

Both paths keep a module, a region or a call with a :class:`Reason`: the eager path's fallback log
and the compile report show ``str(reason)`` (the detail, which reads as a sentence), tools and tests
read ``reason.kind``. The kinds follow the path a candidate takes: selection, the module instance,
binding, the trial run of the kernel, the rewrite, and the compile-time checks after it (as
Lightning Thunder's ``SplitReason`` does for its splits). Most kinds are the compile backend's; the
first ones are also the eager path's (:mod:`.admission` decides them for both).

Examples:
    >>> reason = Reason(ReasonKind.SHAPE_GUARD, "the kernel returns float32[3, 32] where the region produces float32[3, 16]")
    >>> reason.kind.name, str(reason)[:23]
    ('SHAPE_GUARD', 'the kernel returns floa')
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["ReasonKind", "Reason"]


class ReasonKind(enum.Enum):
    """What kept a module or a region from its kernel (the value says it in words)."""

    # selection: no kernel for this target on this device and mode
    NO_KERNEL = "no kernel selected"
    SIGNATURE = "kernel signature differs from the original"
    DOES_NOT_APPLY = "the kernel does not apply to this instance"
    INFERENCE_ONLY = "inference-only kernel in training"
    SWAP_POLICY = "measured slower than Inductor's code"
    # the module instance
    INSTANCE_NOT_FOUND = "module instance not found"
    EAGER_SWAP = "already kernelized eagerly"
    FOREIGN_FORWARD = "forward replaced by another tool"
    COMPILED_ROOT = "the compiled module itself"
    # binding the region to the reference
    UNUSED_RESULT = "nothing reads the region's result"
    OUTSIDE_STATE = "reads state from outside the module"
    TOO_MANY_ARGUMENTS = "too many orderings to bind"
    DATA_DEPENDENT = "data-dependent shapes"
    CHECK_FAILED = "could not be checked on fake tensors"
    NOT_EQUIVALENT = "computes something else than the reference"
    # the kernel on the region's inputs
    KERNEL_FAILED = "the kernel fails on the region's inputs"
    SHAPE_GUARD = "output shapes or dtypes differ"
    NOT_WRAPPABLE = "cannot be wrapped as an opaque op"
    # the rewrite
    INTERLEAVED = "an output is read before the region ends"
    VERIFY_FAILED = "compile-time verify failed"
    PASS_FAILED = "the pass raised on this region"
    # regions that no rewrite saw
    GRAPH_BREAK = "a graph break split the region"
    BUCKET_SPLIT = "a DDP bucket boundary split the region"
    NO_PATTERN = "the function has no pattern"
    NOT_MATCHED = "the function's pattern did not match this call"


@dataclass(frozen=True)
class Reason:
    """Why a kernel was not used: ``kind`` for tools and tests, ``detail`` for people (``str(reason)``)."""

    kind: ReasonKind
    detail: str
    # the error behind KERNEL_FAILED / PASS_FAILED / CHECK_FAILED (not compared: equal reasons group in the report)
    exception: BaseException | None = field(default=None, compare=False, hash=False)

    def __str__(self) -> str:
        return self.detail
