"""Several models compiled by Inductor one after the other in one process.

A user compiling a second model used to hit ``NameError: name '_grid_0' is not defined`` in the code
Inductor generates for our user Triton kernels (``triton_op``) once other compile tests had run in the
same process. Inductor code for our kernels exists only on a GPU, so this is a GPU test; it compiles
two families (different shapes, different kernel sets) twice each, with and without a Dynamo reset in
between, and checks every step against eager.
"""

import pytest
import torch
from tiny_models import input_ids, register_qwen2_kernels, tiny

from twinkle_fx import register_external_layer

pytestmark = pytest.mark.gpu


def _step(model, ids, compiled=None):
    out = (model if compiled is None else compiled)(ids, labels=ids)
    grads = torch.autograd.grad(out.loss, list(model.parameters()))
    return out.loss.detach(), grads


@pytest.mark.parametrize("reset_between", [False, True], ids=["no-reset", "reset"])
def test_models_compiled_one_after_the_other_match_eager(reset_between):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    register_qwen2_kernels()
    register_external_layer(LlamaRMSNorm, "RMSNorm")
    for family in ("qwen2", "llama", "qwen2"):
        if reset_between:
            torch.compiler.reset()
        model = tiny(family)
        ids = input_ids(2, 12)
        compiled = torch.compile(model, backend="twinkle", options={"compiler": "inductor"})
        loss, grads = _step(model, ids, compiled)
        want_loss, want_grads = _step(model, ids)
        torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=1e-5, msg=family)
        for got, want in zip(grads, want_grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=family)
