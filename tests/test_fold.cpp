// fold: primal-only values become residual constants. The graph tests as IR text in and checks
// on IR text out.
#include "ir/text.h"
#include "tests/filecheck.h"
#include "tests/pass_helpers.h"
#include "tests/same_structure.h"

#include "compiler/api/linearize.h"
#include "ir/cost/peak_bytes.h"

namespace jvpc {
namespace {
using test::f32;

// y = exp(x) * dx: exp(x) is primal-only and becomes a residual; the tangent path stays.
const char* kSmall = R"(
  graph(%0 : f32[4] x,
        %1 : f32[4] dx [tangent]):
    %2 : f32[4] = aten::exp(%0)
    %3 : f32[4] = aten::mul.Tensor(%1, %2)
    return (%3 out0))";

TEST(Fold, PrimalValuesReadByTheTangentPathBecomeResiduals) {
  auto g = parse_text(kSmall);
  at::Tensor xv = at::randn({4});
  EXPECT_TRUE(fold(*g, {{0, xv}}));
  EXPECT_TRUE(dce(*g, true));
  EXPECT_TRUE(test::filecheck(to_text(*g), R"(
    CHECK:      graph(%1 : f32[4] dx [tangent],
    CHECK-NEXT:       [[R:%[0-9]+]] : f32[4] {{[a-z0-9_]+}} [constant, stored]):
    CHECK-NEXT:   %3 : f32[4] = aten::mul.Tensor(%1, [[R]])
    CHECK-NEXT:   return (%3 out0)
  )"));
  EXPECT_TRUE(g->inputs().back().data.allclose(xv.exp()));
  verify(*g);
}

TEST(Fold, ReusesKnownValuesInsteadOfRecomputing) {
  auto g = parse_text(kSmall);
  at::Tensor marker = at::full({4}, 42.0);  // not exp(x): proves the known value was used
  fold(*g, {{0, at::randn({4})}, {2, marker}});
  EXPECT_TRUE(g->inputs().back().data.equal(marker));
}

TEST(Fold, MarksResidualsThatAliasAPrimalInput) {
  auto g = parse_text(R"(
    graph(%0 : f32[2,3] x,
          %1 : f32[3,2] dx [tangent]):
      %2 : f32[3,2]{1,3} = aten::t(%0)
      %3 : f32[2,3]{1,2} = aten::t(%1)
      %4 : f32[3,3] = aten::mm(%2, %3)
      return (%4 out0))");
  at::Tensor xv = at::randn({2, 3});
  EXPECT_TRUE(fold(*g, {{0, xv}}));
  EXPECT_TRUE(test::filecheck(to_text(*g), R"(
    CHECK:      [[R:%[0-9]+]] : f32[3,2]{1,3} {{[a-z0-9_]+}} [constant, stored, aliases x]):
    CHECK:      %4 : f32[3,3] = aten::mm([[R]], %3)
  )"));
  EXPECT_EQ(g->inputs().back().data.data_ptr(), xv.data_ptr());
}

TEST(Fold, NeedsAValueForEveryPrimalInput) {
  auto g = parse_text(kSmall);
  EXPECT_THROW(fold(*g, {}), Error);
}

// The split a program keeps: the primal output and the residual exp(x) go to the primal graph,
// which keeps the values' ids and names each residual after the constant that replaces it;
// what stays reads the residual from an unbound constant. A captured constant that the tangent
// node reads is a residual too, with constants_as_residuals.
TEST(Fold, SplitTakesThePrimalOutputsAndResidualsIntoThePrimalGraph) {
  auto g = parse_text(R"(
    graph(%0 : f32[4] x,
          %1 : f32[4] dx [tangent],
          %2 : f32[4] c0 [constant, stored]):
      %3 : f32[4] = aten::exp(%0)
      %4 : f32[4] = aten::mul.Tensor(%3, %2)
      %5 : f32[4] = aten::mul.Tensor(%1, %3)
      %6 : f32[4] = aten::mul.Tensor(%5, %2)
      return (%4 y, %6 dy))");
  g->inputs()[2].bind(at::randn({4}));
  PrimalSplit split = split_primal(*g, {/*primal_outputs=*/1, /*constants_as_residuals=*/true});
  ASSERT_TRUE(split.primal);
  EXPECT_EQ(split.residuals, (std::vector<std::string>{"r0", "r1"}));
  EXPECT_TRUE(test::filecheck(to_text(*split.primal), R"(
    CHECK:      graph(%0 : f32[4] x,
    CHECK-NEXT:       %2 : f32[4] c0 [constant, stored]):
    CHECK-NEXT:   %3 : f32[4] = aten::exp(%0)
    CHECK-NEXT:   %4 : f32[4] = aten::mul.Tensor(%3, %2)
    CHECK-NEXT:   return (%4 y, %3 r0, %2 r1)
  )"));
  EXPECT_TRUE(dce(*g, true));
  EXPECT_TRUE(test::filecheck(to_text(*g), R"(
    CHECK:      graph(%1 : f32[4] dx [tangent],
    CHECK-NEXT:       [[R0:%[0-9]+]] : f32[4] r0 [constant],
    CHECK-NEXT:       [[R1:%[0-9]+]] : f32[4] r1 [constant]):
    CHECK-NEXT:   %5 : f32[4] = aten::mul.Tensor(%1, [[R0]])
    CHECK-NEXT:   %6 : f32[4] = aten::mul.Tensor(%5, [[R1]])
    CHECK-NEXT:   return (%6 dy)
  )"));
  // Evaluated once at a point, the primal graph gives f(x) and the residuals.
  at::Tensor x = at::randn({4});
  std::vector<at::Tensor> out = evaluate_primal(*split.primal, {{0, x}});
  EXPECT_TRUE(out[0].allclose(x.exp() * split.primal->inputs()[1].data));
  EXPECT_TRUE(out[1].allclose(x.exp()));
}

// The primal graph's run holds what is live, not every temporary: along a chain of four exps of
// a 1 MiB tensor, at most two of them (the operand and the result) exist at once.
TEST(Fold, EvaluationReleasesEachTemporaryAfterItsLastRead) {
  auto g = parse_text(R"(
    graph(%0 : f32[262144] x):
      %1 : f32[262144] = aten::exp(%0)
      %2 : f32[262144] = aten::exp(%1)
      %3 : f32[262144] = aten::exp(%2)
      %4 : f32[262144] = aten::exp(%3)
      return (%4 y))");
  at::Tensor x = at::randn({262144}) * 0.01;
  std::vector<at::Tensor> out;
  int64_t peak = measured_peak_bytes([&] { out = evaluate_primal(*g, {{0, x}}); });
  EXPECT_LE(peak, 2 * x.nbytes() + 4096) << peak;
  EXPECT_TRUE(out[0].allclose(x.exp().exp().exp().exp()));
}

}  // namespace
}  // namespace jvpc

namespace jvpc {
namespace {

// The zeros a rule materializes for a tangent that is zero (here, the cached half of a cat) are
// made per call, not held as residuals (a KV cache's tangent would hold the cache's size in
// zeros).
TEST(Fold, ZerosOfATangentAreMadePerCallNotHeld) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{at::cat({x[1], x[0]}, 1).sum(-1)};
  };
  std::vector<TraceInput> in = {{"k", at::randn({2, 4, 8})}, {"cache", at::randn({2, 64, 8}), false}};
  Linearized lin = linearize(fn, in);
  EXPECT_EQ(lin.report.tangent.residual_bytes, 0) << to_text(*lin.tangent_graph);
  EXPECT_EQ(test::count_op(*lin.tangent_graph, "aten::zeros"), 1);
  at::Tensor dk = at::randn({2, 4, 8});
  at::Tensor want = at::cat({at::zeros({2, 64}), dk.sum(-1)}, 1);
  for (int call = 0; call < 2; ++call) EXPECT_TRUE(lin.jvp({dk})[0].allclose(want)) << call;
}

}  // namespace
}  // namespace jvpc
