"""What a benchmark run produces: one row per backend (model) or per op x phase x implementation
(micro), plus the workload and the environment; JSON in and out, so a run from a GPU machine can be
re-rendered elsewhere (``twinkle-fx bench --plot results.json``)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ModelRow", "MicroRow", "InferenceRow", "BenchResult", "STATUSES"]

# ok: measured and agrees with eager; wrong: measured but its loss/outputs disagree with eager;
# failed: raised (error says what); unavailable: a package or twinkle_fx piece is missing here.
STATUSES = ("ok", "wrong", "failed", "unavailable")


@dataclass
class ModelRow:
    """One backend on the end-to-end training step. Memory fields are None on the CPU."""

    backend: str
    status: str = "ok"
    error: str | None = None
    traceback: str | None = None
    tokens_per_s: float | None = None
    ms_per_step: float | None = None  # mean over the timed steps
    median_ms: float | None = None
    step_ms: list[float] = field(default_factory=list)
    # host time of a step with the device running behind (median of a few steps): close to
    # ms_per_step when the host is the bottleneck
    host_ms: float | None = None
    peak_gib: float | None = None  # allocator peak over the timed steps
    # reserved by the allocator at its peak: what the device gave up, CUDA-graph pools included (their
    # replays allocate nothing, so peak_gib misses the activations a graph writes)
    peak_reserved_gib: float | None = None
    first_step_peak_gib: float | None = None
    resident_gib: float | None = None  # allocated before the first step (weights, inputs)
    first_step_s: float | None = None  # first call, compilation included (host clock)
    first_loss: float | None = None
    # the loss of a step after the timed ones (same weights, same batch: should equal first_loss); for
    # CUDA-graphed rows it comes from a replay, first_loss from the un-graphed warm-up run
    last_loss: float | None = None
    loss_check: str | None = None  # how first_loss compares with eager's, and last_loss with first_loss
    vs_eager: dict[str, float] = field(default_factory=dict)  # throughput / memory ratios
    vs_inductor: dict[str, float] = field(default_factory=dict)  # + first_step
    vs_reference: dict[str, float] = field(default_factory=dict)  # bench --matrix: to the model's first backend
    notes: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        if self.status in ("failed", "unavailable"):
            return f"{self.backend}: {self.status}: {self.error}"
        memory = "n/a" if self.peak_gib is None else f"{self.peak_gib:.2f} GiB"
        host = "" if self.host_ms is None else f", host {self.host_ms:.1f} ms"
        text = (f"{self.backend}: {self.tokens_per_s:,.0f} tok/s ({self.ms_per_step:.1f} ms/step{host}), peak {memory}, "
                f"first step {self.first_step_s:.1f} s, loss {self.first_loss:.5f}")
        return text + (f"  WRONG: {self.loss_check}" if self.status == "wrong" else "")


@dataclass
class MicroRow:
    """One implementation of one op in one phase ("fwd" or "fwd+bwd")."""

    op: str
    phase: str
    impl: str  # eager (the op's _reference), inductor (torch.compile of it), twinkle, liger; or "copy"
    shape: str
    status: str = "ok"
    error: str | None = None
    traceback: str | None = None
    ms: float | None = None  # median
    bytes_moved: int | None = None  # the minimum the op must read and write
    gbps: float | None = None
    copy_fraction: float | None = None  # gbps / device-to-device copy GB/s of the same run
    flops: int | None = None  # for the matmul-bound op (fused linear cross-entropy)
    tflops: float | None = None
    extra_gib: float | None = None  # peak allocated above what existed before the call
    # host time per call, device unsynchronised (bench.timing.host_us): fwd row: a forward without
    # grad; fwd+bwd row: a forward recording autograd plus a backward, the backward's share in
    # host_bwd_us (per node of one autograd.grad over several forwards: no per-call engine cost)
    host_us: float | None = None
    host_bwd_us: float | None = None
    max_rel_error: float | None = None  # vs eager: max over outputs and gradients of |a-b|/|b|
    vs_eager: float | None = None  # speed-up (eager ms / this ms)
    vs_inductor: float | None = None
    # GPU: the call's kernels alone per call (bench.timing.kernel_ms), what a CUDA-graphed step pays, and the
    # speed-up it gives over Inductor's kernels; ms above also holds any wait for the host to launch them
    kernel_ms: float | None = None
    kernel_vs_inductor: float | None = None

    def __str__(self) -> str:
        head = f"{self.op} {self.phase} {self.impl}"
        if self.status in ("failed", "unavailable"):
            return f"{head}: {self.status}: {self.error}"
        rate = (f"{self.gbps:,.0f} GB/s" if self.gbps is not None
                else f"{self.tflops:.1f} TFLOP/s" if self.tflops is not None else "")
        text = f"{head}: {self.ms:.3f} ms {rate}".rstrip()
        if self.kernel_ms is not None:
            text += f", kernels {self.kernel_ms:.3f} ms"
        if self.host_us is not None:
            text += f", host {self.host_us:.1f} us" + (f" (bwd {self.host_bwd_us:.1f})" if self.host_bwd_us is not None else "")
        return text + (f"  WRONG (rel. error {self.max_rel_error:.2e})" if self.status == "wrong" else "")


@dataclass
class BenchResult:
    """A whole run: ``kind`` is "model" or "micro"."""

    kind: str
    environment: dict[str, Any]
    workload: dict[str, Any]
    rows: list[Any]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "environment": self.environment, "workload": self.workload,
                "rows": [dataclasses.asdict(row) for row in self.rows]}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> "BenchResult":
        data = json.loads(Path(path).read_text())
        row_type = {"model": ModelRow, "micro": MicroRow, "inference": InferenceRow}.get(data.get("kind"))
        if row_type is None:
            raise ValueError(f"{path}: not a twinkle-fx bench result (kind={data.get('kind')!r}).")
        return cls(data["kind"], data["environment"], data["workload"], [row_type(**row) for row in data["rows"]])


@dataclass
class InferenceRow:
    """One backend on the inference workload (``twinkle-fx bench --inference``): prefill latency and
    decode throughput; ``vs[base]`` holds speed-ups over the ``base`` row (inductor,
    inductor+cudagraphs) and the first-call time ratio."""

    backend: str
    status: str = "ok"
    error: str | None = None
    traceback: str | None = None
    prefill_ms: float | None = None  # median
    prefill_tokens_per_s: float | None = None
    prefill_first_s: float | None = None  # first call, compilation included (host clock)
    decode_ms: float | None = None  # median, one step of the whole decode batch
    decode_tokens_per_s: float | None = None
    decode_first_s: float | None = None
    prefill_rel_error: float | None = None  # last-position logits vs eager, relative L2
    decode_rel_error: float | None = None
    vs: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        if self.status in ("failed", "unavailable"):
            return f"{self.backend}: {self.status}: {self.error}"
        text = (f"{self.backend}: prefill {self.prefill_ms:.3f} ms ({self.prefill_first_s:.1f} s first), decode "
                f"{self.decode_ms:.3f} ms/step = {self.decode_tokens_per_s:,.0f} tok/s ({self.decode_first_s:.1f} s first)")
        return text + ("  WRONG" if self.status == "wrong" else "")
