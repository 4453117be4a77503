"""One test per accessor of :mod:`twinkle_fx.compiler.graph` (``dynamo`` and ``structure``): the backend reads
Dynamo's internals only through these, so a torch upgrade that changes one fails here, by name."""

import copy

import torch
import torch.nn.functional as F

from twinkle_fx.compiler.graph import dynamo as di
from twinkle_fx.compiler.graph import structure


class Norm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(8))
        self.eps = 1e-5

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.layers = torch.nn.ModuleList([Norm(), Norm()])

    def forward(self, x):
        h = _helper(self.proj(x))
        for layer in self.layers:
            h = layer(h)
        return self.layers[0](h)  # a repeated call of one instance


def _helper(x):
    return F.silu(x)


class Capture:
    """A backend that runs a check inside the compile (where the frame is at hand) and keeps the graphs."""

    def __init__(self, check=None):
        self.graphs = []
        self.check = check
        self.results = []

    def __call__(self, gm, example_inputs):
        self.graphs.append((gm, example_inputs))
        if self.check is not None:
            self.results.append(self.check(gm, example_inputs))
        return gm.forward


def _compiled(model, check=None, *args):
    capture = Capture(check)
    torch.compile(model, backend=capture)(*(args or (torch.randn(2, 8),)))
    return capture


def test_module_stack_ids_sources_classes_and_repeat_calls():
    model = Block()
    (gm, _), = _compiled(model).graphs
    frames = [di.module_stack(n) for n in gm.graph.nodes if n.op == "call_function"]
    innermost = {(f[-1].cls, f[-1].location) for f in frames if f}
    assert (torch.nn.Linear, "proj") in innermost
    assert (Norm, "layers.0") in innermost and (Norm, "layers.1") in innermost
    repeat = [f[-1] for f in frames if f and "@" in f[-1].key]
    assert repeat and repeat[0].location == "layers.0@1" and repeat[0].instance_id == id(model.layers[0])
    assert all(f.local for fs in frames for f in fs)
    assert di.module_stack(next(n for n in gm.graph.nodes if n.op == "output")) == []


def test_parent_class_from_the_stack_or_the_compiled_frame():
    model = torch.nn.Sequential(Block())

    def check(gm, _):
        lookup = di.module_lookup()
        parents = {}
        for node in gm.graph.nodes:
            stack = di.module_stack(node)
            for i, frame in enumerate(stack):
                parents[frame.location] = (di.parent_class(stack, i), di.parent_class(stack, i, lookup))
        return parents

    parents, = _compiled(model, check).results
    assert parents["0.proj"] == (Block, Block)  # the enclosing entry of the stack
    # a ModuleList is never called, so it is not on the stack: only the frame knows it
    assert parents["0.layers.1"] == (None, torch.nn.ModuleList)
    assert parents["0.layers.0@1"] == (None, torch.nn.ModuleList)
    # the compiled root is on the stack or not depending on how Dynamo entered it (L['fn'] here;
    # transformers' decorated forwards enter as L['self'] without it): either way it is found
    assert parents["0"][1] is torch.nn.Sequential and parents["0"][0] in (None, torch.nn.Sequential)
    assert parents.get("<root>", (None, None)) == (None, None)  # the root has no parent


def test_example_value_real_input_and_input_source():
    model = Block()

    def check(gm, _):  # Dynamo drops its graph-input records once the backend returns: read them inside
        sources = {di.input_source(n): n for n in gm.graph.nodes if n.op == "placeholder"}
        weight = sources["L['self']._modules['proj']._parameters['weight']"]
        fake = torch._subclasses.fake_tensor.FakeTensorMode().from_tensor(model.proj.weight)
        return di.example_value(weight).shape, di.real_input(weight, fake) is model.proj.weight, di.real_input(weight, 3)

    (shape, real, passthrough), = _compiled(model, check).results
    assert shape == (8, 8)
    assert real  # DDP's fake bucket inputs: the real parameter
    assert passthrough == 3


def test_parse_source_forms():
    ref = di.parse_source("L['self']._modules['layers']._modules['0']._parameters['weight']")
    assert (ref.scope, ref.name, ref.modules, ref.member, ref.attribute) == ("L", "self", ("layers", "0"), "parameter", "weight")
    ref = di.parse_source("G['model'].layers[1].norm.eps")
    assert (ref.scope, ref.name, ref.modules, ref.member) == ("G", "model", ("layers", "1", "norm", "eps"), None)
    assert di.parse_source("L['self']._buffers['inv_freq']").member == "buffer"
    assert di.parse_source("not a source") is None and di.parse_source(None) is None
    ref = di.parse_source("L['args'][0]._modules['layers']._modules['1']._parameters['weight']")
    assert (ref.root, ref.modules, ref.attribute) == (("L", "args", (0,)), ("layers", "1"), "weight")


def _forwards_through_args(forward):
    """A decorator like transformers' ``deprecate_kwarg``: the module reaches the frame as ``args[0]``."""
    import functools

    @functools.wraps(forward)
    def wrapper(*args, **kwargs):
        return forward(*args, **kwargs)

    return wrapper


class WrappedBlock(Block):
    forward = _forwards_through_args(Block.forward)


def test_lifted_attribute_reads_a_float_attribute_of_the_module_at_the_owner_path():
    norm = torch.nn.Module()
    norm.inner = torch.nn.Module()
    norm.inner.eps = 1e-6
    owner = "L['self'].layers.0.norm"
    assert di.lifted_attribute("L['self'].layers.0.norm.inner.eps", owner, norm, torch.tensor(1e-5, dtype=torch.float64)) \
        == ("inner.eps", 1e-5)  # the graph's value, not the module's
    assert di.lifted_attribute("L['self'].layers.0.norm.inner.eps", owner, norm, 2.0) == ("inner.eps", 2.0)
    assert di.lifted_attribute(owner, owner, norm, 2.0) is None  # the module itself
    assert di.lifted_attribute("L['self'].layers.1.norm.inner.eps", owner, norm, 2.0) is None  # another module
    assert di.lifted_attribute("L['self'].layers.0.norm._parameters['weight']", owner, norm, 2.0) is None
    assert di.lifted_attribute("L['self'].layers.0.norm.missing", owner, norm, 2.0) is None
    assert di.lifted_attribute(None, owner, norm, 2.0) is None


def test_a_root_reached_through_args_has_the_paths_of_a_root_reached_as_self():
    model = WrappedBlock()

    def check(gm, _):
        lookup = di.module_lookup()
        found = {}
        for node in gm.graph.nodes:
            for frame in di.module_stack(node):
                found[frame.location] = (frame.source, lookup.find(frame))
        return found, lookup.heap_scans

    (found, scans), = _compiled(model, check).results
    assert found["layers.1"][0].startswith("L['args'][0]")  # how Dynamo names it: not under L['self']
    assert found["proj"][1] is model.proj and found["layers.1"][1] is model.layers[1]
    assert scans == 0  # resolved from the frame's args, not by a heap walk


def test_a_root_reached_through_a_bound_method_has_the_paths_under_it():
    """``torch.compile(module.forward)`` of a module whose forward is torch's own: Dynamo enters a wrapper, and
    the module is ``L['fn'].__self__``; the locations are the paths under it, the lookup still finds each one."""
    model = torch.nn.Sequential(Norm(), torch.nn.Sequential(Norm()))

    def check(gm, _):
        lookup = di.module_lookup()
        return {frame.location: (frame.source, lookup.find(frame))
                for node in gm.graph.nodes for frame in di.module_stack(node)}

    (found,) = _compiled(model.forward, check).results
    assert found["1.0"][0] == "L['fn'].__self__.1.0"  # how Dynamo names it
    assert set(found) == {"0", "1", "1.0"}
    assert found["0"][1] is model[0] and found["1.0"][1] is model[1][0]


def test_source_paths_fold_bound_method_hops():
    assert di.parse_source("L['fn'].__self__.layers.1").path == "layers.1"
    assert di.parse_source("L['self'].layers.0.forward.__self__.norm").path == "layers.0.norm"
    assert di.parse_source("L['self']").path == ""


def test_graph_break_reason_and_user_stack():
    def fn(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    capture = _compiled(fn, None, torch.randn(3))
    first, second = (structure.graph_break(gm) for gm, _ in capture.graphs)
    assert second is None  # the resumed graph ends normally
    assert first.user_stack[-1].name == "fn" and first.user_stack[-1].filename == __file__
    assert "graph_break" in first.reason.lower() or "graph break" in first.reason.lower()


def test_graph_breaks_counted_and_step_unsupported_named_by_them():
    from torch._dynamo.utils import counters

    structure.graph_breaks_counted()  # settle what was counted before
    counters["graph_break"]["Dynamic shape operator\n  Explanation: nonzero"] += 1
    counted = structure.graph_breaks_counted()
    assert counted == ["Dynamic shape operator"] and structure.graph_breaks_counted() == []

    class Reason:
        reason = "step_unsupported"
        graph_break = True
        user_stack = []

    gm = torch.fx.symbolic_trace(torch.nn.Identity())
    gm.compile_subgraph_reason = Reason()
    assert structure.graph_break(gm, counted).reason == "Dynamic shape operator"
    assert structure.graph_break(gm, []).reason == "step_unsupported"


def test_compiled_code_is_the_frame_being_compiled():
    model = Block()
    (code,), outside = _compiled(model, lambda gm, _: structure.compiled_code()).results, structure.compiled_code()
    assert code is Block.forward.__code__ and outside is None


def test_stack_frames_and_is_erased():
    (gm, _), = _compiled(Block()).graphs
    silu = next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is F.silu)
    names = [f.name for f in di.stack_frames(silu)]
    assert names[-2:] == ["forward", "_helper"] and di.stack_frames(silu)[-1].filename == __file__
    assert not di.is_erased(silu)
    silu.replace_all_uses_with(silu.args[0])
    gm.graph.erase_node(silu)
    assert di.is_erased(silu)


def test_provenance_copies_where_a_node_came_from():
    (gm, _), = _compiled(Block()).graphs
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and di.module_stack(n)]
    meta = di.provenance(nodes[0])
    assert set(meta) <= {"nn_module_stack", "stack_trace", "source_fn_stack"} and "nn_module_stack" in meta
    shared = di.common_provenance(nodes)
    assert list(shared["nn_module_stack"]) == []  # proj and the norms share no module


def test_module_lookup_resolves_from_the_compiled_frame_without_a_heap_scan():
    model = Block()

    def check(gm, _):
        lookup = di.module_lookup()
        found = {}
        for node in gm.graph.nodes:
            for frame in di.module_stack(node):
                found[frame.location] = lookup.find(frame)
        return found, lookup.heap_scans, lookup is di.module_lookup()

    capture = _compiled(model, check)
    (found, scans, shared), = capture.results
    assert found["proj"] is model.proj and found["layers.1"] is model.layers[1] and found["layers.0@1"] is model.layers[0]
    assert scans == 0 and shared  # one lookup per frame compile, every graph of it shares it


def test_module_lookup_outside_a_compile_scans_the_heap_once_per_class():
    model = Block()
    (gm, _), = _compiled(model).graphs
    lookup = di.module_lookup()  # no frame is being compiled now
    frames = [f for n in gm.graph.nodes for f in di.module_stack(n) if f.cls is Norm]
    assert {id(lookup.find(f)) for f in frames} == {id(model.layers[0]), id(model.layers[1])}
    assert lookup.heap_scans == 1
    wrong_class = di.ModuleFrame(frames[0].key, frames[0].source, torch.nn.Linear)
    assert lookup.find(wrong_class) is None


class Checkpointed(torch.nn.Module):
    """A block whose body runs under torch.utils.checkpoint, as transformers' decoder layers do."""

    def __init__(self):
        super().__init__()
        self.norm = Norm()

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self._body, x.relu(), use_reentrant=False) + 1

    def _body(self, h):
        return self.norm(h).sin()


def test_checkpoint_bodies_and_their_operands():
    def check(gm, example_inputs):
        found, = structure.checkpoint_bodies(gm)
        passed = {n.op: n for n in found.inputs.values()}  # body placeholder -> what the outer graph passes
        return found, passed, di.input_source(passed.get("placeholder"))

    (found, passed, source), = _compiled(Checkpointed(), check).results
    assert found.body is getattr(found.call.graph.owning_module, found.attribute)
    assert found.call.args[1:] == found.operands and len(found.inputs) == 2
    assert "relu" in str(passed["call_method"].target)  # a value computed in the outer graph
    assert source == "L['self']._modules['norm']._parameters['weight']"  # a graph input
    classes = {frame.cls for node in found.body.graph.nodes for frame in di.module_stack(node)}
    assert Norm in classes  # the body's nodes keep their module stack


def test_detach_checkpoint_bodies_gives_the_graph_its_own_copy():
    (gm, _), = _compiled(Checkpointed()).graphs
    original, = structure.checkpoint_bodies(gm)
    original.body.meta["policy"] = "kept"
    reference = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))  # as verify's snapshot shares submodules
    structure.detach_checkpoint_bodies(gm)
    detached, = structure.checkpoint_bodies(gm)
    assert detached.body is not original.body and detached.body.meta == {"policy": "kept"}
    sin, = [n for n in detached.body.graph.nodes if n.target in (torch.sin, "sin")]
    sin.target = torch.cos if sin.op == "call_function" else "cos"  # a rewrite of the detached body
    detached.body.recompile()
    assert any(n.target in (torch.sin, "sin") for n in original.body.graph.nodes)
    assert getattr(reference, original.attribute) is original.body  # the reference keeps the body as traced
