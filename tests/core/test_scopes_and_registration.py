"""``scoped_registry`` is per thread, reaches threads started inside it (and no others), and
registering is pure data."""

import asyncio
import concurrent.futures
import sys
import threading

import pytest
import torch

from twinkle_fx import (
    get_registry,
    kernelize_model,
    register_external_layer,
    register_function_kernel,
    register_layer_kernel,
    scoped_registry,
)

from kernels_for_tests import Gelu, TanhGeluKernel, model_with_gelus, uses_tanh


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


def _thread(fn):
    """A started thread running ``fn``; ``join_checked`` re-raises what it raised."""
    errors = []

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - re-raised by join_checked
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()

    def join_checked():
        thread.join(timeout=60)
        assert not thread.is_alive()
        if errors:
            raise errors[0]

    return join_checked


def test_a_worker_threads_own_scope_does_not_take_over_other_threads():
    # the "main" role runs in a thread with no scope of its own, which used to see whichever
    # scope was innermost in the process
    model = model_with_gelus()
    worker_in_scope, main_done = threading.Event(), threading.Event()

    def worker():
        with scoped_registry(inherit=False):
            worker_in_scope.set()
            assert main_done.wait(60)

    def main():
        assert worker_in_scope.wait(60)
        try:
            register_layer_kernel(kernel_name="FastGelu", layer=TanhGeluKernel, device="cpu")
            register_external_layer(Gelu, "FastGelu")
            kernelize_model(model, mode="inference", device="cpu", use_fallback=False)
        finally:
            main_done.set()

    with scoped_registry() as scope:
        join_worker, join_main = _thread(worker), _thread(main)
        join_main()
        join_worker()
    assert uses_tanh(model[1])
    assert "FastGelu" in scope.layer_kernel_names()


def test_threads_keep_the_scope_they_were_started_in_not_one_opened_later_elsewhere():
    started, other_opened = threading.Event(), threading.Event()
    release_other = threading.Event()
    seen = []

    def child():
        started.set()
        assert other_opened.wait(60)
        seen.append(get_registry())
        _thread(lambda: seen.append(get_registry()))()  # and so does a thread it starts

    def other():
        with scoped_registry(inherit=False) as b:
            seen.append(b)
            other_opened.set()
            assert release_other.wait(60)

    with scoped_registry() as a:
        register_layer_kernel(kernel_name="FastGelu", layer=TanhGeluKernel, device="cpu")
        join_child = _thread(child)
        assert started.wait(60)
        join_other = _thread(other)
        try:
            join_child()
        finally:
            release_other.set()
        join_other()
    b, child_saw, grandchild_saw = seen
    assert child_saw is a and grandchild_saw is a and a is not b
    assert "FastGelu" in child_saw.layer_kernel_names()


def test_a_scope_opened_after_a_thread_started_does_not_reach_it():
    go = threading.Event()
    seen = []

    def child():
        assert go.wait(60)
        seen.append(get_registry())

    outer = get_registry()
    join = _thread(child)
    with scoped_registry() as later:
        go.set()
        join()
    assert seen == [outer] and seen[0] is not later


def _kernelize_gelus():
    """A fresh model kernelized with whatever registry is in effect here; whether it took FastGelu."""
    model = model_with_gelus()
    kernelize_model(model, mode="inference", device="cpu", use_fallback=False)
    return uses_tanh(model[1])


def _register_fast_gelu():
    register_layer_kernel(kernel_name="FastGelu", layer=TanhGeluKernel, device="cpu")
    register_external_layer(Gelu, "FastGelu")


def test_a_pool_started_inside_a_scope_does_not_keep_it_for_later_tasks():
    outer = get_registry()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        with scoped_registry() as scope:
            _register_fast_gelu()
            # the pool starts its worker here, inside the scope
            assert pool.submit(get_registry).result(timeout=60) is scope
            assert pool.submit(_kernelize_gelus).result(timeout=60)
        # submitted after the block ended, from outside any scope: the dead scope's kernels are gone
        assert pool.submit(get_registry).result(timeout=60) is outer
        assert not pool.submit(_kernelize_gelus).result(timeout=60)
        assert list(pool.map(lambda _: get_registry(), range(2))) == [outer, outer]


def test_a_task_sees_the_scope_it_was_submitted_in_whenever_the_pool_started():
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        outer = pool.submit(get_registry).result(timeout=60)  # the worker starts outside any scope
        with scoped_registry() as scope:
            assert pool.submit(get_registry).result(timeout=60) is scope
            with scoped_registry(inherit=False) as inner:
                assert pool.submit(get_registry).result(timeout=60) is inner
        assert pool.submit(get_registry).result(timeout=60) is outer is get_registry()


def test_asyncios_default_executor_sees_the_scope_of_each_call_not_of_its_first():
    async def main():
        loop = asyncio.get_running_loop()
        with scoped_registry() as scope:
            _register_fast_gelu()
            # the loop's default executor is created, and starts its threads, here
            in_scope = await loop.run_in_executor(None, get_registry)
            took_in_scope = await loop.run_in_executor(None, _kernelize_gelus)
        after = await loop.run_in_executor(None, get_registry)
        took_after = await loop.run_in_executor(None, _kernelize_gelus)
        after_to_thread = await asyncio.to_thread(get_registry)
        return scope, in_scope, took_in_scope, after, took_after, after_to_thread

    outer = get_registry()
    scope, in_scope, took_in_scope, after, took_after, after_to_thread = asyncio.run(main())
    assert in_scope is scope and took_in_scope
    assert after is outer and after_to_thread is outer and not took_after


def test_registering_a_function_kernel_imports_and_runs_nothing(tmp_path, monkeypatch):
    (tmp_path / "twinkle_unimported_ops.py").write_text(
        "import torch\nCALLS = []\n\ndef add(a, b):\n    CALLS.append(1)\n    return a + b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    register_function_kernel(func_name="add", target_module="twinkle_unimported_ops", func_impl=torch.add, device="cpu")
    assert "twinkle_unimported_ops" not in sys.modules  # the docstring's promise: nothing is imported here
    import twinkle_unimported_ops

    assert twinkle_unimported_ops.CALLS == []
    del sys.modules["twinkle_unimported_ops"]


def test_every_registry_starts_with_the_graph_rewrites_and_a_scope_removes_one_for_itself():
    with scoped_registry(inherit=False) as registry:
        assert registry.graph_rewrite_names() == ["causal_attention", "gqa_attention", "fused_projections",
                                                  "decode_gemv", "decode_cache", "residual_norm", "embedding_grad",
                                                  "scaled_gradient", "matmul_sums", "topk"]
        before = registry.generation
        registry.remove_graph_rewrite("fused_projections")
        assert registry.generation > before  # a compiled graph built with it hears of the change
        with scoped_registry() as inner:
            assert not inner.has_graph_rewrite("fused_projections")  # inherited
            inner.add_graph_rewrite("fused_projections")
            assert inner.has_graph_rewrite("fused_projections")
        assert registry.graph_rewrite_names() == ["causal_attention", "gqa_attention", "decode_gemv", "decode_cache",
                                                  "residual_norm", "embedding_grad", "scaled_gradient",
                                                  "matmul_sums", "topk"]
    assert get_registry().has_graph_rewrite("fused_projections")


def test_an_unknown_graph_rewrite_names_the_known_ones():
    with scoped_registry() as registry:
        for name in ("gqa", None):
            with pytest.raises(ValueError, match=rf"{name!r} is not a graph rewrite .*'gqa_attention'.*'fused_projections'"):
                registry.remove_graph_rewrite(name)
        assert registry.graph_rewrite_names() == ["causal_attention", "gqa_attention", "fused_projections",
                                                  "decode_gemv", "decode_cache", "residual_norm", "embedding_grad",
                                                  "scaled_gradient", "matmul_sums", "topk"]
