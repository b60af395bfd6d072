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
