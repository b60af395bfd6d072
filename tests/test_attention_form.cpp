// attention-form (passes/attention_form.cpp): per attention, the P form or the O(L) form of its
// tangent under the residual budget. Through the CPU flash kernel, in float64: the O(L) form
// (budget 0) equals the P form (budget inf) and LibTorch's forward AD of the math path, on
// every SDPA variant; the choice follows the stated rule with several attentions; a budget
// nothing meets is an error naming the smallest that would do.
#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "compiler/ir/limits.h"
#include "examples/examples.h"
#include "runtime/attention_tangent.h"
#include "tests/helpers.h"

#include <ATen/ATen.h>

namespace jvpc {
namespace {

int count_op(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node* node : g.nodes()) n += node->op() == op;
  return n;
}

std::vector<std::vector<std::string>> sdpa_configs() {
  return {
      {"sdpa"},
      {"sdpa", "--causal"},
      {"sdpa", "--causal", "--seq-len", "600"},  // several blocks (256 × 512), not dividing L; causal skipping
      {"sdpa", "--mask", "bool"},
      {"sdpa", "--mask", "float", "--kv-seq-len", "96"},
      {"sdpa", "--kv-heads", "1"},
      {"sdpa", "--kv-heads", "5", "--model-dim", "640", "--causal"},
      {"sdpa", "--scale", "0.3", "--seq-len", "64"},
      {"sdpa", "--bsz", "2", "--seq-len", "40", "--kv-seq-len", "72"},
  };
}

class AttentionForm : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(AttentionForm, OLFormEqualsPFormAndForwardAdInFloat64) {
  examples::Instance ex = test::make_example(GetParam(), {"--backend", "flash", "--dtype", "float64"});
  LinearizeOptions ol, p;
  ol.residual_budget = 0;
  p.residual_budget = kNoMemoryLimit;
  Linearized a = linearize(ex.fn(), ex.inputs, ol);
  Linearized b = linearize(ex.fn(), ex.inputs, p);
  EXPECT_EQ(count_op(*a.tangent_graph, runtime::kAttentionTangentOp), 1);
  EXPECT_EQ(count_op(*b.tangent_graph, runtime::kAttentionTangentOp), 0);
  ASSERT_EQ(a.report.attention.size(), 1u);
  EXPECT_TRUE(a.report.attention[0].o_l_form);
  EXPECT_FALSE(b.report.attention[0].o_l_form);
  // The cost model's FLOPs of each form are the tangent graph's.
  EXPECT_EQ(a.report.tangent.matmul_flops, a.report.attention[0].o_l.matmul_flops);
  EXPECT_EQ(b.report.tangent.matmul_flops, b.report.attention[0].p.matmul_flops);

  at::manual_seed(5);
  std::vector<at::Tensor> tangents;
  std::vector<std::optional<at::Tensor>> ref;
  for (const std::string& name : a.tangent_names()) {
    for (const TraceInput& in : ex.inputs)
      if ("d" + in.name == name) ref.push_back(tangents.emplace_back(at::randn_like(in.value)));
  }
  ASSERT_EQ(tangents.size(), a.tangent_names().size());
  ASSERT_EQ(a.tangent_names(), b.tangent_names());
  std::vector<at::Tensor> got = a.jvp(tangents), want = b.jvp(tangents);
  EXPECT_LT(compare(got, want).rel_error, 1e-10) << "O(L) vs P";
  // Forward AD of the math path (primals in the order of the tangents).
  std::vector<at::Tensor> primals;
  for (const TraceInput& in : ex.inputs) primals.push_back(in.value);
  std::vector<std::optional<at::Tensor>> full(primals.size());
  size_t j = 0;
  for (size_t i = 0; i < ex.inputs.size() && j < tangents.size(); ++i)
    if ("d" + ex.inputs[i].name == a.tangent_names()[j]) full[i] = tangents[j++];
  std::vector<at::Tensor> fad = forward_ad_jvp(ex.make_fn(examples::Backend::Math), primals, full);
  EXPECT_LT(compare(got, fad).rel_error, 1e-10) << "O(L) vs forward AD";
}

INSTANTIATE_TEST_SUITE_P(Sdpa, AttentionForm, ::testing::ValuesIn(sdpa_configs()), [](const auto& info) {
  std::string s = test::config_name(info.param);
  for (char& ch : s)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
});

// Two attentions, a long one and a short one, through the CPU flash kernel.
TensorFn two_attentions() {
  return [](const std::vector<at::Tensor>& x) {
    examples::BackendScope flash(examples::Backend::Flash);
    at::Tensor a = at::scaled_dot_product_attention(x[0], x[0], x[0]);
    at::Tensor b = at::scaled_dot_product_attention(x[1], x[1], x[1], {}, 0.0, true);
    return std::vector<at::Tensor>{a, b};
  };
}
std::vector<TraceInput> two_inputs() {
  at::manual_seed(2);
  return {{"x", at::randn({1, 2, 1024, 16})}, {"y", at::randn({1, 2, 64, 16})}};
}

TEST(AttentionFormChoice, TheAttentionThatFreesMostBytesPerExtraFlopMovesFirst) {
  LinearizeOptions all_p;
  all_p.residual_budget = kNoMemoryLimit;
  Linearized p = linearize(two_attentions(), two_inputs(), all_p);
  ASSERT_EQ(p.report.attention.size(), 2u);
  const AttentionChoice &big = p.report.attention[0], &small = p.report.attention[1];
  EXPECT_GT(big.p.bytes(), big.o_l.bytes());
  int64_t all_p_bytes = big.p.bytes() + small.p.bytes();
  // Just under the all-P total: the long attention takes the O(L) form, the short one keeps P.
  LinearizeOptions tight;
  tight.residual_budget = all_p_bytes - 1;
  Linearized t = linearize(two_attentions(), two_inputs(), tight);
  EXPECT_TRUE(t.report.attention[0].o_l_form);
  EXPECT_FALSE(t.report.attention[1].o_l_form);
  EXPECT_EQ(count_op(*t.tangent_graph, runtime::kAttentionTangentOp), 1);
  // The whole total fits: both hold P, as with no limit.
  LinearizeOptions roomy;
  roomy.residual_budget = all_p_bytes;
  Linearized r = linearize(two_attentions(), two_inputs(), roomy);
  EXPECT_FALSE(r.report.attention[0].o_l_form);
  EXPECT_FALSE(r.report.attention[1].o_l_form);
  // Budget 0: both O(L).
  LinearizeOptions zero;
  zero.residual_budget = 0;
  Linearized z = linearize(two_attentions(), two_inputs(), zero);
  EXPECT_EQ(count_op(*z.tangent_graph, runtime::kAttentionTangentOp), 2);
}

TEST(AttentionFormChoice, ABudgetNothingMeetsNamesTheSmallestThatWould) {
  LinearizeOptions all_p;
  all_p.residual_budget = kNoMemoryLimit;
  Linearized p = linearize(two_attentions(), two_inputs(), all_p);
  int64_t smallest = 0;
  for (const AttentionChoice& a : p.report.attention) smallest += std::min(a.p.bytes(), a.o_l.bytes());
  LinearizeOptions tiny;
  tiny.residual_budget = smallest - 1;
  test::expect_error([&] { linearize(two_attentions(), two_inputs(), tiny); },
                     "the attentions need at least " + describe_bytes(smallest));
  tiny.residual_budget = smallest;
  EXPECT_NO_THROW(linearize(two_attentions(), two_inputs(), tiny));
}

// At --seq-len 2048 --model-dim 256 --head-dim 64 the O(L) form holds nothing of size Lq·Lk.
TEST(AttentionFormChoice, TheOLFormHoldsNothingOfSizeLqLk) {
  examples::Instance ex = test::make_example({"sdpa", "--seq-len", "2048", "--model-dim", "256", "--head-dim", "64"},
                                             {"--backend", "flash"});
  LinearizeOptions ol;
  ol.residual_budget = 0;
  Linearized a = linearize(ex.fn(), ex.inputs, ol);
  int64_t scores = 4LL * 2048 * 2048;
  for (const Input& in : a.tangent_graph->inputs()) EXPECT_LT(in.value->meta().numel(), scores) << in.name;
  // q, k, v, out (2 MiB each) and lse, against P's 64 MiB; a call's peak is the block workspace.
  EXPECT_LT(a.report.tangent.residual_bytes + a.report.tangent.aliased_input_bytes, scores * 4 / 7);
  EXPECT_LT(a.report.tangent.peak_bytes + a.report.tangent.workspace_bytes, scores * 4 / 4);
}

}  // namespace
}  // namespace jvpc
