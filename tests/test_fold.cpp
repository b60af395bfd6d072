#include "tests/pass_helpers.h"

#include "compiler/api/linearize.h"

namespace jvpc {
namespace {
using test::f32;

// y = exp(x) * dx: exp(x) is primal-only and becomes a residual; the tangent path stays.
struct Small {
  Graph g;
  Value *x, *dx, *e, *y;
  Small() {
    x = g.add_input("x", f32({4}), Role::Primal, true);
    dx = g.add_input("dx", f32({4}), Role::Tangent);
    Builder b(g);
    e = b.call("aten::exp", {x});
    y = b.call("aten::mul.Tensor", {dx, e});
    g.add_output(y);
  }
};

TEST(Fold, PrimalValuesReadByTheTangentPathBecomeResiduals) {
  Small s;
  at::Tensor xv = at::randn({4});
  EXPECT_TRUE(fold(s.g, {{s.x->id(), xv}}));
  dce(s.g, true);
  ASSERT_EQ(s.g.num_nodes(), 1u);
  const Input& r = s.g.inputs().back();
  EXPECT_EQ(r.role, Role::Constant);
  EXPECT_TRUE(r.data.allclose(xv.exp()));
  EXPECT_TRUE(r.aliases.empty());
  verify(s.g);
}

TEST(Fold, ReusesKnownValuesInsteadOfRecomputing) {
  Small s;
  at::Tensor marker = at::full({4}, 42.0);  // not exp(x): proves the known value was used
  fold(s.g, {{s.x->id(), at::randn({4})}, {s.e->id(), marker}});
  EXPECT_TRUE(s.g.inputs().back().data.equal(marker));
}

TEST(Fold, MarksResidualsThatAliasAPrimalInput) {
  Graph g;
  Value* x = g.add_input("x", f32({2, 3}), Role::Primal, true);
  Value* dx = g.add_input("dx", f32({3, 2}), Role::Tangent);
  Builder b(g);
  g.add_output(b.call("aten::mm", {b.call("aten::t", {x}), b.call("aten::t", {dx})}));
  at::Tensor xv = at::randn({2, 3});
  fold(g, {{x->id(), xv}});
  const Input& r = g.inputs().back();
  EXPECT_EQ(r.aliases, "x");
  EXPECT_EQ(r.data.data_ptr(), xv.data_ptr());
}

TEST(Fold, LeavesGraphsWithoutPrimalWorkAlone) {
  Graph g;
  Value* dx = g.add_input("dx", f32({4}), Role::Tangent);
  Builder b(g);
  g.add_output(b.call("aten::neg", {dx}));
  EXPECT_FALSE(fold(g, {}));
}

TEST(Fold, NeedsAValueForEveryPrimalInput) {
  Small s;
  EXPECT_THROW(fold(s.g, {}), Error);
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
