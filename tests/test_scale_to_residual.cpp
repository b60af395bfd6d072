// scale-to-residual: a scale of a tangent operand moves onto the primal operand of its product.
#include "tests/pass_helpers.h"

#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "runtime/executable.h"

namespace jvpc {
namespace {
using test::f32;

TEST(ScaleToResidual, MovesTheTangentScaleOntoThePrimalOperand) {
  Graph g;
  Value* k = g.add_input("k", f32({5, 64, 128}), Role::Primal, true);
  Value* dq = g.add_input("dq", f32({1, 5, 128, 64}), Role::Tangent);
  Builder b(g);
  Value* s = b.call("aten::mul.Scalar", {dq, 0.125});
  Value* v = b.call("aten::view", {s, std::vector<int64_t>{5, 128, 64}});
  g.add_output(b.call("aten::bmm", {v, k}));
  EXPECT_TRUE(scale_to_residual(g));
  verify(g);
  // Now: bmm(view(dq), mul(k, 0.125)); the multiplication reads only the primal k.
  const Node* bmm = g.nodes().back();
  ASSERT_EQ(bmm->op(), "aten::bmm") << to_text(g);
  EXPECT_EQ(bmm->input(0)->producer()->op(), "aten::view");
  EXPECT_EQ(bmm->input(0)->producer()->input(0), dq);
  EXPECT_EQ(bmm->input(1)->producer()->op(), "aten::mul.Scalar");
  EXPECT_EQ(bmm->input(1)->producer()->input(0), k);
  EXPECT_EQ(test::count_op(g, "aten::mul.Scalar"), 1);
}

TEST(ScaleToResidual, LeavesScalesOfTwoTangentOperandsAlone) {
  Graph g;
  Value* da = g.add_input("da", f32({3, 4}), Role::Tangent);
  Value* db = g.add_input("db", f32({4, 5}), Role::Tangent);
  Builder b(g);
  g.add_output(b.call("aten::mm", {b.call("aten::mul.Scalar", {da, 2.0}), db}));
  EXPECT_FALSE(scale_to_residual(g));
}

// (x.expand({2, 3}) * 2).view({6}): the product is contiguous, the expanded tangent is not, so
// the view cannot sink below the scaling.
TEST(ScaleToResidual, LeavesViewsTheUnscaledLayoutCannotTake) {
  Graph g;
  Value* dx = g.add_input("dx", f32({3}), Role::Tangent);
  Builder b(g);
  Value* e = b.call("aten::expand", {dx, std::vector<int64_t>{2, 3}});
  Value* s = b.call("aten::mul.Scalar", {e, 2.0});
  g.add_output(b.call("aten::view", {s, std::vector<int64_t>{6}}));
  EXPECT_NO_THROW(scale_to_residual(g));
  dce(g);
  verify(g);
  at::Tensor t = at::randn({3});
  EXPECT_TRUE(Executable(g.clone()).run({t})[0].equal((t.expand({2, 3}) * 2).view({6})));
}

// Views that reinterpret storage do not commute with scaling.
TEST(ScaleToResidual, LeavesStorageViewsAlone) {
  Graph g;
  Value* dx = g.add_input("dx", f32({4, 6}), Role::Tangent);
  Builder b(g);
  g.add_output(b.call("aten::view.dtype", {b.call("aten::mul.Scalar", {dx, 0.5}), c10::kInt}));
  Value* s = b.call("aten::slice.Tensor", {dx, 1, 0, 3, 1});
  g.add_output(b.call("aten::as_strided",
                      {b.call("aten::mul.Scalar", {s, 2.0}), std::vector<int64_t>{3, 4}, std::vector<int64_t>{1, 3}}));
  EXPECT_FALSE(scale_to_residual(g)) << to_text(g);
}

// Attention written by hand scales the scores after q·kᵀ: the tangent's division goes onto the
// primal operands of both products, where (sequence ≥ 2 · head dim) they take no more bytes.
TEST(ScaleToResidual, MovesAScaleAfterProductsOntoTheirPrimalOperands) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    at::Tensor s = at::matmul(x[0], x[1].transpose(-2, -1)) / 8.0;
    return std::vector<at::Tensor>{at::matmul(at::softmax(s, -1), x[2])};
  };
  for (int64_t seq : {16, 6}) {
    std::vector<TraceInput> in;
    std::vector<at::Tensor> x, t;
    for (const char* name : {"q", "k", "v"}) {
      x.push_back(at::randn({2, 3, seq, 4}, at::kDouble));
      t.push_back(at::randn({2, 3, seq, 4}, at::kDouble));
      in.push_back({name, x.back()});
    }
    Linearized lin = linearize(fn, in);
    bool scaled = test::count_op(*lin.tangent_graph, "aten::div.Scalar") > 0;
    EXPECT_EQ(scaled, seq == 6) << "seq " << seq << "\n" << to_text(*lin.tangent_graph);  // 2 · 4 > 6: kept
    std::vector<at::Tensor> ref = forward_ad_jvp(fn, x, {t[0], t[1], t[2]});
    EXPECT_LT(test::rel_error(lin.jvp(t)[0], ref[0]), 1e-12);
  }
}

TEST(ScaleToResidual, LeavesAScaleOfAProductOfTwoTangentsAlone) {
  Graph g;
  Value* dq = g.add_input("dq", f32({4, 8}), Role::Tangent);
  Value* dk = g.add_input("dk", f32({8, 4}), Role::Tangent);
  Builder b(g);
  g.add_output(b.call("aten::div.Scalar", {b.call("aten::mm", {dq, dk}), 8.0}));
  EXPECT_FALSE(scale_to_residual(g));
}

}  // namespace
}  // namespace jvpc
