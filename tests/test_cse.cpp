#include "tests/pass_helpers.h"

namespace jvpc {
namespace {
using test::f32;

TEST(Cse, MergesRepeatedComputations) {
  Graph g;
  Value* x = g.add_input("x", f32({4, 3}), Role::Primal);
  Builder b(g);
  Value* a = b.call("aten::transpose.int", {x, 0, 1});
  Value* c = b.call("aten::transpose.int", {x, 0, 1});
  g.add_output(b.call("aten::add.Tensor", {a, c}));
  EXPECT_TRUE(cse(g));
  EXPECT_EQ(test::count_op(g, "aten::transpose.int"), 1);
  const Node* add = g.nodes().back();
  EXPECT_EQ(add->input(0), add->input(1));
  verify(g);
}

// x·dx and dx·x (a product rule of x·x) are one product; x − y and y − x, and sums with
// alpha ≠ 1, are not.
TEST(Cse, MergesCommutedProductsAndSumsOnly) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Value* y = g.add_input("y", f32({4}), Role::Primal);
  Builder b(g);
  g.add_output(b.call("aten::mul.Tensor", {x, y}));
  g.add_output(b.call("aten::mul.Tensor", {y, x}));
  g.add_output(b.call("aten::add.Tensor", {x, y}));
  g.add_output(b.call("aten::add.Tensor", {y, x}));
  g.add_output(b.call("aten::sub.Tensor", {x, y}));
  g.add_output(b.call("aten::sub.Tensor", {y, x}));
  g.add_output(b.call("aten::add.Tensor", {x, y, 2}));
  g.add_output(b.call("aten::add.Tensor", {y, x, 2}));
  EXPECT_TRUE(cse(g));
  const auto& o = g.outputs();
  EXPECT_EQ(o[0], o[1]);
  EXPECT_EQ(o[2], o[3]);
  EXPECT_NE(o[4], o[5]);
  EXPECT_NE(o[6], o[7]);
  verify(g);
}

TEST(Cse, KeepsDifferentArgumentsApart) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  g.add_output(b.call("aten::mul.Scalar", {x, 0.5}));
  g.add_output(b.call("aten::mul.Scalar", {x, 0.50000000000000011}));
  EXPECT_FALSE(cse(g));
  EXPECT_EQ(g.num_nodes(), 2u);
}

TEST(Cse, NeverMergesRandomNodes) {
  Graph g;
  Builder b(g);
  g.add_output(b.call("aten::rand", {std::vector<int64_t>{4}}));
  g.add_output(b.call("aten::rand", {std::vector<int64_t>{4}}));
  EXPECT_FALSE(cse(g));
  EXPECT_EQ(g.num_nodes(), 2u);
}

}  // namespace
}  // namespace jvpc
