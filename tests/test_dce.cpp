#include "tests/pass_helpers.h"

namespace jvpc {
namespace {
using test::f32;

TEST(Dce, RemovesUnreadNodesAndKeepsTheRest) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  Value* a = b.call("aten::exp", {x});
  b.call("aten::neg", {b.call("aten::sin", {x})});  // unread chain
  g.add_output(a);
  EXPECT_TRUE(dce(g));
  EXPECT_EQ(g.num_nodes(), 1u);
  EXPECT_EQ(g.nodes()[0]->op(), "aten::exp");
  EXPECT_FALSE(dce(g));
  verify(g);
}

TEST(Dce, KeepsImpureNodes) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  b.call("aten::rand", {std::vector<int64_t>{4}});
  g.add_output(x);
  EXPECT_FALSE(dce(g));
  EXPECT_EQ(g.num_nodes(), 1u);
}

TEST(Dce, RemovesUnreadConstantsAndOptionallyPrimals) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  g.add_input("unused", f32({4}), Role::Primal);
  g.add_constant("c", at::ones({4}));
  g.add_input("dx", f32({4}), Role::Tangent);
  g.add_output(x);
  EXPECT_TRUE(dce(g));
  EXPECT_EQ(g.inputs().size(), 3u);  // x, unused primal, dx: tangents and primals stay by default
  EXPECT_TRUE(dce(g, true));
  ASSERT_EQ(g.inputs().size(), 2u);
  EXPECT_EQ(g.inputs()[0].name, "x");  // an output
  EXPECT_EQ(g.inputs()[1].name, "dx");
}

}  // namespace
}  // namespace jvpc
