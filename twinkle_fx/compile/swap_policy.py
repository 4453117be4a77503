"""Keep a swap only where it wins: a measured per-op, per-device decision table.

Inductor fuses the ops around a region (the residual add before an RMSNorm, the casts after it)
into the same kernel; a swapped region is a separate kernel that Inductor cannot fuse with. Where
the measurement below found the kernel slower than Inductor's own code for the same region at
that size, the backend keeps the region unswapped (``options={"swap_policy": "measured"}``) and the
report says why. The backend's default, ``swap_policy="always"``, swaps every region that can be;
``twinkle_fx.compile`` asks for ``"measured"`` in training, because swapping every region lost on a
whole training step (H100, torch 2.11, reference workload: 72.3 ms against Inductor's 40.1 on a
host-bound machine, 1,339 kernels a step to Inductor's 1,171; see ``one_call.py``). The "measured"
step itself was not timed end to end yet.
Only under Inductor (the comparison is with its code): other inner compilers swap every region.

The size of a region is the number of rows of its first tensor argument (its numel over its last
dimension: tokens for a norm or an MLP; batch x heads x tokens for rotary's q).

How the table was measured: ``python -m twinkle_fx.bench.swap_table`` (committed), each op's
twinkle kernel against ``torch.compile`` of its ``<op>_reference`` at the rows of decode (32),
prefill (2048) and a training step (4096), both replayed from CUDA graphs so launch overhead is
out, forward for inference and forward + backward for training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.modes import Mode

__all__ = ["Decision", "DECISIONS", "keep_inductor_reason"]


@dataclass(frozen=True)
class Decision:
    """Keep Inductor's code for ``kernel`` on ``device`` in ``phase`` when the region has at most
    ``max_rows`` rows (``None``: no upper bound) and at least ``min_rows``; ``measured`` says what
    the decision rests on."""

    kernel: str
    device: str
    phase: str  # "inference" or "training"
    max_rows: int | None
    measured: str
    min_rows: int = 0

    def applies(self, kernel: str, device: str, phase: str, rows: int) -> bool:
        # a function kernel is named by its target ("transformers....modeling_qwen2.apply_rotary_pos_emb")
        kernel = kernel.rsplit(".", 1)[-1]
        return (self.kernel, self.device, self.phase) == (kernel, device, phase) and (
            self.min_rows <= rows and (self.max_rows is None or rows <= self.max_rows)
        )

    def size(self) -> str:
        if self.max_rows is None:
            return "any size" if self.min_rows == 0 else f">= {self.min_rows} rows"
        return f"<= {self.max_rows} rows" if self.min_rows == 0 else f"{self.min_rows}-{self.max_rows} rows"


# Measured on one H100 80GB HBM3, torch 2.11, triton 3.6, bf16, Qwen2-0.5B shapes, by
# ``python -m twinkle_fx.bench.swap_table``; twinkle's speed-up
# over Inductor's code for the op's reference, both replayed from CUDA graphs. A swap is kept only where
# it wins by at least 2%; the row bounds sit between the measured sizes (32, 2048, 4096 tokens).
# apply_rotary_pos_emb wins everywhere (1.22-1.96x) and is always swapped.
DECISIONS: tuple[Decision, ...] = (
    Decision("RMSNorm", "cuda", "training", None, "fwd+bwd 0.86x at 2048 rows, 0.97x at 4096"),
    Decision("RMSNorm", "cuda", "inference", 512, "fwd 0.99x at 32 rows (1.04x at 2048, 1.01x at 4096)"),
    Decision("SwiGLUMLP", "cuda", "training", None, "silu_mul fwd+bwd 0.98x at 2048 rows, 0.97x at 4096"),
    Decision("SwiGLUMLP", "cuda", "inference", None, "silu_mul fwd 0.99x at 2048 rows, 0.97x at 4096 "
             "(1.18x at 32)", min_rows=512),
)

def _rows(value: object) -> int | None:
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return None
    return value.numel() // max(int(value.shape[-1]), 1)


def keep_inductor_reason(policy: str, kernel: str, device: str, mode: Mode, first_arg: object,
                         table: tuple[Decision, ...] | None = None) -> str | None:
    """Why Inductor's code is kept for a region of ``kernel`` under ``policy`` (None: swap it).

    ``policy`` is the graph's ``BackendOptions.applied_swap_policy``: only "measured" keeps anything.

    Examples:
        >>> table = (Decision("RMSNorm", "cuda", "inference", 64, "0.8x at 32 rows"),)
        >>> keep_inductor_reason("measured", "RMSNorm", "cuda", Mode.INFERENCE, torch.empty(32, 896), table)
        "kept Inductor's code: RMSNorm was measured slower than Inductor at <= 64 rows on cuda in inference (0.8x at 32 rows); swap_policy='always' swaps it"
    """
    if policy != "measured":
        return None
    rows = _rows(first_arg)
    if rows is None:
        return None
    phase = "training" if Mode.TRAINING in mode else "inference"
    for decision in DECISIONS if table is None else table:
        if decision.applies(kernel, device, phase, rows):
            size = decision.size()
            return (f"kept Inductor's code: {kernel.rsplit('.', 1)[-1]} was measured slower than Inductor at {size} on {device} in "
                    f"{phase} ({decision.measured}); swap_policy='always' swaps it")
    return None
