// simplify-arith: multiplications by one, merged scales, and adds of zero where exact.
#include "tests/pass_helpers.h"

#include "runtime/executable.h"

#include <limits>

namespace jvpc {
namespace {
using test::f32;

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
