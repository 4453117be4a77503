"""A function registered in a user package: caught where it is called, in a copy of it in another
module, and (opt-in, ``match_anywhere=True``) where the same computation is written inline, with
each call's own eps read from the graph. A kernel that fails on a match's shapes is never installed."""

import logging
import re
from collections import Counter

import expecttest
import torch
from compile_kernels import EPS_SEEN, fast_scaled_rms
from log_records import describe, records_at
from user_ops.blocks import BiasAdd, CopyThenCall, TwoNorms

import twinkle_fx
from twinkle_fx.core.reasons import ReasonKind
from twinkle_fx.function import register_function_kernel
from twinkle_fx.testing import record_graphs


def aot_op_counts(code: str) -> dict[str, int]:
    """``{"aten.addmm": 1, ...}``: how often each op is called in an AOT graph's code."""
    return dict(Counter(re.findall(r"torch\.ops\.(\w+\.\w+)\.", code)))


def _register(**kwargs):
    register_function_kernel(func_name="scaled_rms", target_module="user_ops.norms", func_impl=fast_scaled_rms,
                             device="cpu", **kwargs)


class TestUserFunction(expecttest.TestCase):
    def test_both_sites_swapped_with_their_own_eps(self):
        _register(mode="compile", match_anywhere=True)
        torch.manual_seed(0)
        model = TwoNorms().eval()
        x = torch.randn(2, 3, 8)
        EPS_SEEN.clear()
        with torch.no_grad(), record_graphs() as graphs:
            got = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})(x)
            want = model(x)
        torch.testing.assert_close(got, want)
        self.assertEqual(sorted(set(EPS_SEEN)), [1e-5, 1e-3])
        self.assertExpectedInline(graphs.diff(context=0), """\
@@
-        pow_1: "f32[2, 3, 8]" = l_x_.pow(2)
-        variance: "f32[2, 3, 1]" = pow_1.mean(-1, keepdim = True);  pow_1 = None
+        func_scaled_rms: "f32[2, 3, 8]" = twinkle_func_scaled_rms(l_x_, l_self_parameters_w1_);  l_x_ = l_self_parameters_w1_ = None
@@
-        add: "f32[2, 3, 1]" = variance + 1e-05;  variance = None
-        rsqrt: "f32[2, 3, 1]" = torch.rsqrt(add);  add = None
-        mul: "f32[2, 3, 8]" = l_x_ * rsqrt;  l_x_ = rsqrt = None
-        h: "f32[2, 3, 8]" = l_self_parameters_w1_ * mul;  l_self_parameters_w1_ = mul = None
+        h_1: "f32[2, 3, 8]" = torch._C._nn.linear(func_scaled_rms, l_self_modules_proj_parameters_weight_, l_self_modules_proj_parameters_bias_);  func_scaled_rms = l_self_modules_proj_parameters_weight_ = l_self_modules_proj_parameters_bias_ = None
@@
-        h_1: "f32[2, 3, 8]" = torch._C._nn.linear(h, l_self_modules_proj_parameters_weight_, l_self_modules_proj_parameters_bias_);  h = l_self_modules_proj_parameters_weight_ = l_self_modules_proj_parameters_bias_ = None
-
-        pow_2: "f32[2, 3, 8]" = h_1.pow(2)
-        variance_1: "f32[2, 3, 1]" = pow_2.mean(-1, keepdim = True);  pow_2 = None
-
-        add_1: "f32[2, 3, 1]" = variance_1 + 0.001;  variance_1 = None
-        rsqrt_1: "f32[2, 3, 1]" = torch.rsqrt(add_1);  add_1 = None
-        mul_2: "f32[2, 3, 8]" = h_1 * rsqrt_1;  h_1 = rsqrt_1 = None
-        mul_3: "f32[2, 3, 8]" = l_self_parameters_w2_ * mul_2;  l_self_parameters_w2_ = mul_2 = None
-        return (mul_3,)
+        func_scaled_rms_1: "f32[2, 3, 8]" = twinkle_func_scaled_rms_1(h_1, l_self_parameters_w2_);  h_1 = l_self_parameters_w2_ = None
+        return (func_scaled_rms_1,)
""")
        # the AOT graph by op counts (its text changes with every torch release): both norms are the
        # kernel's custom op, with each call's own eps, and nothing of the reference is left
        counts = aot_op_counts(graphs.forward[0])
        self.assertEqual(counts.get("twinkle_test.scaled_rms"), 2)
        self.assertEqual([op for op in counts if op in ("aten.pow", "aten.mean", "aten.rsqrt")], [])
        self.assertEqual(sorted(re.findall(r"scaled_rms\.default\([^)]*, ([\de.-]+)\)", graphs.forward[0])),
                         ["0.001", "1e-05"])

    def test_by_default_only_calls_and_copies_are_swapped(self):
        _register(mode="compile")
        with torch.no_grad():
            report = twinkle_fx.explain(TwoNorms().eval(), torch.randn(2, 3, 8))
        # the inline computation in TwoNorms.forward is no call: not even a candidate
        self.assertEqual([(r.swapped, r.match) for r in report.regions], [(True, "call")])
        EPS_SEEN.clear()
        torch.manual_seed(0)
        model = CopyThenCall().eval()
        x = torch.randn(2, 3, 8)
        with torch.no_grad():
            report = twinkle_fx.explain(model, x)
            got = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})(x)
            torch.testing.assert_close(got, model(x))
        self.assertEqual(sorted((r.match, r.swapped) for r in report.regions), [("call", True), ("copy", True)])
        self.assertIn("matched a copy", report.summary())
        self.assertEqual(sorted(set(EPS_SEEN)), [1e-6, 1e-4])

    def test_inference_only_kernel_is_not_used_for_training(self):
        _register(mode="train+compile")
        model = TwoNorms()
        report = twinkle_fx.explain(model, torch.randn(2, 8))
        self.assertEqual(len(report.swapped), 0)
        self.assertEqual({r.reason.kind for r in report.not_swapped}, {ReasonKind.NO_KERNEL})


def traced_targets() -> list[str]:
    """The registered function targets whose pattern the backend traced (kept on their registrations)."""
    return sorted({r.target for r in twinkle_fx.get_registry().all_function_registrations() if "pattern" in r.compile_cache})


class TestOnlyPatternsThatCouldMatchAreTraced(expecttest.TestCase):
    def test_functions_called_nowhere_in_the_graph_are_not_traced(self):
        # rolled is called nowhere; copies.scaled_rms is named like the function called, but that call
        # is a registered target's own, with a kernel: neither pattern is traced
        _register(mode="compile")
        register_function_kernel(func_name="rolled", target_module="user_ops.norms", func_impl=_rolled_kernel,
                                 device="cpu")
        register_function_kernel(func_name="scaled_rms", target_module="user_ops.copies", func_impl=fast_scaled_rms,
                                 device="cpu", mode="compile")
        with torch.no_grad():
            report = twinkle_fx.explain(TwoNorms().eval(), torch.randn(2, 3, 8))
        self.assertEqual([(r.target, r.swapped, r.match) for r in report.regions],
                         [("user_ops.norms.scaled_rms", True, "call")])
        self.assertEqual(traced_targets(), ["user_ops.norms.scaled_rms"])

    def test_a_function_of_the_same_name_is_traced_where_it_is_the_only_kernel_for_a_call(self):
        register_function_kernel(func_name="scaled_rms", target_module="user_ops.copies", func_impl=fast_scaled_rms,
                                 device="cpu", mode="compile")
        with torch.no_grad():
            report = twinkle_fx.explain(TwoNorms().eval(), torch.randn(2, 3, 8))
        self.assertEqual([(r.target, r.swapped, r.match) for r in report.regions],
                         [("user_ops.copies.scaled_rms", True, "copy")])
        self.assertEqual(traced_targets(), ["user_ops.copies.scaled_rms"])


def _rolled_kernel(x, shift=1):
    return torch.roll(x, shift, -1).mul(2)


_rolled_kernel.can_torch_compile = True


class TestConstantGuard(expecttest.TestCase):
    def test_a_call_with_another_int_constant_is_kept_and_reported(self):
        register_function_kernel(func_name="rolled", target_module="user_ops.norms", func_impl=_rolled_kernel,
                                 device="cpu")
        from user_ops.blocks import Rolls

        with torch.no_grad():
            report = twinkle_fx.explain(Rolls(), torch.randn(2, 8))
        outcome = sorted((r.swapped, r.reason and r.reason.kind) for r in report.regions)
        self.assertEqual(outcome, [(False, ReasonKind.NOT_EQUIVALENT), (True, None)])


def _strict_add(x, y):
    """A kernel without broadcasting, like many hand-written elementwise kernels."""
    if x.shape != y.shape:
        raise ValueError(f"strict_add: shapes {list(x.shape)} and {list(y.shape)} differ")
    return x + y


def _strict_add_opaque(x, y):
    return _strict_add(x, y)


_strict_add.can_torch_compile = True


class TestFailingKernelIsNeverInstalled(expecttest.TestCase):
    def _check(self, kernel):
        register_function_kernel(func_name="add", target_module="user_ops.norms", func_impl=kernel, device="cpu",
                                 match_anywhere=True)
        torch.manual_seed(0)
        model = BiasAdd()
        x = torch.randn(2, 3, 8)
        with torch.no_grad():
            report = twinkle_fx.explain(model, x)
            got = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})(x)
            torch.testing.assert_close(got, model(x))  # the compiled model runs where eager runs
        outcome = sorted((r.match, r.swapped, r.reason and r.reason.kind) for r in report.regions)
        self.assertEqual(outcome, [("call", True, None), ("computation", False, ReasonKind.KERNEL_FAILED)])
        # the kernel's own error is kept with the reason, and which trial it failed is said
        (kept,) = report.not_swapped
        self.assertIsInstance(kept.reason.exception, ValueError)
        self.assertIn(self.trial, str(kept.reason))

    def test_traceable_kernel_failing_on_fake_inputs(self):
        self.trial = "fake tensors of the region's shapes"
        self._check(_strict_add)

    def test_opaque_kernel_failing_on_the_matched_shapes(self):
        self.trial = "random inputs of the region's shapes"
        self._check(_strict_add_opaque)

    def test_a_kernel_failing_inside_a_fake_tensor_op_is_kept_without_an_error_record(self):
        # fake tensors log an op that fails on them at ERROR before raising; the backend expects such failures
        # when it tries a kernel on fake tensors, keeps the region and says why: the user sees no traceback
        def mm_of_mismatched_shapes(x, y):
            rows = x.reshape(-1, x.shape[-1])
            return torch.mm(rows, rows) + y  # [n, d] @ [n, d]: mm's shape check fails unless n == d

        mm_of_mismatched_shapes.can_torch_compile = True
        register_function_kernel(func_name="add", target_module="user_ops.norms", func_impl=mm_of_mismatched_shapes,
                                 device="cpu", match_anywhere=True)
        with records_at(logging.ERROR) as errors, torch.no_grad():
            report = twinkle_fx.explain(BiasAdd(), torch.randn(2, 3, 8))
        self.assertEqual({(r.swapped, r.reason and r.reason.kind) for r in report.regions},
                         {(False, ReasonKind.KERNEL_FAILED)})
        self.assertIn("must have same reduction dim", str(report.not_swapped[0].reason))  # mm's own check
        self.assertFalse(errors, describe(errors))

    def test_a_one_op_function_does_not_take_every_add_by_default(self):
        register_function_kernel(func_name="add", target_module="user_ops.norms", func_impl=_strict_add, device="cpu")
        with torch.no_grad():
            report = twinkle_fx.explain(BiasAdd(), torch.randn(2, 3, 8))
        self.assertEqual([(r.match, r.swapped) for r in report.regions], [("call", True)])
