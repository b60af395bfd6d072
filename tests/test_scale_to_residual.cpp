// scale-to-residual through linearize: hand-written attention's scaled scores. The pass on graphs:
// tests/ir/scale_to_residual.ir.
#include "tests/pass_helpers.h"

#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "runtime/executable.h"

namespace jvpc {
namespace {
using test::f32;

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

}  // namespace
}  // namespace jvpc
