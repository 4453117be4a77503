"""``generate(..., custom_generate=twinkle_fx.decode)`` returns what transformers' own loop returns, with
a decode step that never reads the host (on CUDA it is one graph replay a token)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.streamers import BaseStreamer

import twinkle_fx
from twinkle_fx.generation.step import DecodeStep

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "families"))
from family_models import tiny_model  # noqa: E402  the families' tiny random models

PROMPT = 7


@pytest.fixture(autouse=True)
def _decoded_by_the_loop(request, caplog):
    """A test compares the loop's tokens, not transformers' fallback's: no call may fall back unless it means to."""
    caplog.set_level(logging.INFO, logger="twinkle_fx.generation")
    yield
    if "falls_back" not in request.keywords:
        fallbacks = [r.getMessage() for r in caplog.records if "own loop runs" in r.getMessage()]
        assert not fallbacks, fallbacks


def _inputs(device, batch=3, prompt=PROMPT, seed=0, padded=True):
    ids = torch.randint(3, 128, (batch, prompt), generator=torch.Generator().manual_seed(seed)).to(device)
    mask = torch.ones_like(ids)
    if padded and batch > 1:
        mask[0, :2] = 0  # left padding, as a tokenizer pads a batch for generation
        mask[1, :1] = 0
    return ids, mask


def _reference(model, ids, mask, **kwargs):
    """transformers' own loop on the same StaticCache numerics the decode loop uses, uncompiled."""
    return model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0, cache_implementation="static",
                          disable_compile=True, **kwargs)


def _decode(model, ids, mask, **kwargs):
    kwargs = {"do_sample": False, **kwargs}
    return model.generate(ids, attention_mask=mask, pad_token_id=0, custom_generate=twinkle_fx.decode, **kwargs)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama", "mistral", "gemma"])
def test_greedy_tokens_equal_transformers_loop(family, device):
    model = tiny_model(family).eval()
    ids, mask = _inputs(device)
    want = _reference(model, ids, mask, max_new_tokens=10)
    assert torch.equal(_decode(model, ids, mask, max_new_tokens=10, steps_per_sync=3), want)
    # again on the same model: the loop's cache and step are reused and reset
    assert torch.equal(_decode(model, ids, mask, max_new_tokens=10, steps_per_sync=3), want)


def test_each_sequence_stops_at_its_eos_at_transformers_step(device):
    model = tiny_model("qwen2").eval()
    ids, mask = _inputs(device)
    free = _reference(model, ids, mask, max_new_tokens=12)
    eos = int(free[1, PROMPT + 3])  # row 1 emits it at its 4th new token (other rows may too, or not)
    want = _reference(model, ids, mask, max_new_tokens=12, eos_token_id=eos)
    assert (want[1, PROMPT + 4:] == 0).all(), "row 1 is padded after its EOS"
    for steps in (1, 2, 5, 64):
        got = _decode(model, ids, mask, max_new_tokens=12, eos_token_id=eos, steps_per_sync=steps)
        assert torch.equal(got, want), steps
    # every row ends early: the result is as short as transformers' (the loop's extra steps are dropped)
    early = int(free[0, PROMPT + 1])
    both = [early, *free[1:, PROMPT + 1].tolist()]
    want = _reference(model, ids, mask, max_new_tokens=12, eos_token_id=both)
    got = _decode(model, ids, mask, max_new_tokens=12, eos_token_id=both, steps_per_sync=4)
    assert want.shape[1] < PROMPT + 12 and torch.equal(got, want)


def test_length_and_penalty_processors_match_transformers(device):
    model = tiny_model("llama").eval()
    ids, mask = _inputs(device)
    free = _reference(model, ids, mask, max_new_tokens=10)
    eos = int(free[2, PROMPT + 1])
    for kwargs in (dict(repetition_penalty=1.5), dict(min_new_tokens=6, eos_token_id=eos),
                   dict(min_length=PROMPT + 5, eos_token_id=eos), dict(forced_eos_token_id=eos),
                   dict(suppress_tokens=[int(free[0, PROMPT])], repetition_penalty=0.7)):
        want = _reference(model, ids, mask, max_new_tokens=10, **kwargs)
        assert torch.equal(_decode(model, ids, mask, max_new_tokens=10, steps_per_sync=3, **kwargs), want), kwargs


def test_scores_and_logits_equal_transformers(device):
    model = tiny_model("qwen2").eval()
    ids, mask = _inputs(device)
    asked = dict(max_new_tokens=6, return_dict_in_generate=True, output_scores=True, output_logits=True,
                 repetition_penalty=1.2)
    want = _reference(model, ids, mask, **asked)
    got = _decode(model, ids, mask, **asked)
    assert torch.equal(got.sequences, want.sequences)
    assert len(got.scores) == len(want.scores) == 6 and len(got.logits) == 6
    for a, b in zip(got.scores + got.logits, want.scores + want.logits):
        torch.testing.assert_close(a, b)


def test_sampling_is_seeded_and_top_k_1_is_greedy(device):
    model = tiny_model("qwen2").eval()
    ids, mask = _inputs(device)
    sample = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=10)
    runs = []
    for _ in range(2):
        torch.manual_seed(1)
        runs.append(_decode(model, ids, mask, **sample))
    assert torch.equal(*runs)
    torch.manual_seed(2)
    assert not torch.equal(_decode(model, ids, mask, **sample), runs[0]), "another seed, other tokens"
    greedy = _reference(model, ids, mask, max_new_tokens=10)
    assert torch.equal(_decode(model, ids, mask, do_sample=True, top_k=1, max_new_tokens=10), greedy)


class _HostSync(TorchDispatchMode):
    """Records the ops that read a tensor on the host or copy between devices (a graph cannot hold them)."""

    READS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default",
             "aten._unique2.default", "aten.is_nonzero.default"}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        devices = {a.device.type for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}
        copies = ("aten._to_copy.default", "aten.copy_.default")
        if str(func) in self.READS or (len(devices) > 1 and str(func) in copies):
            self.seen.append(str(func))
        return func(*args, **kwargs)


def test_the_decode_step_never_reads_the_host(device, monkeypatch):
    """Every processor with a graph-safe form, sampling, EOS and recorded scores, inside one step."""
    model = tiny_model("qwen2").eval()
    ids, mask = _inputs(device)
    run = DecodeStep.run
    steps, syncs = [], []

    def watched(self):
        with _HostSync() as mode:
            run(self)
        steps.append(1)
        syncs.extend(mode.seen)

    monkeypatch.setattr(DecodeStep, "run", watched)
    _decode(model, ids, mask, max_new_tokens=8, do_sample=True, temperature=0.8, top_k=30, top_p=0.95, min_p=0.01,
            typical_p=0.9, repetition_penalty=1.1, min_new_tokens=3, eos_token_id=5, suppress_tokens=[7],
            remove_invalid_values=True, renormalize_logits=True, return_dict_in_generate=True, output_scores=True)
    assert steps and syncs == []


class _Custom(LogitsProcessor):
    def __call__(self, input_ids, scores):
        return scores


@pytest.mark.falls_back
def test_what_has_no_graph_safe_form_runs_transformers_loop_and_says_so(device, caplog):
    model = tiny_model("qwen2").eval()
    ids, mask = _inputs(device)
    want = _reference(model, ids, mask, max_new_tokens=5, no_repeat_ngram_size=2)
    with caplog.at_level(logging.INFO, logger="twinkle_fx.generation"):
        got = _decode(model, ids, mask, max_new_tokens=5, no_repeat_ngram_size=2, cache_implementation="static",
                      disable_compile=True)
    assert torch.equal(got, want)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("twinkle_fx.generation")]
    assert len(lines) == 1 and "NoRepeatNGramLogitsProcessor" in lines[0] and "transformers' own loop" in lines[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="twinkle_fx.generation"):
        _decode(model, ids, mask, max_new_tokens=3, logits_processor=LogitsProcessorList([_Custom()]))
    assert any("_Custom" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="steps_per_sync"):
        _decode(model, ids, mask, max_new_tokens=3, steps_per_sync=0)


class _Collect(BaseStreamer):
    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ended = True


@pytest.mark.parametrize("steps", [1, 3, 64])
def test_use_decode_loop_streams_every_token_once(device, steps):
    model = tiny_model("qwen2").eval()
    ids, _ = _inputs(device, batch=1, padded=False)
    free = _reference(model, ids, None, max_new_tokens=12)
    eos = int(free[0, PROMPT + 8])
    want = _reference(model, ids, None, max_new_tokens=12, eos_token_id=eos)
    twinkle_fx.use_decode_loop(model, steps_per_sync=steps)
    try:
        streamer = _Collect()
        got = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=eos,
                             streamer=streamer)
    finally:
        del model.generate
    assert torch.equal(got, want) and streamer.ended
    assert streamer.puts[0] == ids.tolist()  # generate() puts the prompt itself
    assert [p[0] for p in streamer.puts[1:]] == want[0, PROMPT:].tolist()
    with pytest.raises(TypeError, match="steps_per_sync"):
        twinkle_fx.use_decode_loop(model, step_per_sync=2)


def test_other_prompt_lengths_reuse_the_loop(device):
    model = tiny_model("llama").eval()
    for prompt, seed in ((5, 1), (11, 2), (5, 3)):
        ids, mask = _inputs(device, prompt=prompt, seed=seed)
        want = _reference(model, ids, mask, max_new_tokens=6)
        assert torch.equal(_decode(model, ids, mask, max_new_tokens=6), want), prompt


@pytest.mark.slow
@pytest.mark.parametrize("cuda_graphs", [False, pytest.param(True, marks=pytest.mark.gpu)])
def test_kernelized_model_decodes_with_its_kernels(device, cuda_graphs):
    """kernelize's own CUDA graphs (per layer, whole forward) stand aside inside the loop's capture."""
    from twinkle_fx.builtin import use_builtin_kernels

    model = tiny_model("qwen2").eval()
    ids, mask = _inputs(device)
    want = _reference(model, ids, mask, max_new_tokens=6)
    with twinkle_fx.scoped_registry():
        use_builtin_kernels(devices=(device,), models=("qwen2",), decoder_layers=cuda_graphs)
        twinkle_fx.kernelize_model(model, mode="inference", device=device, cuda_graphs=cuda_graphs)
        try:
            for _ in range(2):  # the second call replays the step recorded by the first
                assert torch.equal(_decode(model, ids, mask, max_new_tokens=6), want)
        finally:
            twinkle_fx.undo_kernelize(model)


@pytest.mark.slow
def test_compile_config_compiles_the_forward_inside_the_step(device):
    """``cache_implementation="static"`` compiles the step's forward as transformers would (here through the
    twinkle backend), without CUDA graphs of its own: the loop graphs the whole step."""
    from transformers import CompileConfig

    from twinkle_fx.builtin import use_builtin_kernels
    from twinkle_fx.testing import record_graphs

    model = tiny_model("qwen2").eval()
    ids, mask = _inputs(device)
    want = _reference(model, ids, mask, max_new_tokens=5)
    config = CompileConfig(backend="twinkle", options={"compiler": "inductor" if device == "cuda" else "aot_eager"})
    config._compile_all_devices = True  # transformers compiles only on accelerators unless told
    torch._dynamo.reset()
    try:
        with twinkle_fx.scoped_registry(), record_graphs() as graphs:
            use_builtin_kernels(devices=(device,), models=("qwen2",))
            got = _decode(model, ids, mask, max_new_tokens=5, cache_implementation="static", compile_config=config)
    finally:
        torch._dynamo.reset()
    assert torch.equal(got, want)
    assert graphs.after and "twinkle_layer_RMSNorm" in "\n".join(graphs.after)


def test_the_loop_state_lives_and_dies_with_the_model(device):
    import copy
    import gc
    import io
    import weakref

    model = tiny_model("qwen2").eval()
    ids, mask = _inputs(device)
    want = _decode(model, ids, mask, max_new_tokens=4)
    twin = copy.deepcopy(model)  # a copy records its own step on its own memory
    assert torch.equal(_decode(twin, ids, mask, max_new_tokens=4), want)
    torch.save(model, io.BytesIO())  # the recorded state is not pickled
    gone = weakref.ref(model)
    del model, twin
    gc.collect()
    assert gone() is None


def test_max_time_stops_between_rounds(device):
    """A time limit is read on the host between rounds: an expired one ends generation a round or two later."""
    model = tiny_model("qwen2").eval()
    ids, mask = _inputs(device)
    full = _reference(model, ids, mask, max_new_tokens=40)
    got = _decode(model, ids, mask, max_new_tokens=40, max_time=0.0, steps_per_sync=2)
    assert PROMPT + 1 <= got.shape[1] <= PROMPT + 1 + 2 * 2
    assert torch.equal(got, full[:, :got.shape[1]])  # the tokens it did produce are the loop's own
