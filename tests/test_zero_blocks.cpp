// zero-blocks: bmms skip a concatenated tangent's zero blocks.
#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "compiler/cost/cost_model.h"
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

// A cat along bmm's left operand: its rows (the result's rows) or the contracted dim (a slice of
// the right operand); along the batch it is left alone.
TEST(ZeroBlocks, BlocksOfTheLeftOperand) {
  for (int64_t dim : {1, 2, 0}) {
    Graph g;
    std::vector<int64_t> part = {2, 3, 4}, zeros = {2, 3, 4};
    part[static_cast<size_t>(dim)] = 1;
    zeros[static_cast<size_t>(dim)] -= 1;
    Value* t = g.add_input("dx", f32(part), Role::Tangent);
    Value* w = g.add_input("w", f32({2, 4, 5}), Role::Primal, true);
    Builder b(g);
    Value* z = b.call("aten::zeros", {zeros, c10::kFloat, std::nullopt, c10::Device(c10::kCPU)});
    g.add_output(b.call("aten::bmm", {b.call("aten::cat", {std::vector<Value*>{z, t}, dim}), w}));
    std::vector<at::Tensor> in = {at::randn(part), at::randn({2, 4, 5})};
    at::Tensor before = run(g, in)[0];
    EXPECT_EQ(zero_blocks(g), dim != 0) << dim;
    verify(g);
    EXPECT_LT(test::rel_error(run(g, in)[0], before), 1e-6) << to_text(g);
    EXPECT_EQ(test::count_op(g, "aten::bmm"), 1);
  }
}

}  // namespace
}  // namespace jvpc
