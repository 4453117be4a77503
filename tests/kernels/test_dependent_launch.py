"""Programmatic dependent launches: which launches ask for one, and which GEMVs read their weights before the wait
(a plain tensor never does: the kernel just before may have written it)."""

import importlib

import pytest
import torch
import twinkle_triton as tt
from twinkle_triton import _dependent_launch

gemv_module = importlib.import_module("twinkle_triton.gemv")


def _parameter(t):
    return torch.nn.Parameter(t, requires_grad=False)


def test_no_dependent_launch_on_the_cpu_or_when_disabled(monkeypatch):
    assert _dependent_launch.launch_options(torch.zeros(1, device="cpu")) == {"PDL": False}
    monkeypatch.setattr(_dependent_launch, "ENABLED", False)
    assert _dependent_launch.launch_options(torch.zeros(1)) == {"PDL": False}


@pytest.mark.parametrize("kinds,prefetch", [(("parameter",), True), (("parameter", "parameter"), True),
                                            (("tensor",), False), (("parameter", "tensor"), False)])
def test_gemv_reads_its_weights_before_the_wait_only_when_all_are_parameters(monkeypatch, kinds, prefetch):
    monkeypatch.setattr(gemv_module, "launch_options", lambda x: {"PDL": True, "launch_pdl": True})
    weights = [_parameter(torch.randn(8, 16)) if kind == "parameter" else torch.randn(8, 16) for kind in kinds]
    assert gemv_module._launch_options(torch.randn(1, 16), weights) == \
        {"PDL": True, "launch_pdl": True, "PREFETCH": prefetch}


def test_a_plain_launch_never_reads_before_a_wait(monkeypatch):
    monkeypatch.setattr(_dependent_launch, "ENABLED", False)
    w = _parameter(torch.randn(8, 16))
    x = torch.randn(1, 16)
    assert gemv_module._launch_options(x, [w]) == {"PDL": False, "PREFETCH": False}
    torch.testing.assert_close(tt.gemv(x, [w]), x @ w.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_compiled_model_hands_the_gemv_its_parameters(monkeypatch, backend):
    """The weights-first read needs the weights to arrive as parameters; a compiled graph passes them on as such."""
    seen = []
    real = gemv_module._launch_options

    def recording(x, weights):
        seen.append([isinstance(w, torch.nn.Parameter) for w in weights])
        return real(x, weights)

    monkeypatch.setattr(gemv_module, "_launch_options", recording)
    linear = torch.nn.Linear(16, 8, bias=False)
    with torch.no_grad():
        torch._dynamo.reset()
        torch.compile(lambda x: tt.gemv(x, [linear.weight]), backend=backend)(torch.randn(1, 16))
    assert seen == [[True]]
