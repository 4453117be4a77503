"""Ops called on tensors of a device Triton has no backend for (the CPU without TRITON_INTERPRET=1)
run their PyTorch references, and say so once in a logging WARNING.

Triton reads TRITON_INTERPRET when the kernels are defined, at import, and the test session has it
set (or runs on a GPU): the calls run in a fresh Python process without it, on CPU tensors.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import twinkle_triton

# The custom-kernel quick start's "Using the kernels directly" block (device "cpu"), then the fused
# loss forward and backward with each strategy and a compiled call; prints one JSON line.
SCRIPT = r"""
import json, logging
import torch

records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger("twinkle_triton").addHandler(handler)

import twinkle_triton as tt
from twinkle_triton import fused_add_gelu, element_wise_mul_add

x = torch.randn(16, 128, 4096, device="cpu")
bias = torch.randn(4096, device="cpu")
output = fused_add_gelu(x, bias)
a = torch.randn(16, 128, 4096, device="cpu")
b = torch.randn(16, 128, 4096, device="cpu")
c = torch.randn(16, 128, 4096, device="cpu")
result = element_wise_mul_add(a, b, c)  # a * b + c

report = {
    "fused_add_gelu": torch.equal(output, torch.nn.functional.gelu(x + bias)),
    "element_wise_mul_add": torch.equal(result, a * b + c),
}
hidden = torch.randn(2, 5, 16, requires_grad=True)
weight = torch.randn(40, 16, requires_grad=True)
labels = torch.randint(0, 40, (2, 5))
labels[0, 1] = -100
want = tt.fused_linear_cross_entropy_reference(hidden, weight, labels)
want_grads = torch.autograd.grad(want, (hidden, weight))
for strategy in ("chunked", "vocab_chunked", "tiled"):
    loss = tt.fused_linear_cross_entropy(hidden, weight, labels, strategy=strategy)
    grads = torch.autograd.grad(loss, (hidden, weight))
    report[strategy] = torch.equal(loss, want) and all(map(torch.equal, grads, want_grads))
h, w = torch.randn(3, 24), torch.randn(24)
compiled = torch.compile(tt.rms_norm, backend="aot_eager", fullgraph=True)
report["compiled rms_norm"] = torch.allclose(compiled(h, w, 1e-6), tt.rms_norm_reference(h, w, 1e-6))
report["warnings"] = [r.getMessage() for r in records if r.levelno == logging.WARNING]
print(json.dumps(report))
"""


def test_quickstart_calls_run_their_references_on_a_plain_cpu_and_warn_once():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    kernels_root = str(Path(twinkle_triton.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (kernels_root, env.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    warnings = report.pop("warnings")
    assert report == dict.fromkeys(report, True), report
    assert len(warnings) == 1, warnings
    assert "no backend for cpu tensors" in warnings[0] and "TRITON_INTERPRET=1" in warnings[0], warnings[0]
