"""Registering from several threads while another kernelizes never corrupts the registry."""

import contextvars
import threading

import torch

from twinkle_fx import get_registry, kernelize_model, register_external_layer, register_layer_kernel, undo_kernelize

from kernels_for_tests import Gelu, TanhGeluKernel, model_with_gelus, uses_tanh


def test_concurrent_registration_and_kernelize():
    registry = get_registry()
    register_layer_kernel(kernel_name="FastGelu", layer=TanhGeluKernel, device="cpu")
    register_external_layer(Gelu, "FastGelu")
    errors: list[BaseException] = []
    stop = threading.Event()

    def register(worker: int):
        try:
            for i in range(200):
                register_layer_kernel(kernel_name=f"K{worker}_{i}", layer=TanhGeluKernel, device="cpu", mode="inference")
                register_external_layer(type(f"Layer{worker}_{i}", (torch.nn.Module,), {}), f"K{worker}_{i}")
        except BaseException as e:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(e)

    def kernelize():
        try:
            while not stop.is_set():
                model = model_with_gelus()
                kernelize_model(model, mode="inference", device="cpu", use_fallback=False)
                assert uses_tanh(model[1])
                undo_kernelize(model)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    # threads start with the default context: hand them this test's scoped registry explicitly
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(register, w)) for w in range(4)]
    kernelizer = threading.Thread(target=contextvars.copy_context().run, args=(kernelize,))
    kernelizer.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    kernelizer.join()
    assert errors == []
    assert len(registry.layer_kernel_names()) == 1 + 4 * 200
    assert len(registry.bindings()) == 1 + 4 * 200
