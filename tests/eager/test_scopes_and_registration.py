"""``scoped_registry`` reaches threads started inside it, and registering is pure data (issue 12, 4b)."""

import sys
import threading

import torch

from twinkle_fx import (
    get_registry,
    kernelize_model,
    register_external_layer,
    register_function_kernel,
    register_layer_kernel,
    scoped_registry,
)

from .kernels_for_tests import Gelu, TanhGeluKernel, model_with_gelus, uses_tanh


def _in_thread(fn):
    errors = []

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert errors == []


def test_a_registration_in_a_worker_thread_lands_in_the_open_scope():
    with scoped_registry() as scope:
        _in_thread(lambda: register_layer_kernel(kernel_name="FastGelu", layer=TanhGeluKernel, device="cpu"))
        assert "FastGelu" in scope.layer_kernel_names()
    assert "FastGelu" not in get_registry().layer_kernel_names()


def test_kernelize_in_a_worker_thread_sees_the_open_scope():
    model = model_with_gelus()
    with scoped_registry():
        register_layer_kernel(kernel_name="FastGelu", layer=TanhGeluKernel, device="cpu")
        register_external_layer(Gelu, "FastGelu")
        _in_thread(lambda: kernelize_model(model, mode="inference", device="cpu", use_fallback=False))
    assert uses_tanh(model[1])


def test_a_thread_with_its_own_scope_keeps_it():
    seen = []

    def worker():
        with scoped_registry(inherit=False) as mine:
            seen.append(get_registry() is mine)

    with scoped_registry():
        _in_thread(worker)
    assert seen == [True]


def test_registering_a_function_kernel_imports_and_runs_nothing(tmp_path, monkeypatch):
    (tmp_path / "twinkle_unimported_ops.py").write_text(
        "import torch\nCALLS = []\n\ndef add(a, b):\n    CALLS.append(1)\n    return a + b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    register_function_kernel(func_name="add", target_module="twinkle_unimported_ops", func_impl=torch.add, device="cpu")
    assert "twinkle_unimported_ops" not in sys.modules  # the docstring's promise: nothing is imported here
    import twinkle_unimported_ops

    assert twinkle_unimported_ops.CALLS == []
    del sys.modules["twinkle_unimported_ops"]
