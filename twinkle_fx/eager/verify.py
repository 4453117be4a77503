"""Verify mode: the first call of a swapped layer or function (per input signature) also runs the
reference and compares outputs, and in training the gradients, with :func:`twinkle_fx.core.numerics.compare`
(the comparison compile-time verify uses too) and the tolerances of :mod:`twinkle_fx.core.tolerances`.

A kernel that disagrees is never silently kept: the mismatch is logged with what differed (values
and their maximum error, dtype, device, shape, output structure, a lost gradient, an input it
changed) and the reference takes over (or :class:`~twinkle_fx.core.errors.KernelVerificationError` is
raised when ``use_fallback=False``). Every check is recorded as a :class:`Verification`.

The kernel runs on copies of the input tensors and the reference on the caller's own, so an
in-place kernel cannot corrupt the reference and an in-place layer changes its input once.
State outside tensors (a KV-cache object, say) is shared by both runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..core.errors import KernelVerificationError
from ..core.numerics import compare
from ..core.torch_internals import tree_leaves, tree_map_only

logger = logging.getLogger(__name__)

__all__ = ["Verification", "Verifier"]

_COTANGENT_SEED = 0  # test gradients come from a private generator: the user's RNG stream is untouched


@dataclass(frozen=True)
class Verification:
    """One comparison of a kernel with its reference; ``detail`` says what differed."""

    target: str
    kernel: str
    signature: str
    what: str  # "output", "inputs" or "gradients"
    max_error: float
    passed: bool
    detail: str = ""

    def __str__(self) -> str:
        verdict = "ok" if self.passed else "MISMATCH"
        detail = f" ({self.detail})" if self.detail else ""
        return (f"{self.target} -> {self.kernel} [{self.signature}] {self.what}: max error {self.max_error:.3g} "
                f"{verdict}{detail}")


def _signature(args: tuple, kwargs: dict) -> str:
    parts = []
    for leaf in tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor):
            parts.append(f"{str(leaf.dtype).removeprefix('torch.')}{list(leaf.shape)}@{leaf.device.type}")
    return ", ".join(parts) + ("; grad" if torch.is_grad_enabled() else "")


def _cloned(tree: Any) -> Any:
    return tree_map_only(torch.Tensor, lambda t: t.clone(), tree)


def _cotangents(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    generators: dict[torch.device, torch.Generator] = {}
    cotangents = []
    for t in outputs:
        if t.device not in generators:
            generators[t.device] = torch.Generator(device=t.device).manual_seed(_COTANGENT_SEED)
        cotangents.append(torch.randn(t.shape, generator=generators[t.device], dtype=t.dtype, device=t.device))
    return cotangents


def _gradients(outputs: Any, wrt: list[torch.Tensor], cotangents: list[torch.Tensor]) -> list[torch.Tensor | None]:
    tensors = [t for t in tree_leaves(outputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    return list(torch.autograd.grad(tensors, wrt, cotangents, retain_graph=True, allow_unused=True))


class Verifier:
    """Checks one swapped target against its reference on the first call of each input signature.

    Copies and pickles keep the results and a rejection (``failed``), so a copied model never runs
    a kernel its original rejected.
    """

    def __init__(self, target: str, kernel: str, *, use_fallback: bool) -> None:
        self.target = target
        self.kernel = kernel
        self.use_fallback = use_fallback
        self.results: list[Verification] = []
        self.failed = False
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def needs_check(self, args: tuple, kwargs: dict) -> str | None:
        """The signature to check, or None when it was checked already."""
        signature = _signature(args, kwargs)
        with self._lock:
            if signature in self._seen:
                return None
            self._seen.add(signature)
        return signature

    def check(
        self,
        signature: str,
        run_kernel: Callable[..., Any],
        run_reference: Callable[..., Any],
        parameters: list[torch.Tensor],
        args: tuple,
        kwargs: dict,
    ) -> tuple[Any, bool]:
        """Run both on ``args``/``kwargs``; returns ``(result to use, kernel passed)``.

        Raises:
            KernelVerificationError: on a mismatch (or a kernel error) with ``use_fallback=False``.
        """
        kernel_inputs = _cloned((args, kwargs))
        try:
            ours = run_kernel(*kernel_inputs[0], **kernel_inputs[1])
        except Exception as e:
            reference = run_reference(*args, **kwargs)
            return self._reject(signature, "output", float("inf"), f"the kernel raised {type(e).__name__}: {e}",
                                reference, cause=e)
        reference = run_reference(*args, **kwargs)
        grad = torch.is_grad_enabled()
        error, problem = compare(ours, reference, check_grad=grad)
        self._record(signature, "output", error, problem)
        if problem is not None:
            return self._reject(signature, "output", error, problem, reference)
        error, problem = compare(kernel_inputs, (args, kwargs))
        if problem is not None:
            self._record(signature, "inputs", error, f"the kernel changed its inputs differently: {problem}")
            return self._reject(signature, "inputs", error, f"the kernel changed its inputs differently: {problem}",
                                reference)
        if grad:
            outputs = [t for t in tree_leaves(ours) if isinstance(t, torch.Tensor) and t.requires_grad]
            wrt = parameters + [t for t in tree_leaves((args, kwargs))
                                if isinstance(t, torch.Tensor) and t.requires_grad]
            if outputs and wrt:
                cotangents = _cotangents(outputs)
                error, problem = compare(_gradients(ours, wrt, cotangents), _gradients(reference, wrt, cotangents))
                self._record(signature, "gradients", error, problem)
                if problem is not None:
                    return self._reject(signature, "gradients", error, problem, reference)
        return ours, True

    def _reject(self, signature: str, what: str, error: float, problem: str, reference: Any,
                cause: BaseException | None = None) -> tuple[Any, bool]:
        if cause is not None:
            self._record(signature, what, error, problem)
        self.failed = True
        message = (f"verify: {self.target} -> {self.kernel} differs from the reference on [{signature}]: "
                   f"{what}: {problem} (max error {error:.3g})")
        if not self.use_fallback:
            raise KernelVerificationError(message + " (use_fallback=False)") from cause
        logger.warning("%s; using the reference from now on", message)
        return reference, False

    def _record(self, signature: str, what: str, error: float, problem: str | None) -> None:
        verification = Verification(self.target, self.kernel, signature, what, error, problem is None, problem or "")
        with self._lock:
            self.results.append(verification)
        logger.info("verified %s", verification)
