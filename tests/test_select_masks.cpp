// select-masks through linearize: relu's boolean residual. The pass on graphs:
// tests/ir/select_masks.ir.
#include "tests/pass_helpers.h"

#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "runtime/executable.h"

namespace jvpc {
namespace {
using test::f32;

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
