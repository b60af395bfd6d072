// merge-factors: chains of primal factors on a tangent become one factor.
#include "tests/pass_helpers.h"

#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "runtime/executable.h"

namespace jvpc {
namespace {
using test::f32;

// t·f(a)·g(b) with f(a), g(b) intermediates: both free once merged.
struct Chain {
  Graph g;
  Value *t, *fa, *gb;
  Chain(std::vector<int64_t> fa_shape, c10::ScalarType dt = c10::kFloat) {
    auto m = [&](std::vector<int64_t> s) { return TensorMeta::contiguous(std::move(s), dt, c10::kCPU); };
    Value* a = g.add_input("a", m(fa_shape), Role::Primal, true);
    Value* b = g.add_input("b", m({4, 8}), Role::Primal, true);
    t = g.add_input("dt", m({4, 8}), Role::Tangent);
    Builder bld(g);
    fa = bld.call("aten::sin", {a});
    gb = bld.call("aten::cos", {b});
  }
  Value* product() {
    Builder bld(g);
    return bld.call("aten::mul.Tensor", {bld.call("aten::mul.Tensor", {t, fa}), gb});
  }
  /// Runs merge-factors, which must change the graph; it still verifies, and computes what it
  /// did before on random inputs, up to float32 rounding (a norm-wise check: elementwise,
  /// t·a − t·b against t·(a − b) differs by an ulp of the terms where they cancel, which failed
  /// now and then in CI).
  void merge() {
    std::unique_ptr<Graph> before = g.clone();
    EXPECT_TRUE(merge_factors(g));
    verify(g);
    std::vector<at::Tensor> in;
    for (const Input& i : g.inputs()) in.push_back(at::randn(i.value->meta().sizes));
    EXPECT_LT(test::rel_error(Executable(g.clone()).run(in)[0], Executable(std::move(before)).run(in)[0]), 1e-6);
  }
};

TEST(MergeFactors, MergesTwoPrimalFactorsIntoOne) {
  Chain c({4, 8});
  c.g.add_output(c.product());
  c.merge();
  // Now mul(dt, mul(sin(a), cos(b))): one multiplication reads the tangent.
  const Node* out = c.g.outputs()[0]->producer();
  ASSERT_EQ(out->op(), "aten::mul.Tensor") << to_text(c.g);
  EXPECT_EQ(out->input(0), c.t);
  EXPECT_EQ(out->input(1)->producer()->op(), "aten::mul.Tensor");
  EXPECT_EQ(test::count_op(c.g, "aten::mul.Tensor"), 2);
}

// (t·2)·sin(a) -> t·(2·sin(a)), so the scaling is not a pass over the tangent per call (leaky_relu_
// after a scaling).
TEST(MergeFactors, MergesANumberIntoAFactor) {
  Chain c({4, 8});
  Builder bld(c.g);
  c.g.add_output(bld.call("aten::mul.Tensor", {bld.call("aten::mul.Scalar", {c.t, 2.0}), c.fa}));
  c.merge();
  EXPECT_EQ(test::count_op(c.g, "aten::mul.Tensor"), 1);
  const Node* out = c.g.outputs()[0]->producer();
  EXPECT_EQ(out->input(0), c.t);
  EXPECT_EQ(out->input(1)->producer()->op(), "aten::mul.Scalar") << to_text(c.g);
}

// t·sin(a) − t·cos(b) -> t·(sin(a) − cos(b)): one product per call, one residual.
TEST(MergeFactors, FactorsATangentOutOfASum) {
  Chain c({4, 8});
  Builder bld(c.g);
  c.g.add_output(bld.call("aten::sub.Tensor",
                          {bld.call("aten::mul.Tensor", {c.t, c.fa}), bld.call("aten::mul.Tensor", {c.gb, c.t})}));
  c.merge();
  const Node* out = c.g.outputs()[0]->producer();
  ASSERT_EQ(out->op(), "aten::mul.Tensor") << to_text(c.g);
  EXPECT_EQ(out->input(0), c.t);
  EXPECT_EQ(out->input(1)->producer()->op(), "aten::sub.Tensor");
}

// alpha given as the float 1.0 is alpha 1, as the integer 1 is.
TEST(MergeFactors, TakesAFloatAlphaOfOneAsOne) {
  Chain c({4, 8});
  Builder bld(c.g);
  c.g.add_output(bld.call("aten::add.Tensor",
                          {bld.call("aten::mul.Tensor", {c.t, c.fa}), bld.call("aten::mul.Tensor", {c.gb, c.t}), 1.0}));
  c.merge();
  EXPECT_EQ(test::count_op(c.g, "aten::mul.Tensor"), 1) << to_text(c.g);
}

TEST(MergeFactors, LeavesChainsWhoseMergedFactorTakesMoreBytes) {
  // sin(a) is [4, 1] and the other factor the primal input b, which the graph only aliases:
  // a merged [4, 8] factor would be a new residual.
  Graph g;
  Value* a = g.add_input("a", f32({4, 1}), Role::Primal, true);
  Value* b = g.add_input("b", f32({4, 8}), Role::Primal, true);
  Value* t = g.add_input("dt", f32({4, 8}), Role::Tangent);
  Builder bld(g);
  g.add_output(bld.call("aten::mul.Tensor", {bld.call("aten::mul.Tensor", {t, bld.call("aten::sin", {a})}), b}));
  EXPECT_FALSE(merge_factors(g));
}

// x.t()·r with x a primal input: the view of x is the caller's bytes, not a residual of its
// own; merging would make a new [n, d] residual where there was an [n, 1] one.
TEST(MergeFactors, CountsAViewOfAnInputAsNoBytes) {
  Graph g;
  Value* x = g.add_input("x", f32({8, 4}), Role::Primal, true);
  Value* a = g.add_input("a", f32({4, 1}), Role::Primal, true);
  Value* t = g.add_input("dt", f32({4, 8}), Role::Tangent);
  Builder bld(g);
  Value* xt = bld.call("aten::t", {x});
  g.add_output(bld.call("aten::mul.Tensor", {bld.call("aten::mul.Tensor", {t, xt}), bld.call("aten::sin", {a})}));
  EXPECT_FALSE(merge_factors(g)) << to_text(g);
}

TEST(MergeFactors, LeavesFactorsBothReadElsewhereOnTheTangentSide) {
  Chain c({4, 8});
  c.g.add_output(c.product());
  Builder bld(c.g);
  c.g.add_output(bld.call("aten::add.Tensor",
                          {bld.call("aten::mul.Tensor", {c.t, c.fa}), bld.call("aten::mul.Tensor", {c.t, c.gb})}));
  EXPECT_FALSE(merge_factors(c.g)) << to_text(c.g);
}

TEST(MergeFactors, LeavesAnInnerProductReadTwice) {
  Chain c({4, 8});
  Builder bld(c.g);
  Value* inner = bld.call("aten::mul.Tensor", {c.t, c.fa});
  c.g.add_output(bld.call("aten::mul.Tensor", {inner, c.gb}));
  c.g.add_output(inner);
  EXPECT_FALSE(merge_factors(c.g));
}

TEST(MergeFactors, LeavesFloat16Alone) {  // a float16 product of the factors may overflow
  Chain c({4, 8}, c10::kHalf);
  c.g.add_output(c.product());
  EXPECT_FALSE(merge_factors(c.g));
}

// SwiGLU, silu(x·w1)·(x·w2): the tangent of x·w1 is multiplied by silu'(x·w1)·(x·w2), one
// residual, and nothing else multiplies it.
TEST(MergeFactors, SwigluHoldsOneFactorPerTerm) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{at::silu(at::mm(x[0], x[1])) * at::mm(x[0], x[2])};
  };
  std::vector<TraceInput> in = {{"x", at::randn({16, 32})}, {"w1", at::randn({32, 64})}, {"w2", at::randn({32, 64})}};
  LinearizeOptions only_x;
  only_x.wrt = {"x"};
  Linearized lin = linearize(fn, in, only_x);
  // mm, mm, two products with residuals, add: 5 nodes; 2 residuals of [16, 64] (silu(a) and
  // silu'(a)·b) besides the aliased weights.
  EXPECT_EQ(lin.tangent_graph->nodes().size(), 5u) << to_text(*lin.tangent_graph);
  EXPECT_EQ(lin.report.tangent.residual_bytes, 2 * 16 * 64 * 4) << to_text(*lin.tangent_graph);
  at::Tensor dx = at::randn({16, 32});
  at::Tensor ref = forward_ad_jvp(fn, {in[0].value, in[1].value, in[2].value}, {dx, std::nullopt, std::nullopt}).at(0);
  EXPECT_LT(test::rel_error(lin.jvp({dx}).at(0), ref), 1e-5);
}

// The numbers docs/design.md quotes: a SwiGLU block with an RMS norm after it, linearized in x,
// with merge-factors and without it (LinearizeOptions::disabled_passes).
TEST(MergeFactors, SwigluRmsNormBlockHoldsFewerResidualBytes) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    at::Tensor y = at::mm(at::silu(at::mm(x[0], x[1])) * at::mm(x[0], x[2]), x[3]);
    return std::vector<at::Tensor>{y * at::rsqrt(y.pow(2).mean({-1}, true) + 1e-6) * x[4]};
  };
  std::vector<TraceInput> in = {{"x", at::randn({16, 32})},
                                {"w1", at::randn({32, 64})},
                                {"w2", at::randn({32, 64})},
                                {"w3", at::randn({64, 32})},
                                {"g", at::randn({32})}};
  LinearizeOptions only_x;
  only_x.wrt = {"x"};
  Linearized merged = linearize(fn, in, only_x);
  only_x.disabled_passes = {"merge-factors"};
  Linearized unmerged = linearize(fn, in, only_x);
  EXPECT_EQ(unmerged.tangent_graph->nodes().size(), 14u) << to_text(*unmerged.tangent_graph);
  EXPECT_EQ(unmerged.report.tangent.residual_bytes, 16512);  // 16.1 KiB
  EXPECT_EQ(merged.tangent_graph->nodes().size(), 12u) << to_text(*merged.tangent_graph);
  EXPECT_EQ(merged.report.tangent.residual_bytes, 12352);  // 12.1 KiB
  at::Tensor dx = at::randn({16, 32});
  EXPECT_LT(test::rel_error(merged.jvp({dx}).at(0), unmerged.jvp({dx}).at(0)), 1e-5);
}

}  // namespace
}  // namespace jvpc