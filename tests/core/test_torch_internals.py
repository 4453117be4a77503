"""One test per accessor of :mod:`twinkle_fx.core.torch_internals`: twinkle_fx reaches private torch,
Dynamo and Inductor names only through these, so a torch upgrade that moves one fails here, by name."""

import logging

import pytest
import torch
import torch.nn.functional as F

from twinkle_fx.core import torch_internals as ti


class Capture:
    """A backend that runs ``check`` inside the compile and keeps the graphs."""

    def __init__(self, check=None):
        self.check = check
        self.graphs = []
        self.results = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        if self.check is not None:
            self.results.append(self.check(gm, example_inputs))
        return gm.forward


def _capture(fn, *args, check=None):
    capture = Capture(check)
    torch.compile(fn, backend=capture)(*args)
    return capture


# --- Inductor ---------------------------------------------------------------------------------------


def test_inductor_config_values_lists_nested_keys_and_is_a_copy():
    values = ti.inductor_config_values()
    # the backend checks options={"inductor": {...}} against these keys, nested ones dotted
    assert isinstance(values["max_autotune"], bool)
    assert "triton.cudagraphs" in values
    values["max_autotune"] = "changed"
    assert ti.inductor_config_values()["max_autotune"] != "changed"


def test_inductor_config_patch_applies_inside_the_block_only():
    before = ti.inductor_config_values()["max_autotune"]
    with ti.inductor_config_patch({"max_autotune": not before}):
        assert ti.inductor_config_values()["max_autotune"] is (not before)
    assert ti.inductor_config_values()["max_autotune"] is before


def test_inductor_cudagraphs_requested_reads_the_patched_config():
    with ti.inductor_config_patch({"triton.cudagraphs": True}):
        assert ti.inductor_cudagraphs_requested() is True
    with ti.inductor_config_patch({"triton.cudagraphs": False}):
        assert ti.inductor_cudagraphs_requested() is False


def test_inductor_mode_options_expands_a_mode_and_names_them_all():
    assert ti.inductor_mode_options("max-autotune-no-cudagraphs")["max_autotune"] is True
    assert {"reduce-overhead", "max-autotune", "default"} <= set(ti.inductor_mode_options())


def test_inductor_compile_hands_each_graph_to_the_inner_compiler():
    from functorch.compile import make_boxed_func

    seen = []

    def inner(gm, example_inputs, **kwargs):
        seen.append(gm)
        return make_boxed_func(gm.forward)

    gm = torch.fx.symbolic_trace(lambda x: (x * 2).sin())
    x = torch.randn(4)
    compiled = ti.inductor_compile(gm, [x], inner_compile=inner, config_patches=None)
    torch.testing.assert_close(compiled(x), (x * 2).sin())
    assert len(seen) == 1


def test_inductor_inner_compiler_is_compile_fx_inner():
    inner = ti.inductor_inner_compiler()
    assert callable(inner) and inner.__name__ == "compile_fx_inner"


def test_cudagraphs_logger_is_the_logger_of_cudagraph_skips():
    logger = ti.cudagraphs_logger()
    assert isinstance(logger, logging.Logger) and "cudagraph" in logger.name


def test_cudagraph_tree_manager_is_none_where_nothing_recorded():
    # no CUDA graph was recorded on device 99 (or at all, on the CPU), and asking creates none
    assert ti.cudagraph_tree_manager(99) is None


def test_is_inductor_tensor_box():
    import torch._inductor.ir as ir

    assert ti.is_inductor_tensor_box(ir.TensorBox.__new__(ir.TensorBox))
    assert not ti.is_inductor_tensor_box(torch.empty(2))


def test_generate_ttir_is_what_the_launch_analysis_runs_and_can_be_replaced():
    pytest.importorskip("triton")
    from torch._higher_order_ops import triton_kernel_wrap

    original = ti.generate_ttir()
    assert callable(original) and original is triton_kernel_wrap.generate_ttir

    def stand_in(*args, **kwargs):
        return original(*args, **kwargs)

    try:
        ti.set_generate_ttir(stand_in)
        assert ti.generate_ttir() is stand_in and triton_kernel_wrap.generate_ttir is stand_in
    finally:
        ti.set_generate_ttir(original)
    assert triton_kernel_wrap.generate_ttir is original


# --- Dynamo -----------------------------------------------------------------------------------------


def test_static_input_marks_and_sources_of_graph_inputs():
    linear = torch.nn.Linear(4, 4)
    (gm,) = _capture(linear, torch.randn(2, 4)).graphs
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    static = [n for n in placeholders if ti.is_static_input(n)]
    assert len(static) == 2 and len(placeholders) == 3  # weight and bias, not the input
    assert all("weight" in ti.dynamo_source(n).name or "bias" in ti.dynamo_source(n).name for n in static)
    ti.clear_static_input(static[0])
    assert not ti.is_static_input(static[0]) and ti.is_static_input(static[1])


def test_dynamo_source_is_none_for_a_node_without_one():
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    assert ti.dynamo_source(next(iter(gm.graph.find_nodes(op="placeholder")))) is None


def test_dynamo_graph_break_counts_counts_each_break():
    def fn(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    before = sum(ti.dynamo_graph_break_counts().values())
    _capture(fn, torch.randn(3))
    assert sum(ti.dynamo_graph_break_counts().values()) > before


def test_checkpoint_operator_is_what_dynamo_records_for_a_checkpoint():
    def fn(x):
        return torch.utils.checkpoint.checkpoint(lambda y: y.sin().cos(), x, use_reentrant=False)

    (gm,) = _capture(fn, torch.randn(3, requires_grad=True)).graphs
    assert any(n.target is ti.checkpoint_operator() for n in gm.graph.nodes)


def test_compiling_translator_sees_the_frame_being_compiled():
    def fn(x):
        return x + 1

    capture = _capture(fn, torch.randn(2), check=lambda gm, _: ti.compiling_translator())
    assert capture.results[0].f_code is fn.__code__ and ti.compiling_translator() is None


def test_current_compile_context_is_set_while_compiling_only():
    capture = _capture(lambda x: x * 3, torch.randn(2), check=lambda gm, _: ti.current_compile_context())
    assert capture.results[0] is not None and ti.current_compile_context() is None


def test_same_compile_invocation_keeps_the_generation_cuda_graph_trees_read():
    from torch._inductor.cudagraph_trees import CUDAGraphTreeManager

    before = CUDAGraphTreeManager.get_curr_generation()
    torch.compile(lambda x: x * 2, backend=Capture())(torch.randn(2))
    assert CUDAGraphTreeManager.get_curr_generation() != before  # a compiled call starts a generation
    before = CUDAGraphTreeManager.get_curr_generation()
    with ti.same_compile_invocation():
        torch.compile(lambda x: x * 2, backend=Capture())(torch.randn(2))
    assert CUDAGraphTreeManager.get_curr_generation() == before


def test_dynamo_backend_names_and_register_dynamo_backend():
    assert "inductor" in ti.dynamo_backend_names()
    capture = Capture()
    ti.register_dynamo_backend("twinkle_torch_internals_probe", capture)
    assert "twinkle_torch_internals_probe" in ti.dynamo_backend_names()
    torch.compile(lambda x: x - 1, backend="twinkle_torch_internals_probe")(torch.randn(2))
    assert len(capture.graphs) == 1


def test_shorten_traceback_base_passes_a_backend_error_through_unwrapped():
    class BadOption(ValueError, ti.shorten_traceback_base()):
        def __init__(self, message):
            ValueError.__init__(self, message)
            self.first_useful_frame = None

    def backend(gm, example_inputs):
        raise BadOption("bad option")

    torch.compiler.reset()
    with pytest.raises(BadOption, match="bad option"):
        torch.compile(lambda x: x + 2, backend=backend)(torch.randn(2))


def test_aot_eager_runs_the_forward_compiler_it_is_given():
    forwards = []

    def fw(gm, example_inputs):
        forwards.append(gm)
        return ti.boxed_nop(gm, example_inputs)

    x = torch.randn(3)
    out = torch.compile(lambda t: t.exp() * 2, backend=lambda gm, inputs: ti.aot_eager(gm, inputs, fw_compiler=fw))(x)
    torch.testing.assert_close(out, x.exp() * 2)
    assert len(forwards) == 1


def test_boxed_nop_runs_the_graph_on_a_list_of_inputs():
    gm = torch.fx.symbolic_trace(lambda x: x + 5)
    compiled = ti.boxed_nop(gm, [torch.zeros(2)])
    assert getattr(compiled, "_boxed_call", False)
    assert compiled([torch.zeros(2)]).tolist() == [5.0, 5.0]


def test_optimize_ddp_reads_and_sets_dynamos_setting():
    saved = ti.optimize_ddp()
    try:
        ti.set_optimize_ddp(False)
        assert ti.optimize_ddp() is False
        ti.set_optimize_ddp("ddp_optimizer")
        assert ti.optimize_ddp() == "ddp_optimizer"
    finally:
        ti.set_optimize_ddp(saved)


def test_dynamo_config_patch_applies_inside_the_block_only():
    saved = ti.optimize_ddp()
    with ti.dynamo_config_patch({"optimize_ddp": not saved}):
        assert ti.optimize_ddp() is (not saved)
    assert ti.optimize_ddp() == saved


def test_ddp_ignored_names_are_set_read_and_put_back():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    assert ti.ddp_ignored_names(model) is None
    ti.ddp_ignore(model, ["0.weight"])
    assert ti.ddp_ignored_names(model) == ["0.weight"]
    # what DistributedDataParallel reads to leave a parameter out of its buckets
    assert getattr(model[0].weight, "_ddp_ignored", False) and not getattr(model[1].weight, "_ddp_ignored", False)
    ti.set_ddp_ignored_names(model, ["1.bias"])
    assert ti.ddp_ignored_names(model) == ["1.bias"]
    ti.set_ddp_ignored_names(model, None)
    assert ti.ddp_ignored_names(model) is None


def test_active_ddp_module_is_none_outside_a_ddp_forward():
    assert ti.active_ddp_module() is None


# --- nn.Module, fake tensors, the dispatcher ---------------------------------------------------------


def test_compiled_call_is_what_module_compile_installs_and_can_be_replaced():
    linear = torch.nn.Linear(2, 2)
    assert ti.compiled_call(linear) is None
    linear.compile(backend="eager")
    assert ti.compiled_call(linear) is not None
    ti.set_compiled_call(linear, lambda *args, **kwargs: "replaced")
    assert linear(torch.randn(1, 2)) == "replaced"


def test_fake_tensor_type_and_mode():
    mode = ti.fake_tensor_mode()
    with mode:
        made = torch.empty(3)
        from_real = torch.ones(2) + 1  # a real input is taken (and faked), not refused
    assert isinstance(made, ti.fake_tensor_type()) and isinstance(from_real, ti.fake_tensor_type())
    assert not isinstance(torch.empty(3), ti.fake_tensor_type())


def test_graph_targets_namespace_and_higher_order_ops():
    from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_functional

    assert ti.op_namespace(torch.ops.aten.mm.default) == "aten"
    assert ti.op_namespace(torch.ops.prims.convert_element_type.default) == "prims"
    assert ti.op_namespace(torch.ops.aten.mm) is None and ti.op_namespace(torch.matmul) is None  # a packet, a function
    assert ti.is_higher_order_op(triton_kernel_wrapper_functional)
    assert not ti.is_higher_order_op(torch.ops.aten.mm.default)


def test_known_equal_compares_sizes_without_a_guard():
    from torch.fx.experimental.proxy_tensor import make_fx

    assert ti.known_equal(3, 3) and not ti.known_equal(3, 4)
    seen = []

    def f(x):
        rows = x.shape[0]
        seen.append((ti.known_equal(rows, rows), ti.known_equal(rows * 2, rows + rows), ti.known_equal(rows, 5)))
        return x

    make_fx(f, tracing_mode="symbolic")(torch.ones(7, 2))
    assert seen == [(True, True, False)]  # 5 may be the size for another input: not known, and no guard made it so


def test_fake_tensor_logger_is_the_fake_tensor_modules_logger():
    assert ti.fake_tensor_logger() is logging.getLogger(ti.fake_tensor_type().__module__)


def test_nn_sdpa_and_nn_linear_are_the_targets_dynamo_records():
    q = torch.randn(1, 2, 4, 8)
    (gm,) = _capture(lambda a: F.scaled_dot_product_attention(a, a, a), q).graphs
    assert any(n.target is ti.nn_sdpa() for n in gm.graph.nodes)
    w = torch.randn(3, 8)
    (gm,) = _capture(lambda a: F.linear(a, w), torch.randn(2, 8)).graphs
    assert any(n.target is ti.nn_linear() for n in gm.graph.nodes)


@torch.library.custom_op("twinkle_torch_internals::records_grad", mutates_args=())
def _records_grad(x: torch.Tensor, inside: bool) -> torch.Tensor:
    leaf = x.detach().requires_grad_()
    if inside:
        with ti.autograd_inside_custom_op():
            return torch.tensor(float((leaf * 2).requires_grad))
    with torch.enable_grad():
        return torch.tensor(float((leaf * 2).requires_grad))


def test_autograd_inside_custom_op_records_where_enable_grad_alone_does_not():
    x = torch.randn(2, requires_grad=True)
    assert _records_grad(x, True).item() == 1.0
    assert _records_grad(x, False).item() == 0.0


def test_global_module_hooks_set():
    assert not ti.global_module_hooks_set()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)
    try:
        assert ti.global_module_hooks_set()
    finally:
        handle.remove()
    assert not ti.global_module_hooks_set()


def test_reparametrize_module_swaps_parameters_inside_the_block_only():
    linear = torch.nn.Linear(2, 2, bias=False)
    original = linear.weight
    with ti.reparametrize_module(linear, {"weight": torch.zeros(2, 2)}):
        assert linear(torch.ones(1, 2)).abs().sum().item() == 0.0
    assert linear.weight is original


def test_queue_backward_callback_runs_when_the_backward_ends():
    ran = []
    x = torch.randn(3, requires_grad=True)
    y = x * 2
    y.register_hook(lambda grad: ti.queue_backward_callback(lambda: ran.append(x.grad is not None)))
    y.sum().backward()
    assert ran == [True]  # after the whole backward: the leaf's gradient is already written


def test_dropout_classes_cover_torchs_dropout_modules():
    for cls in (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.AlphaDropout):
        assert isinstance(cls(0.1), ti.dropout_classes())
    assert not isinstance(torch.nn.Identity(), ti.dropout_classes())


def test_module_hook_dicts_are_live_views_of_a_modules_own_hooks():
    linear = torch.nn.Linear(2, 2)
    forward, pre, backward, backward_pre = ti.module_hook_dicts(linear)
    assert not any(ti.module_hook_dicts(linear))
    handles = [linear.register_forward_hook(lambda *a: None), linear.register_forward_pre_hook(lambda *a: None),
               linear.register_full_backward_hook(lambda *a: None),
               linear.register_full_backward_pre_hook(lambda *a: None)]
    assert all((forward, pre, backward, backward_pre))  # the dicts read before the hooks were added
    assert len(ti.module_hook_dicts(linear, backward=False)) == 2
    assert ti.has_forward_hooks(linear)
    for handle in handles:
        handle.remove()
    assert not any(ti.module_hook_dicts(linear)) and not ti.has_forward_hooks(linear)
    handle = linear.register_forward_pre_hook(lambda *a: None)
    assert not ti.has_forward_hooks(linear)  # a pre-hook sees the input, not the output
    handle.remove()


def test_pytree_flattens_nested_containers_and_model_outputs():
    from transformers.modeling_outputs import CausalLMOutput

    tree = {"a": [torch.ones(1), (2, torch.zeros(2))], "out": CausalLMOutput(logits=torch.ones(3))}
    leaves = ti.tree_leaves(tree)
    assert [x.shape if isinstance(x, torch.Tensor) else x for x in leaves] == [(1,), 2, (2,), (3,)]
    flat, spec = ti.tree_flatten(tree)
    assert len(flat) == 4 and spec == ti.tree_flatten({"a": [0, (0, 0)], "out": CausalLMOutput(logits=0)})[1]
    doubled = ti.tree_map_only(torch.Tensor, lambda t: t * 2, tree)
    assert doubled["a"][1][0] == 2 and doubled["out"].logits.sum().item() == 6.0


# --- tensors ----------------------------------------------------------------------------------------


def test_foreach_zero_zeroes_every_tensor_in_place():
    tensors = [torch.ones(3), torch.ones(2, 2, dtype=torch.float64)]
    storages = [t.data_ptr() for t in tensors]
    ti.foreach_zero(tensors)
    assert all(not t.any() for t in tensors) and [t.data_ptr() for t in tensors] == storages


def test_gemm_sm_carveout_is_set_and_cleared():
    ti.set_gemm_sm_carveout(8)
    try:
        assert torch._C._get_sm_carveout_experimental() == 8
    finally:
        ti.set_gemm_sm_carveout(None)
    assert torch._C._get_sm_carveout_experimental() is None


# --- CUDA graphs ------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_capture_cuda_graph_survives_another_threads_calls_and_leaves_a_failed_capture_behind():
    """Another thread pinning host memory (a data loader does) while a graph records does not spoil it; a capture
    spoiled by a host sync raises, and eager work on the ambient stream and random numbers go on after it."""
    import threading

    x = torch.randn(1024, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with ti.capture_cuda_graph(graph):
        y = x * 2
        pinner = threading.Thread(target=lambda: torch.empty(7 << 20, dtype=torch.uint8, pin_memory=True))
        pinner.start()
        pinner.join()
        y += 1
    x.fill_(3.0)
    graph.replay()
    torch.testing.assert_close(y, torch.full_like(x, 7.0))

    stream = torch.cuda.current_stream()
    with pytest.raises(Exception):
        with ti.capture_cuda_graph(torch.cuda.CUDAGraph()):
            if (x * 2).sum().item() > 0:  # a host sync: the capture is invalidated
                pass
    assert torch.cuda.current_stream() == stream
    torch.manual_seed(0)
    first = torch.rand(4, device="cuda")
    torch.manual_seed(0)
    torch.testing.assert_close(torch.rand(4, device="cuda"), first)


@pytest.mark.gpu
def test_capture_cuda_graph_is_not_spoiled_by_a_collection_that_frees_an_earlier_graph():
    """An earlier graph held only by a reference cycle that becomes garbage while another graph records: the
    collector does not run until the capture ends (a graph freed during it spoils it), then frees it."""
    import gc
    import weakref

    x = torch.randn(1024, device="cuda")
    old = torch.cuda.CUDAGraph()
    with ti.capture_cuda_graph(old):
        x.mul_(1.0)
    cycle = [old]
    cycle.append(cycle)
    freed = weakref.finalize(cycle[0], lambda: None)
    del old
    threshold = gc.get_threshold()
    gc.set_threshold(1)  # any allocation would start a collection
    try:
        graph = torch.cuda.CUDAGraph()
        with ti.capture_cuda_graph(graph):
            y = x * 2
            del cycle
            garbage = [[] for _ in range(1000)]
            assert freed.alive  # not collected during the capture
            y += 1
        assert gc.isenabled()  # on again (the next allocation may collect the cycle)
        del garbage
        gc.collect()
        assert not freed.alive
    finally:
        gc.set_threshold(*threshold)
    x.fill_(3.0)
    graph.replay()
    torch.testing.assert_close(y, torch.full_like(x, 7.0))


def test_fake_tensor_errors_inside_the_quiet_block_go_to_debug_in_that_thread_only():
    import threading

    from log_records import records_at

    from twinkle_fx.core.torch_internals import fake_tensor_mode, quiet_fake_tensor_errors

    def failing_mm():
        with fake_tensor_mode():
            try:
                torch.mm(torch.empty(6, 8), torch.empty(6, 8))
            except RuntimeError:
                pass

    ours = logging.getLogger("twinkle_fx.core.torch_internals")
    level = ours.level
    ours.setLevel(logging.DEBUG)
    with records_at(logging.DEBUG) as records:
        with quiet_fake_tensor_errors():
            failing_mm()  # quiet here
            other = threading.Thread(target=failing_mm)  # another thread, outside any quiet block: logged
            other.start()
            other.join()
        failing_mm()  # after the block: logged again
    ours.setLevel(level)
    errors = [r for r in records if r.levelno >= logging.ERROR]
    assert len(errors) == 2 and {r.thread for r in errors} == {other.ident, threading.get_ident()}
    handled = [r for r in records if r.name == "twinkle_fx.core.torch_internals"]
    assert len(handled) == 1 and "aten.mm.default" in handled[0].getMessage()
    assert handled[0].levelno == logging.DEBUG and "same reduction dim" in str(handled[0].exc_info[1])


# --- FSDP2 and symmetric memory ------------------------------------------------------------------------


def test_fsdp_unit_names_a_units_device_and_shard_group(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        fully_shard(model[0], mesh=init_device_mesh("cpu", (1,)))
        device, group = ti.fsdp_unit(model[0])
        assert device == torch.device("cpu") and group.size() == 1 and group.rank() == 0
        assert ti.fsdp_unit(model[1]) is None and ti.fsdp_unit(model) is None
    finally:
        dist.destroy_process_group()


def test_fsdp_comm_bases_are_what_fsdp2_takes_as_custom_collectives():
    all_gather, reduce_scatter = ti.fsdp_comm_bases()
    assert {"allocate", "__call__"} <= set(dir(all_gather)) and {"allocate", "__call__"} <= set(dir(reduce_scatter))
    from torch.distributed.fsdp import FSDPModule

    assert hasattr(FSDPModule, "set_custom_all_gather") and hasattr(FSDPModule, "set_custom_reduce_scatter")


def test_symmetric_memory_has_the_pool_and_the_rendezvous():
    symm_mem = ti.symmetric_memory()
    assert callable(symm_mem.get_mem_pool) and callable(symm_mem.rendezvous)


def test_donated_backward_inputs_are_saved_tensors_of_the_backward_being_compiled():
    assert ti.donated_backward_inputs() is None  # no compile running
    seen = []

    def backward_compiler(gm, inputs):
        seen.append((ti.donated_backward_inputs(), [n.name for n in gm.graph.find_nodes(op="placeholder")]))
        return ti.boxed_nop(gm, inputs)

    def backend(gm, inputs):
        return ti.aot_eager(gm, inputs, fw_compiler=ti.boxed_nop, bw_compiler=backward_compiler)

    x = torch.randn(5, 5, requires_grad=True)
    torch.compile(lambda x: (x @ x).sin().sum(), backend=backend)(x).backward()
    donated, placeholders = seen[0]
    assert [placeholders[i] for i in donated] == ["mm"]  # sin's saved input; not x's transpose (x's storage)
