"""Verify mode: the first call of a swapped layer or function (per input signature) also runs the
reference and compares outputs, and in training the gradients, with dtype-aware tolerances.

A kernel that disagrees is never silently kept: the mismatch is logged with its maximum error and
the reference takes over (or :class:`~twinkle_fx.errors.KernelVerificationError` is raised when
``use_fallback=False``). Every check is recorded as a :class:`Verification`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import KernelVerificationError

logger = logging.getLogger(__name__)

__all__ = ["Verification", "Verifier", "TOLERANCES"]

# (atol, rtol) per dtype: a kernel may round differently from PyTorch, but not by more than a few
# ulps of the dtype at the magnitudes seen in transformer activations.
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.bfloat16: (3e-2, 3e-2),
    torch.float16: (5e-3, 5e-3),
}


@dataclass(frozen=True)
class Verification:
    """One comparison of a kernel with its reference."""

    target: str
    kernel: str
    signature: str
    what: str  # "output" or "gradients"
    max_error: float
    passed: bool

    def __str__(self) -> str:
        verdict = "ok" if self.passed else "MISMATCH"
        return f"{self.target} -> {self.kernel} [{self.signature}] {self.what}: max error {self.max_error:.3g} {verdict}"


def _signature(args: tuple, kwargs: dict) -> str:
    parts = []
    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor):
            parts.append(f"{str(leaf.dtype).removeprefix('torch.')}{list(leaf.shape)}@{leaf.device.type}")
    return ", ".join(parts) + ("; grad" if torch.is_grad_enabled() else "")


def _max_error(ours: Any, reference: Any) -> tuple[float, bool]:
    """Largest absolute difference over the tensors of two results, and whether all are within tolerance."""
    ours_leaves, reference_leaves = pytree.tree_leaves(ours), pytree.tree_leaves(reference)
    if len(ours_leaves) != len(reference_leaves):
        return float("inf"), False
    worst, passed = 0.0, True
    for a, b in zip(ours_leaves, reference_leaves):
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            if (a is None) != (b is None):
                return float("inf"), False
            continue
        if a.shape != b.shape:
            return float("inf"), False
        if a.numel() == 0:
            continue
        a64, b64 = a.detach().double(), b.detach().double()
        atol, rtol = TOLERANCES.get(b.dtype, TOLERANCES[torch.float32])
        error = (a64 - b64).abs()
        worst = max(worst, error.max().item())
        passed = passed and bool((error <= atol + rtol * b64.abs()).all()) and bool(torch.isfinite(a64).eq(torch.isfinite(b64)).all())
    return worst, passed


def _gradients(outputs: Any, wrt: list[torch.Tensor], cotangents: list[torch.Tensor]) -> list[torch.Tensor | None]:
    tensors = [t for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    return list(torch.autograd.grad(tensors, wrt, cotangents, retain_graph=True, allow_unused=True))


class Verifier:
    """Checks one swapped target against its reference on the first call of each input signature."""

    def __init__(self, target: str, kernel: str, *, use_fallback: bool) -> None:
        self.target = target
        self.kernel = kernel
        self.use_fallback = use_fallback
        self.results: list[Verification] = []
        self.failed = False
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def needs_check(self, args: tuple, kwargs: dict) -> str | None:
        """The signature to check, or None when it was checked already (or tracing is under way)."""
        if torch.compiler.is_compiling():
            return None
        signature = _signature(args, kwargs)
        with self._lock:
            if signature in self._seen:
                return None
            self._seen.add(signature)
        return signature

    def check(
        self,
        signature: str,
        run_kernel: Callable[[], Any],
        run_reference: Callable[[], Any],
        parameters: list[torch.Tensor],
        inputs: tuple,
    ) -> tuple[Any, bool]:
        """Run both; returns ``(result to use, kernel passed)``. Raises on mismatch without fallback."""
        ours = run_kernel()
        reference = run_reference()
        error, passed = _max_error(ours, reference)
        self._record(signature, "output", error, passed)
        if passed and torch.is_grad_enabled():
            outputs = [t for t in pytree.tree_leaves(ours) if isinstance(t, torch.Tensor) and t.requires_grad]
            if outputs:
                wrt = parameters + [t for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
                if wrt:
                    cotangents = [torch.randn_like(t) for t in outputs]
                    error, passed = _max_error(_gradients(ours, wrt, cotangents), _gradients(reference, wrt, cotangents))
                    self._record(signature, "gradients", error, passed)
        if passed:
            return ours, True
        self.failed = True
        message = (f"verify: {self.target} -> {self.kernel} differs from the reference on [{signature}] "
                   f"(max error {error:.3g})")
        if not self.use_fallback:
            raise KernelVerificationError(message + " (use_fallback=False)")
        logger.warning("twinkle_fx: %s; using the reference from now on", message)
        return reference, False

    def _record(self, signature: str, what: str, error: float, passed: bool) -> None:
        verification = Verification(self.target, self.kernel, signature, what, error, passed)
        with self._lock:
            self.results.append(verification)
        logger.info("twinkle_fx: verified %s", verification)
