// select-masks: a product by a 0/1 mask becomes a select on the boolean mask.
#include "tests/pass_helpers.h"

#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "runtime/executable.h"

namespace jvpc {
namespace {
using test::f32;

TEST(SelectMasks, KeepsAMaskAsBooleans) {
  Graph g;
  Value* x = g.add_input("x", f32({4, 8}), Role::Primal, true);
  Value* t = g.add_input("dx", f32({4, 8}), Role::Tangent);
  Builder bld(g);
  Value* mask = bld.call("aten::_to_copy", {bld.call("aten::gt.Scalar", {x, 0}), c10::kFloat});
  g.add_output(bld.call("aten::mul.Tensor", {t, mask}));
  std::unique_ptr<Graph> before = g.clone();
  EXPECT_TRUE(select_masks(g));
  verify(g);
  const Node* out = g.outputs()[0]->producer();
  ASSERT_EQ(out->op(), "aten::where.ScalarOther") << to_text(g);
  EXPECT_EQ(out->input(0)->meta().dtype, c10::kBool);
  EXPECT_EQ(test::count_op(g, "aten::_to_copy"), 0);
  std::vector<at::Tensor> in = {at::randn({4, 8}), at::randn({4, 8})};
  EXPECT_TRUE(Executable(std::move(before)).run(in)[0].equal(Executable(g.clone()).run(in)[0]));
}

// relu between two matmuls: the residual between them is relu's mask, one byte per element.
TEST(SelectMasks, ReluHoldsABooleanResidual) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{at::mm(at::relu(at::mm(x[0], x[1])), x[2])};
  };
  std::vector<TraceInput> in = {{"x", at::randn({16, 32})}, {"w1", at::randn({32, 64})}, {"w2", at::randn({64, 8})}};
  LinearizeOptions only_x;
  only_x.wrt = {"x"};
  Linearized lin = linearize(fn, in, only_x);
  EXPECT_EQ(lin.report.tangent.residual_bytes, 16 * 64) << to_text(*lin.tangent_graph);
  at::Tensor dx = at::randn({16, 32});
  at::Tensor ref = forward_ad_jvp(fn, {in[0].value, in[1].value, in[2].value}, {dx, std::nullopt, std::nullopt}).at(0);
  EXPECT_LT(test::rel_error(lin.jvp({dx}).at(0), ref), 1e-5);
}

}  // namespace
}  // namespace jvpc
