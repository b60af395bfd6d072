// merge-factors through linearize: the residuals SwiGLU blocks hold. The pass on graphs:
// tests/ir/merge_factors.ir.
#include "tests/pass_helpers.h"

#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "runtime/executable.h"

namespace jvpc {
namespace {
using test::f32;

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