"""The fused-loss head keeps the original ``*ForCausalLM`` contract: ``return_dict=False`` gives a
tuple, and the swapped forward shows the original signature (Hugging Face Trainer reads it)."""

import inspect
import types

import torch
import transformers

from twinkle_fx import kernelize_model
from twinkle_fx.builtin import use_builtin_kernels

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _tiny():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, vocab_size=96, max_position_embeddings=32)
    return transformers.AutoModelForCausalLM.from_config(config).to(DEVICE)


def test_return_dict_false_gives_the_tuple_of_the_original():
    # (config.return_dict=False is not tested: transformers 5.22's own Qwen2ForCausalLM fails with it,
    # its inner model returning a tuple to a forward that reads .last_hidden_state)
    use_builtin_kernels(devices=(DEVICE,), models=("qwen2",))
    model = _tiny()
    kwargs = {"return_dict": False}
    ids = torch.randint(0, 96, (2, 7), device=DEVICE)
    want_train = model(ids, labels=ids, **kwargs)
    want_eval = model.eval()(ids, **kwargs)
    model.train()
    kernelize_model(model, mode="train", use_fallback=False)
    got_train = model(ids, labels=ids, **kwargs)
    assert isinstance(got_train, tuple) and isinstance(want_train, tuple)
    # the fused loss leaves the logits out (None fields are dropped from the tuple): the loss comes first
    torch.testing.assert_close(got_train[0], want_train[0], atol=1e-5, rtol=1e-5)
    got_eval = model.eval()(ids, **kwargs)
    assert isinstance(got_eval, tuple) and len(got_eval) == len(want_eval)
    torch.testing.assert_close(got_eval[0], want_eval[0], atol=1e-4, rtol=1e-4)


def test_swapped_head_keeps_the_original_signature_for_trainer():
    use_builtin_kernels(devices=(DEVICE,), models=("qwen2",))
    model = _tiny()
    original = inspect.signature(model.forward)
    kernelize_model(model, mode="train", use_fallback=False)
    assert type(model.__dict__["forward"]).__name__ == "KernelForward"  # really swapped
    assert inspect.signature(model.forward) == original
    assert {"input_ids", "attention_mask", "labels"} <= set(inspect.signature(model.forward).parameters)

    # Trainer's own column filter (remove_unused_columns=True), run on a stand-in that has what it
    # reads: a full Trainer needs accelerate, which CI does not install
    trainer = types.SimpleNamespace(model=model, _signature_columns=None, label_names=[])
    transformers.Trainer._set_signature_columns_if_needed(trainer)
    assert {"input_ids", "attention_mask", "labels"} <= set(trainer._signature_columns)
