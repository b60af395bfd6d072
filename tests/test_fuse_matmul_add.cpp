// fuse-matmul-add: a product plus an addend becomes one baddbmm or addmm.
#include "tests/pass_helpers.h"

#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "runtime/executable.h"

namespace jvpc {
namespace {
using test::f32;

TEST(FuseMatmulAdd, SumOfTwoBmmsBecomesBaddbmm) {
  Graph g;
  Value* a = g.add_input("a", f32({2, 3, 4}), Role::Primal);
  Value* c = g.add_input("c", f32({2, 4, 5}), Role::Primal);
  Builder b(g);
  Value* p = b.call("aten::bmm", {a, c});
  Value* q = b.call("aten::bmm", {a, c});
  g.add_output(b.call("aten::add.Tensor", {p, q}));
  EXPECT_TRUE(fuse_matmul_add(g));
  verify(g);
  EXPECT_EQ(test::count_op(g, "aten::baddbmm"), 1);
  EXPECT_EQ(test::count_op(g, "aten::bmm"), 1);
  EXPECT_EQ(test::count_op(g, "aten::add.Tensor"), 0);
}

TEST(FuseMatmulAdd, ABroadcastBiasBecomesTheSelfOfAddmm) {
  Graph g;
  Value* a = g.add_input("a", f32({3, 4}), Role::Primal);
  Value* c = g.add_input("c", f32({4, 5}), Role::Primal);
  Value* bias = g.add_input("bias", f32({5}), Role::Tangent);
  Builder b(g);
  g.add_output(b.call("aten::add.Tensor", {bias, b.call("aten::mm", {a, c})}));
  EXPECT_TRUE(fuse_matmul_add(g));
  verify(g);
  ASSERT_EQ(test::count_op(g, "aten::addmm"), 1) << to_text(g);
  EXPECT_EQ(g.outputs()[0]->producer()->op(), "aten::addmm");
  EXPECT_EQ(g.outputs()[0]->producer()->input(0), bias);
  Executable exe(g.clone());
  at::Tensor x = at::randn({3, 4}), y = at::randn({4, 5}), z = at::randn({5});
  // addmm rounds once where mm then add rounds twice: entries near 0 differ by ~1e-7, past
  // allclose's default atol of 1e-8 (a CI flake); atol 1e-6, as test_group_bmm compares float32
  EXPECT_TRUE(exe.run({x, y, z})[0].allclose(x.mm(y) + z, 1e-5, 1e-6));
}

TEST(FuseMatmulAdd, LeavesProductsThatTheAddBroadcasts) {
  Graph g;  // mm [1,5] + [3,5]: the result is larger than the product, which addmm cannot do
  Value* a = g.add_input("a", f32({1, 4}), Role::Primal);
  Value* c = g.add_input("c", f32({4, 5}), Role::Primal);
  Value* d = g.add_input("d", f32({3, 5}), Role::Primal);
  Builder b(g);
  g.add_output(b.call("aten::add.Tensor", {b.call("aten::mm", {a, c}), d}));
  EXPECT_FALSE(fuse_matmul_add(g));
}

TEST(FuseMatmulAdd, KeepsProductsOthersRead) {
  Graph g;
  Value* a = g.add_input("a", f32({3, 4}), Role::Primal);
  Value* c = g.add_input("c", f32({4, 3}), Role::Primal);
  Builder b(g);
  Value* p = b.call("aten::mm", {a, c});
  g.add_output(b.call("aten::add.Tensor", {p, p}));
  g.add_output(p);
  EXPECT_FALSE(fuse_matmul_add(g));
}

}  // namespace
}  // namespace jvpc
