// zero-blocks through linearize: a decoding step over a KV cache. The pass on graphs:
// tests/ir/zero_blocks.ir.
#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "ir/cost/cost_model.h"
#include "examples/examples.h"
#include "runtime/executable.h"
#include "tests/pass_helpers.h"

namespace jvpc {
namespace {
using test::f32;
using test::run;

// A decoding step over a KV cache: the tangents of cat([past, new]) are cat([zeros, dnew]); the
// matmuls skip the zero blocks (rather than make and multiply two cache-sized zero blocks per
// call).
TEST(ZeroBlocks, ADecodingStepSkipsTheCachesZeroTangent) {
  at::Tensor past_k = at::randn({1, 2, 64, 8}, at::kDouble), past_v = at::randn({1, 2, 64, 8}, at::kDouble);
  TensorFn fn = [past_k, past_v](const std::vector<at::Tensor>& x) {
    examples::BackendScope math(examples::Backend::Math);
    return std::vector<at::Tensor>{
        at::scaled_dot_product_attention(x[0], at::cat({past_k, x[1]}, 2), at::cat({past_v, x[2]}, 2))};
  };
  std::vector<TraceInput> in = {{"q", at::randn({1, 2, 1, 8}, at::kDouble)},
                                {"k", at::randn({1, 2, 1, 8}, at::kDouble)},
                                {"v", at::randn({1, 2, 1, 8}, at::kDouble)}};
  std::vector<at::Tensor> t = {at::randn({1, 2, 1, 8}, at::kDouble), at::randn({1, 2, 1, 8}, at::kDouble),
                               at::randn({1, 2, 1, 8}, at::kDouble)};
  Linearized lin = linearize(fn, in);
  LinearizeOptions without;
  without.disabled_passes = {"zero-blocks"};
  Linearized dense = linearize(fn, in, without);
  EXPECT_EQ(dense.report.tangent.matmul_flops, 8320);
  EXPECT_EQ(lin.report.tangent.matmul_flops, 4224) << to_text(*lin.tangent_graph);
  for (const Node* n : lin.tangent_graph->nodes())
    if (n->op() == "aten::zeros") {
      EXPECT_LE(n->output()->meta().numel(), 2 * 64) << "a cache-sized zero block";
    }
  std::vector<at::Tensor> ref = forward_ad_jvp(fn, {in[0].value, in[1].value, in[2].value}, {t[0], t[1], t[2]});
  EXPECT_LT(test::rel_error(lin.jvp(t)[0], ref[0]), 1e-12);
}

}  // namespace
}  // namespace jvpc
