"""The installed transformers names the KV cache as twinkle_triton's model-level layers expect:
every built-in head class and the decoder layers DecoderLayer replaces take ``CACHE_ARGUMENT``,
and the layers' forwards have exactly the replaced forwards' parameters."""

import importlib
import inspect

import pytest
from twinkle_triton import layers
from twinkle_triton.transformers_api import CACHE_ARGUMENT, TRANSFORMERS_VERSION, cache_renamed

from twinkle_fx.builtin import _DECODER_LAYER_FAMILIES, BUILTIN_MODELS
from twinkle_fx.core.selection import signature_mismatch

HEADS = sorted((name, f) for name, f in BUILTIN_MODELS.items() if f.head)


def test_the_cache_argument_follows_the_installed_release():
    assert TRANSFORMERS_VERSION is not None
    assert CACHE_ARGUMENT == ("cache" if cache_renamed(TRANSFORMERS_VERSION) else "past_key_values")
    assert not cache_renamed("5.17.0") and not cache_renamed("5.23.9") and cache_renamed("5.24.0")
    assert cache_renamed("5.24.0.dev0") and cache_renamed("6.0") and not cache_renamed(None)


@pytest.mark.parametrize("family", [name for name, _ in HEADS])
def test_every_builtin_head_takes_the_cache_argument_and_fits_the_fused_loss_head(family):
    f = BUILTIN_MODELS[family]
    head = getattr(importlib.import_module(f.module), f.head)
    assert CACHE_ARGUMENT in inspect.signature(head.forward).parameters
    assert signature_mismatch(head.forward, getattr(layers, f.head_kernel).forward) is None


@pytest.mark.parametrize("family", _DECODER_LAYER_FAMILIES)
def test_decoder_layers_take_the_cache_argument_and_fit_decoder_layer(family):
    modeling = importlib.import_module(BUILTIN_MODELS[family].module)
    cls = next(c for n, c in vars(modeling).items() if n.endswith("DecoderLayer") and isinstance(c, type))
    assert signature_mismatch(cls.forward, layers.DecoderLayer.forward) is None
    attention = next(c for n, c in vars(modeling).items() if n.endswith("Attention") and isinstance(c, type))
    assert CACHE_ARGUMENT in inspect.signature(attention.forward).parameters
