"""kernelize_model(..., cuda_graphs=True): decoder layers replayed from CUDA graphs, forward and backward."""

import copy
import logging

import pytest
import torch
import transformers

from twinkle_fx import kernelize_model, kernelized, undo_kernelize
from twinkle_fx.builtin import use_builtin_kernels
from twinkle_fx.eager.graphs import graph_status
from twinkle_fx.eager.layers import swapped_forward


def _tiny_qwen2(device: str, layers: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64, use_cache=False)
    return transformers.AutoModelForCausalLM.from_config(config).to(device)


@pytest.mark.interpreter  # the CPU run: nothing to graph there
def test_cuda_graphs_decline_on_the_cpu_with_the_reason(device, caplog):
    use_builtin_kernels(devices=(device,), models=("qwen2",), decoder_layers=True)
    model = _tiny_qwen2(device, layers=1)
    with caplog.at_level(logging.WARNING, logger="twinkle_fx.eager.kernelize"):
        kernelize_model(model, mode="train", cuda_graphs=True)
    assert "CUDA graphs need a CUDA device" in caplog.text and "Qwen2ForCausalLM is on cpu" in caplog.text
    assert graph_status(model) is None  # the kernels are swapped, nothing is graphed
    assert swapped_forward(model.model.layers[0]).kernel_name == "DecoderLayer"
    undo_kernelize(model)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"mode": "train+compile"}, ValueError, 'for eager models; under torch.compile use mode="reduce-overhead"'),
    ({"mode": "train", "verify": True}, ValueError, "cuda_graphs=True and verify=True do not combine"),
])
def test_cuda_graphs_option_errors(kwargs, error, match, device):
    model = _tiny_qwen2(device, layers=1)
    with pytest.raises(error, match=match):
        kernelize_model(model, cuda_graphs=True, **kwargs)
    with pytest.raises(error, match=match):
        with kernelized(model, cuda_graphs=True, **kwargs):
            pass
    with pytest.raises(TypeError, match="cuda_graphs"):
        kernelize_model(model, mode="train", cuda_graphs="yes")
    with pytest.raises(ValueError, match="needs a model"):
        kernelize_model(None, mode="train", cuda_graphs=True)


def _step(model, ids, zero=True):
    if zero:
        model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach()


def _assert_same_grads(graphed, reference, tol=2e-5):
    for (name, p), (_, q) in zip(graphed.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=tol, rtol=tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.gpu  # CUDA graphs
def test_graphed_training_equals_the_kernelized_model():
    """Losses and gradients over steps with optimizer updates in between (the graphs read the
    parameters in place), gradient accumulation (a .grad that is the graph's buffer), a second
    forward before the backward (eager, and the backward order kept), a new shape, and no-grad eval."""
    use_builtin_kernels(devices=("cuda",), models=("qwen2",), decoder_layers=True)
    reference = _tiny_qwen2("cuda")
    graphed = copy.deepcopy(reference)
    kernelize_model(reference, mode="train")
    kernelize_model(graphed, mode="train", cuda_graphs=True)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (graphed, reference)]
    ids = torch.randint(0, 128, (2, 16), device="cuda")
    for _ in range(4):  # warm-up, record, replay, replay
        losses = [_step(m, ids) for m in (graphed, reference)]
        torch.testing.assert_close(losses[0], losses[1], atol=2e-5, rtol=2e-5)
        _assert_same_grads(graphed, reference)
        for opt in opts:
            opt.step()
    status = graph_status(graphed)
    assert status.sequences == 1 and status.steps == 3, status
    assert status.replays["forward"] == 9 and status.replays["backward"] == 9, status

    for m in (graphed, reference):  # gradient accumulation over two replays
        _step(m, ids)
        _step(m, ids.flip(0), zero=False)
    _assert_same_grads(graphed, reference)

    for m in (graphed, reference):  # two forwards, then their backwards in the other order
        m.zero_grad(set_to_none=True)
        first, second = m(input_ids=ids, labels=ids).loss, m(input_ids=ids.flip(0), labels=ids.flip(0)).loss
        second.backward()
        first.backward()
    _assert_same_grads(graphed, reference)
    assert status.eager["a forward started before the backward of the previous training forward ran"] == 1

    other = torch.randint(0, 128, (3, 8), device="cuda")  # a new signature: warm-up, record, replay
    for _ in range(3):
        torch.testing.assert_close(_step(graphed, other), _step(reference, other), atol=2e-5, rtol=2e-5)
        _assert_same_grads(graphed, reference)
    assert status.sequences == 2, status

    graphed.eval(), reference.eval()
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(graphed(input_ids=ids).logits, reference(input_ids=ids).logits,
                                       atol=2e-5, rtol=2e-5)
    assert status.sequences == 3, status
    undo_kernelize(graphed)
    assert graph_status(graphed) is None


@pytest.mark.gpu  # CUDA graphs
def test_graphed_layers_fall_back_where_a_graph_cannot_serve():
    use_builtin_kernels(devices=("cuda",), models=("qwen2",), decoder_layers=True)
    model = _tiny_qwen2("cuda", layers=2).eval()
    reference = copy.deepcopy(model)
    kernelize_model(model, mode="inference", cuda_graphs=True)
    ids = torch.randint(0, 128, (2, 16), device="cuda")
    with torch.no_grad():
        for _ in range(3):
            model(input_ids=ids)
        handle = model.model.layers[0].mlp.register_forward_hook(lambda *args: None)
        torch.testing.assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits, atol=2e-5, rtol=2e-5)
        handle.remove()
        cache = transformers.DynamicCache(config=model.config)
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    status = graph_status(model)
    assert status.eager["hooks on a submodule of the block (a graph would not call them)"] == 1, status
    assert any("DynamicCache" in reason for reason in status.eager), status
