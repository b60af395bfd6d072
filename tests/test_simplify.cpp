// simplify-views and simplify-arith.
#include "tests/pass_helpers.h"

#include "runtime/executable.h"

#include <limits>

namespace jvpc {
namespace {
using test::f32;
using test::run;

TEST(SimplifyViews, RemovesIdentityExpandAndCollapsesViewChains) {
  Graph g;
  Value* x = g.add_input("x", f32({1, 5, 128, 64}), Role::Primal);
  Builder b(g);
  Value* e = b.call("aten::expand", {x, std::vector<int64_t>{1, 5, 128, 64}});
  Value* v = b.call("aten::view", {e, std::vector<int64_t>{5, 128, 64}});
  Value* w = b.call("aten::view", {v, std::vector<int64_t>{640, 64}});
  g.add_output(w);
  EXPECT_TRUE(simplify_views(g));
  ASSERT_EQ(g.num_nodes(), 1u) << to_text(g);
  EXPECT_EQ(g.nodes()[0]->op(), "aten::view");
  EXPECT_EQ(g.nodes()[0]->input(0), x);
  EXPECT_FALSE(simplify_views(g));
  verify(g);
}

TEST(SimplifyViews, DoubleTransposeIsTheIdentity) {
  Graph g;
  Value* x = g.add_input("x", f32({2, 3, 4}), Role::Primal);
  Builder b(g);
  Value* t = b.call("aten::transpose.int", {b.call("aten::transpose.int", {x, -1, 0}), 0, 2});
  g.add_output(b.call("aten::exp", {t}));
  EXPECT_TRUE(simplify_views(g));
  EXPECT_EQ(g.nodes().back()->input(0), x);
}

TEST(SimplifyViews, KeepsRealReshapes) {
  Graph g;
  Value* x = g.add_input("x", f32({2, 3}), Role::Primal);
  Builder b(g);
  g.add_output(b.call("aten::expand", {x, std::vector<int64_t>{4, 2, 3}}));
  g.add_output(b.call("aten::clone", {b.call("aten::t", {x})}));  // a copy of a non-contiguous view
  EXPECT_FALSE(simplify_views(g));
  EXPECT_EQ(g.num_nodes(), 3u);
}

TEST(SimplifyArith, RemovesMultiplicationByOneAndMergesScales) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  Value* a = b.call("aten::mul.Scalar", {x, 1.0});
  Value* c = b.call("aten::mul.Scalar", {b.call("aten::mul.Scalar", {a, 0.5}), 4.0});
  g.add_output(c);
  EXPECT_TRUE(simplify_arith(g));
  ASSERT_EQ(g.num_nodes(), 1u) << to_text(g);
  EXPECT_EQ(g.nodes()[0]->input(0), x);
  EXPECT_EQ(g.nodes()[0]->arg(1).value.toDouble(), 2.0);
  verify(g);
}

TEST(SimplifyArith, KeepsPromotingMultiplications) {
  Graph g;
  Value* x = g.add_input("x", TensorMeta::contiguous({4}, c10::kLong, c10::kCPU), Role::Primal);
  Builder b(g);
  g.add_output(b.call("aten::mul.Scalar", {x, 1.0}));  // long * 1.0 is float
  EXPECT_FALSE(simplify_arith(g));
}

// x + 0.0 is not x when x is -0.0 (1/x would change sign); x + (-0.0) and
// x - 0.0 are. Scales that cancel leave no multiplication.
TEST(SimplifyArith, AddsOfZeroGoOnlyWhereExact) {
  Graph g;
  Value* x = g.add_input("x", f32({2}), Role::Primal);
  Builder b(g);
  g.add_output(b.call("aten::reciprocal", {b.call("aten::add.Scalar", {x, 0.0})}));
  g.add_output(b.call("aten::add.Scalar", {x, -0.0}));
  g.add_output(b.call("aten::sub.Scalar", {x, 0.0}));
  g.add_output(b.call("aten::mul.Scalar", {b.call("aten::mul.Scalar", {x, 1000.0}), 0.001}));
  EXPECT_TRUE(simplify_arith(g));
  dce(g);
  verify(g);
  EXPECT_EQ(g.outputs()[1], x);
  EXPECT_EQ(g.outputs()[2], x);
  EXPECT_EQ(g.outputs()[3], x) << to_text(g);
  at::Tensor xv = at::tensor({-0.0f, 1.0f});
  EXPECT_TRUE(Executable(g.clone()).run({xv})[0].equal(at::tensor({std::numeric_limits<float>::infinity(), 1.0f})));
}

}  // namespace
}  // namespace jvpc

namespace jvpc {
namespace {

// Writes through views leave slice_scatter/select_scatter nodes, and reads of the written part
// or of the rest (a rotary embedding's tangent has them).
TEST(SimplifyViews, ReadsAroundAScatterReadItsSourceOrItsBase) {
  Graph g;
  Value* base = g.add_input("base", test::f32({4, 6}), Role::Primal);
  Value* src = g.add_input("src", test::f32({4, 2}), Role::Primal);
  Value* row = g.add_input("row", test::f32({6}), Role::Primal);
  Builder b(g);
  Value* sc = b.call("aten::slice_scatter", {base, src, 1, 2, 4, 1});
  g.add_output(b.call("aten::slice.Tensor", {sc, -1, 2, 4, 1}));            // the source
  g.add_output(b.call("aten::slice.Tensor", {sc, 1, 4, std::nullopt, 1}));  // the base's
  g.add_output(b.call("aten::slice.Tensor", {sc, 1, 1, 3, 1}));             // overlaps: kept
  Value* sel = b.call("aten::select_scatter", {base, row, 0, -1});
  g.add_output(b.call("aten::select.int", {sel, 0, 3}));  // the source
  g.add_output(b.call("aten::select.int", {sel, 0, 0}));  // the base's
  std::unique_ptr<Graph> before = g.clone();
  EXPECT_TRUE(simplify_views(g));
  verify(g);
  EXPECT_EQ(g.outputs()[0], src);
  EXPECT_EQ(g.outputs()[1]->producer()->input(0), base);
  EXPECT_EQ(g.outputs()[2]->producer()->input(0)->producer()->op(), "aten::slice_scatter");
  EXPECT_EQ(g.outputs()[3], row);
  EXPECT_EQ(g.outputs()[4]->producer()->input(0), base);
  std::vector<at::Tensor> in = {at::randn({4, 6}), at::randn({4, 2}), at::randn({6})};
  auto want = Executable(std::move(before)).run(in), got = Executable(g.clone()).run(in);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i].equal(want[i])) << i;
}

TEST(SimplifyViews, AnAddOfTwoViewsIsAViewOfTheAdd) {
  Graph g;
  Value* x = g.add_input("x", f32({2, 6, 3}), Role::Primal);
  Value* y = g.add_input("y", f32({2, 6, 3}), Role::Primal);
  Builder b(g);
  std::vector<int64_t> s = {4, 3, 3};
  g.add_output(b.call("aten::add.Tensor", {b.call("aten::view", {x, s}), b.call("aten::view", {y, s}), 2.0}));
  std::vector<at::Tensor> in = {at::randn({2, 6, 3}), at::randn({2, 6, 3})};
  at::Tensor before = run(g, in)[0];
  EXPECT_TRUE(simplify_views(g));
  verify(g);
  const Node* out = g.outputs()[0]->producer();
  ASSERT_EQ(out->op(), "aten::view") << to_text(g);
  EXPECT_EQ(out->input(0)->producer()->op(), "aten::add.Tensor");
  EXPECT_EQ(out->input(0)->meta().sizes, (std::vector<int64_t>{2, 6, 3}));
  EXPECT_TRUE(run(g, in)[0].equal(before));
}

}  // namespace
}  // namespace jvpc
