"""kernelize_model(..., cuda_graphs=True): decoder layers replayed from CUDA graphs, forward and backward."""

import copy
import weakref
import logging

import pytest
import torch
import transformers

from twinkle_fx import kernelize_model, kernelized, undo_kernelize
from twinkle_fx.builtin import use_builtin_kernels
from twinkle_fx.core.swaps import swapped_forward
from twinkle_fx.eager.cuda_graphs import graph_status


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


def _cache_tensors(cache) -> list[torch.Tensor]:
    return [t for layer in cache.layers for t in (layer.keys, layer.values, layer.cumulative_length)]


def _logits(model, ids, cache, through_base):
    if through_base:  # the decoder stack, then the head: the model's own forward (its whole-forward graph) is not called
        return model.lm_head(model.model(input_ids=ids, past_key_values=cache, use_cache=True).last_hidden_state)
    return model(input_ids=ids, past_key_values=cache, use_cache=True).logits


def _decode_and_compare(graphed, reference, caches, ids, steps, tol=2e-5, through_base=False):
    """Prefill ``ids`` into both caches, then ``steps`` greedy decode steps (the reference picks the
    tokens); logits and every cache tensor compared after each forward."""
    with torch.no_grad():
        for step in range(steps + 1):
            outs = [_logits(m, ids, c, through_base) for m, c in zip((graphed, reference), caches)]
            torch.testing.assert_close(outs[0], outs[1], atol=tol, rtol=tol, msg=lambda m: f"step {step}: {m}")
            for a, b in zip(_cache_tensors(caches[0]), _cache_tensors(caches[1])):
                torch.testing.assert_close(a, b, atol=tol, rtol=tol, msg=lambda m: f"cache after step {step}: {m}")
            ids = outs[1][:, -1:].argmax(-1)


_NOT_INITIALISED = "a StaticCache not initialised yet (its first update allocates its tensors; that pass runs eagerly)"
_MOVED = "the StaticCache's tensors moved to other memory since the recording (reorder_cache, offloading or .to())"


@pytest.mark.gpu  # CUDA graphs
def test_graphed_decode_layers_with_a_static_cache_equal_the_kernelized_model():
    """Decode steps against a transformers StaticCache replay the recorded layers (the cache's
    tensors updated in place by the graphs), after reset() too; reorder_cache re-records. Called
    through the decoder stack, as a wrapper around the model would (no whole-forward graph)."""
    use_builtin_kernels(devices=("cuda",), models=("qwen2",), decoder_layers=True)
    reference = _tiny_qwen2("cuda").eval()
    graphed = copy.deepcopy(reference)
    kernelize_model(reference, mode="inference")
    kernelize_model(graphed, mode="inference", cuda_graphs=True)
    caches = [transformers.StaticCache(config=m.config, max_cache_len=24) for m in (graphed, reference)]
    prompt = torch.randint(0, 128, (2, 5), device="cuda")
    _decode_and_compare(graphed, reference, caches, prompt, steps=6, through_base=True)
    status = graph_status(graphed)
    # prefill: eager (the cache is allocated there); decode 1: warm-up; decode 2: recorded; 3-6: replayed
    assert status.sequences == 1 and status.steps == 3, status
    assert status.replays["forward"] == 3 * 5, status
    assert status.eager[_NOT_INITIALISED] == 1 and status.eager["warm-up pass of a new input signature"] == 1, status

    for cache in caches:  # reset() zeroes the same tensors: the recorded graphs still serve
        cache.reset()
    _decode_and_compare(graphed, reference, caches, prompt, steps=3, through_base=True)
    assert status.sequences == 1 and status.replays["forward"] == 3 * 8, status

    for cache in caches:  # beam search's reorder_cache replaces the tensors: recorded again
        cache.reorder_cache(torch.tensor([1, 0], device="cuda"))
    _decode_and_compare(graphed, reference, caches, prompt[:, :1], steps=3, through_base=True)
    assert status.eager[_MOVED] == 1 and status.sequences == 2, status
    assert status.model_graphs == 0 and not status.model_eager, status


@pytest.mark.gpu  # CUDA graphs
def test_a_decode_step_with_a_static_cache_is_one_graph_of_the_whole_forward():
    """The model's own forward with a StaticCache: the first decode step of a shape runs eagerly,
    the second is captured whole (embedding to logits) and replayed, the layers' graphs stand
    aside; reset() keeps the graph, reorder_cache (new tensors) captures another one at once."""
    use_builtin_kernels(devices=("cuda",), models=("qwen2",), decoder_layers=True)
    reference = _tiny_qwen2("cuda").eval()
    graphed = copy.deepcopy(reference)
    kernelize_model(reference, mode="inference")
    kernelize_model(graphed, mode="inference", cuda_graphs=True)
    caches = [transformers.StaticCache(config=m.config, max_cache_len=24) for m in (graphed, reference)]
    prompt = torch.randint(0, 128, (2, 5), device="cuda")
    _decode_and_compare(graphed, reference, caches, prompt, steps=6)
    status = graph_status(graphed)
    # prefill: no graph (the cache is allocated there); decode 1: warm-up; decode 2: captured; 2-6 replayed
    assert status.model_graphs == 1 and status.replays["model"] == 5, status
    assert status.model_eager[_NOT_INITIALISED] == 1, status
    assert status.sequences == 0 and status.replays["forward"] == 0, status  # the layers' graphs stood aside

    for cache in caches:
        cache.reset()
    _decode_and_compare(graphed, reference, caches, prompt, steps=3)
    assert status.model_graphs == 1 and status.replays["model"] == 5 + 3, status

    for cache in caches:  # a decode-shaped call (the strides of a decode step's ids) with new cache tensors
        cache.reorder_cache(torch.tensor([1, 0], device="cuda"))
    _decode_and_compare(graphed, reference, caches, prompt[:, :1].clone(), steps=3)
    assert status.model_graphs == 2 and status.replays["model"] == 5 + 3 + 4, status
    undo_kernelize(graphed)
    assert graph_status(graphed) is None and "forward" not in graphed.__dict__


@pytest.mark.gpu  # CUDA graphs
def test_graphed_generate_with_a_static_cache_equals_eager_greedy():
    """generate(cache_implementation="static") makes a new StaticCache per call: each call's decode
    steps are recorded and replayed (disable_compile: generate would otherwise torch.compile them)."""
    use_builtin_kernels(devices=("cuda",), models=("qwen2",), decoder_layers=True)
    eager = _tiny_qwen2("cuda").eval()
    graphed = copy.deepcopy(eager)
    kernelize_model(graphed, mode="inference", cuda_graphs=True)
    prompt = torch.randint(0, 128, (2, 6), device="cuda")
    kwargs = dict(max_new_tokens=10, do_sample=False, use_cache=True, cache_implementation="static",
                  disable_compile=True, pad_token_id=0)
    status = graph_status(graphed)
    for call, batch in enumerate((2, 2, 1, 2)):
        before = status.replays["model"]
        expected = eager.generate(prompt[:batch], **kwargs)
        got = graphed.generate(prompt[:batch], **kwargs)
        torch.testing.assert_close(got, expected, atol=0, rtol=0, msg=lambda m: f"generate call {call}: {m}")
        # 9 decode steps, each a replay of the whole forward captured with the call's own cache, but the
        # first step of a batch size never seen (an eager warm-up)
        warm_up = 1 if call in (0, 2) else 0
        assert status.replays["model"] - before == 9 - warm_up, status
    assert status.model_graphs == 4 and status.replays["forward"] == 0, status


class PlainBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.linear(x))


class Plain(torch.nn.Module):
    """Two blocks of ``block`` (the class ``_no_split_modules`` names), applied in turn."""

    def __init__(self, block: type[torch.nn.Module] = PlainBlock):
        super().__init__()
        self._no_split_modules = [block.__name__]
        self.blocks = torch.nn.ModuleList([block(), block()])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class SyncingBlock(PlainBlock):
    def forward(self, x):
        if x.sum().item() == float("inf"):  # a host sync: it invalidates a capture
            x = x + 1
        return self.linear(x)


@pytest.mark.gpu  # CUDA graphs
def test_a_failed_capture_leaves_the_stream_and_the_random_generator_as_they_were(caplog):
    model = Plain(SyncingBlock).cuda().eval()
    kernelize_model(model, mode="inference", device="cuda", cuda_graphs=True)
    stream = torch.cuda.current_stream()
    x = torch.randn(2, 8, device="cuda")
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        for _ in range(3):  # warm-up, then the recording pass whose capture fails
            out = model(x)
    assert "capturing the forward of SyncingBlock raised" in caplog.text
    torch.testing.assert_close(out, model.blocks[1].linear(model.blocks[0].linear(x)))
    assert torch.cuda.current_stream() == stream and not torch.cuda.is_current_stream_capturing()
    torch.manual_seed(0)
    first = torch.rand(1000, device="cuda")
    torch.manual_seed(0)
    again, then = torch.rand(1000, device="cuda"), torch.rand(1000, device="cuda")
    assert torch.equal(first, again) and not torch.equal(again, then)  # seeded, and advancing
    undo_kernelize(model)


@pytest.mark.gpu  # CUDA graphs
def test_recording_again_after_every_graph_was_dropped_while_a_pool_tensor_lives(caplog):
    """generate() drops the graphs of its finished call (their StaticCache died) while a tensor the
    graphs allocated may still be referenced; the next call's capture goes into the same pool."""
    model = Plain().cuda().eval()
    kernelize_model(model, mode="inference", device="cuda", cuda_graphs=True)
    x = torch.randn(2, 8, device="cuda")
    with torch.no_grad():
        for _ in range(3):  # warm-up, record, replay
            kept = model(x)  # the last block's static output: memory of the graphs' pool
        assert graph_status(model).replays["forward"] == 4
        with caplog.at_level(logging.WARNING):
            model.blocks[0].linear.weight.data = model.blocks[0].linear.weight.data.clone()  # drops every graph
            model(x)
            again = [model(x) for _ in range(2)]  # recorded again into the pool, then replayed
    assert "recording failed (a parameter or buffer of a block moved" in caplog.text
    assert "capturing the forward" not in caplog.text, caplog.text
    status = graph_status(model)
    assert status.sequences == 2 and status.replays["forward"] == 8, status
    expected = model.blocks[1](model.blocks[0](x))
    torch.testing.assert_close(again[-1], expected)
    assert kept.data_ptr() != 0
    undo_kernelize(model)


class SyncingTop(Plain):
    def forward(self, x, cache=None):
        if x.sum().item() == float("inf"):  # a host sync: the whole forward cannot be captured
            x = x + 1
        return super().forward(x)


@pytest.mark.gpu  # CUDA graphs
def test_a_whole_forward_that_cannot_be_captured_leaves_decode_steps_to_the_layers_graphs(caplog):
    model = SyncingTop().cuda().eval()
    kernelize_model(model, mode="inference", device="cuda", cuda_graphs=True)
    config = transformers.Qwen2Config(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=1,
                                      num_key_value_heads=1, vocab_size=8)
    cache = transformers.StaticCache(config=config, max_cache_len=8)
    cache.early_initialization(batch_size=1, num_heads=1, head_dim=8, dtype=torch.float32, device="cuda")
    x = torch.randn(2, 8, device="cuda")
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        # whole forward: warm-up, then a failed capture; the layers' graphs: warm-up, record, replay
        outs = [model(x, cache=cache) for _ in range(4)]
    assert caplog.text.count("capturing the whole forward of SyncingTop for a decode step raised") == 1, caplog.text
    status = graph_status(model)
    assert "already recording" not in caplog.text, caplog.text  # the failed capture left the pool usable
    assert status.model_eager["the whole-forward capture failed (see the warning)"] == 1, status
    assert status.model_graphs == 0 and status.sequences == 1 and status.replays["forward"] == 4, status
    torch.testing.assert_close(outs[-1], model.blocks[1](model.blocks[0](x)))
    undo_kernelize(model)


@pytest.mark.gpu  # CUDA graphs
def test_graphed_decode_declines_a_dynamic_cache_with_the_reason():
    use_builtin_kernels(devices=("cuda",), models=("qwen2",), decoder_layers=True)
    reference = _tiny_qwen2("cuda", layers=2).eval()
    graphed = copy.deepcopy(reference)
    kernelize_model(reference, mode="inference")
    kernelize_model(graphed, mode="inference", cuda_graphs=True)
    caches = [transformers.DynamicCache(config=m.config) for m in (graphed, reference)]
    with torch.no_grad():
        ids = torch.randint(0, 128, (2, 4), device="cuda")
        for _ in range(4):
            outs = [m(input_ids=ids, past_key_values=c, use_cache=True).logits for m, c in zip((graphed, reference),
                                                                                              caches)]
            torch.testing.assert_close(outs[0], outs[1], atol=2e-5, rtol=2e-5)
            ids = outs[1][:, -1:].argmax(-1)
    status = graph_status(graphed)
    reason = ("a DynamicCache: its update grows the keys and values with torch.cat (new tensors of a new shape every "
              "step), which a CUDA graph cannot replay; use a StaticCache (e.g. generate(..., "
              'cache_implementation="static"))')
    assert status.eager[reason] == 4 and status.replays["forward"] == 0, status


# -- the KV-cache bookkeeping without CUDA: a stand-in capture --------------------------------------

class _StandInGraph:
    """Replays a block by calling it again on the static inputs, writing into the static outputs and
    into the tensors of the cache it was captured with (weakly held, as a real graph would write
    into that memory whichever cache a later call passes)."""

    def __init__(self, step, caches):
        self.step, self.caches = step, {key: weakref.ref(c) for key, c in caches.items()}

    def replay(self):
        from twinkle_fx.eager.cuda_graphs.capture import rebuild_call, spec_of

        caches = {key: ref() for key, ref in self.caches.items()}
        assert all(c is not None for c in caches.values()), "replayed a graph whose cache is gone"
        args, kwargs = rebuild_call(self.step.in_spec, self.step.static_in, caches)
        outs = []
        spec_of(self.step.fn(self.step.module, *args, **kwargs), outs, {})
        for static, out in zip(self.step.static_out, outs):
            static.copy_(out)


def _stand_in_capture(graphs, seq, step, tensors, caches):
    """What GraphSet._capture_forward leaves behind, without CUDA: static inputs, outputs and a
    'graph'; like a capture, it leaves the cache as it found it (the recording call then replays)."""
    from twinkle_fx.eager.cuda_graphs.capture import rebuild_call, spec_of

    step.static_in = [t.clone() for t in tensors]
    step.owned_in = [True] * len(tensors)
    step.grad_mask = [False] * len(tensors)
    step.first_sources = [(weakref.ref(t), t._version) for t in tensors]
    saved = [(t, t.clone()) for cache in caches.values() for t in _cache_tensors(cache)]
    args, kwargs = rebuild_call(step.in_spec, step.static_in, caches)
    outs = []
    step.out_spec = spec_of(step.fn(step.module, *args, **kwargs), outs, {})
    for tensor, value in saved:
        tensor.copy_(value)
    step.static_out = [o.detach().clone() for o in outs]
    step.fwd = _StandInGraph(step, caches)


def _stand_in_graphs(model, monkeypatch):
    from twinkle_fx.eager.cuda_graphs import layer_graphs
    from twinkle_fx.eager.layers import install_graphs

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(layer_graphs.GraphSet, "_capture_forward", _stand_in_capture)
    blocks = list(model.model.layers)
    graphs = layer_graphs.GraphSet(blocks, torch.device("cpu"))
    for index, block in enumerate(blocks):
        install_graphs(f"model.layers.{index}", block, graphs)
    return graphs


def test_static_cache_bookkeeping_with_a_stand_in_capture(monkeypatch):
    """The cache is part of the signature by identity: steps with one StaticCache replay; a new
    cache records anew and the graphs of a cache that is gone are dropped; moved cache tensors
    re-record; a DynamicCache and a cache while training are declined with their reasons.
    (The graphs themselves are tested on CUDA above.)"""
    reference = _tiny_qwen2("cpu", layers=2).eval()
    model = copy.deepcopy(reference)
    graphs = _stand_in_graphs(model, monkeypatch)
    status = graphs.status
    new_caches = lambda: [transformers.StaticCache(config=reference.config, max_cache_len=16) for _ in range(2)]
    prompt = torch.randint(0, 128, (2, 3))
    caches = new_caches()
    _decode_and_compare(model, reference, caches, prompt, steps=4)
    assert status.sequences == 1 and status.replays["forward"] == 2 * 3, status
    assert status.eager[_NOT_INITIALISED] == 1, status

    caches = new_caches()  # the first pair is gone: its sequence and warm-up counts are dropped
    _decode_and_compare(model, reference, caches, prompt, steps=4)
    assert status.sequences == 2 and status.replays["forward"] == 2 * 6, status
    # only the decode signature of the new cache is left (its prefill ran eagerly: the cache was not initialised)
    assert len(graphs.sequences) == 1 and len(graphs.attempts) == 1, graphs.attempts
    assert [[ref() for ref in refs] for refs in graphs.cache_keys.values()] == [[caches[0]]]

    for cache in caches:
        cache.reorder_cache(torch.tensor([1, 0]))
    _decode_and_compare(model, reference, caches, prompt[:, :1], steps=3)
    assert status.eager[_MOVED] == 1, status

    with torch.no_grad():
        model(input_ids=prompt, past_key_values=transformers.DynamicCache(config=model.config), use_cache=True)
        with torch.enable_grad():
            model(input_ids=prompt, past_key_values=caches[0], use_cache=True)
    assert any(r.startswith("a DynamicCache: its update grows the keys and values with torch.cat") for r in status.eager)
    assert status.eager["a KV cache in a forward that records gradients (graphs with a cache are for inference "
                        "under torch.no_grad)"] == 1, status


def test_generate_with_a_static_cache_replays_with_a_stand_in_capture(monkeypatch):
    """generate's decode steps give the layers one signature per call (the cache by identity), so
    from the third step on they replay; the graphs of the previous call's cache are dropped."""
    eager = _tiny_qwen2("cpu").eval()
    model = copy.deepcopy(eager)
    graphs = _stand_in_graphs(model, monkeypatch)
    prompt = torch.randint(0, 128, (2, 6))
    kwargs = dict(max_new_tokens=10, do_sample=False, use_cache=True, cache_implementation="static",
                  disable_compile=True, pad_token_id=0)
    for call in range(2):
        before = graphs.status.replays["forward"]
        torch.testing.assert_close(model.generate(prompt, **kwargs), eager.generate(prompt, **kwargs), atol=0, rtol=0)
        assert graphs.status.replays["forward"] - before == 3 * 8, graphs.status  # 9 decode steps, 1 warm-up
    assert len(graphs.sequences) == 1, graphs.status


def test_static_cache_state_reasons():
    from twinkle_fx.eager.cuda_graphs.capture import static_cache_state

    config = transformers.Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, vocab_size=32, layer_types=["full_attention"] * 2)
    cache = transformers.StaticCache(config=config, max_cache_len=8)
    assert static_cache_state(cache) == ((), _NOT_INITIALISED)
    cache.early_initialization(batch_size=1, num_heads=1, head_dim=8, dtype=torch.float32, device="cpu")
    ptrs, reason = static_cache_state(cache)
    assert reason is None and ptrs == tuple(t.data_ptr() for t in _cache_tensors(cache))
    cache.reset()  # in place
    assert static_cache_state(cache) == (ptrs, None)

    sliding = transformers.Qwen2Config(**{**config.to_dict(), "layer_types": ["full_attention", "sliding_attention"],
                                          "sliding_window": 4, "use_sliding_window": True})
    reason = static_cache_state(transformers.StaticCache(config=sliding, max_cache_len=8))[1]
    assert reason.startswith("a StaticCache with sliding-window layers (StaticSlidingWindowLayer at layer 1"), reason
    offloaded = transformers.StaticCache(config=config, max_cache_len=8, offloading=True)
    offloaded.early_initialization(batch_size=1, num_heads=1, head_dim=8, dtype=torch.float32, device="cpu")
    assert static_cache_state(offloaded) == ((), "a StaticCache with offloading=True (its update moves layers "
                                                 "between host and device)")
    reason = static_cache_state(transformers.DynamicCache(config=config))[1]
    assert "torch.cat" in reason and "cannot replay" in reason, reason
    encoder_decoder = transformers.EncoderDecoderCache(transformers.StaticCache(config=config, max_cache_len=8),
                                                       transformers.StaticCache(config=config, max_cache_len=8))
    assert static_cache_state(encoder_decoder)[1].startswith("a cache of type EncoderDecoderCache (only transformers' StaticCache")
