// attention-form (passes/attention_form.cpp): per attention, the P form or the O(L) form of its
// tangent under the residual budget. Through the CPU flash kernel, in float64: the O(L) form
// (budget 0) equals the P form (budget inf) and LibTorch's forward AD of the math path, on
// every SDPA variant; the choice follows the stated rule with several attentions, the budget
// counting the whole tangent graph (its residuals and a call's peak); a budget nothing meets is
// an error naming the smallest that would do. At seq 2048 the O(L) form holds nothing of size
// Lq·Lk, a call's measured peak is within the prediction, and the matmul FLOPs counted on the
// kernels that ran are each form's formula. The check's O(L) reference (central differences
// through the fused kernel) agrees, and forward AD's memory estimate bounds what it allocates.
#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "ir/cost/kernel_watch.h"
#include "ir/cost/peak_bytes.h"
#include "ir/io/limits.h"
#include "examples/examples.h"
#include "runtime/attention_tangent.h"
#include "tests/helpers.h"
#include "tests/pass_helpers.h"
#include "tests/profiler.h"

#include <ATen/ATen.h>

namespace jvpc {
namespace {

using test::count_op;

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
  EXPECT_EQ(count_op(*a.tangent_graph, ops::jvpc_attention_tangent), 1);
  EXPECT_EQ(count_op(*b.tangent_graph, ops::jvpc_attention_tangent), 0);
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
  // The budget counts the whole tangent graph: at least both attentions' own bytes.
  int64_t all_p_bytes = big.counted_bytes;
  EXPECT_EQ(small.counted_bytes, all_p_bytes);
  EXPECT_GE(all_p_bytes, big.p.residual_bytes + small.p.residual_bytes);
  // Just under the all-P count: the long attention takes the O(L) form, the short one keeps P.
  LinearizeOptions tight;
  tight.residual_budget = all_p_bytes - 1;
  Linearized t = linearize(two_attentions(), two_inputs(), tight);
  EXPECT_TRUE(t.report.attention[0].o_l_form);
  EXPECT_FALSE(t.report.attention[1].o_l_form);
  EXPECT_LT(t.report.attention[0].counted_bytes, all_p_bytes - (big.p.bytes() - big.o_l.bytes()) / 2);
  EXPECT_EQ(count_op(*t.tangent_graph, ops::jvpc_attention_tangent), 1);
  EXPECT_NE(t.report.attention[0].reason.find("frees the most bytes per extra FLOP"), std::string::npos);
  // The whole count fits: both hold P, as with no limit.
  LinearizeOptions roomy;
  roomy.residual_budget = all_p_bytes;
  Linearized r = linearize(two_attentions(), two_inputs(), roomy);
  EXPECT_FALSE(r.report.attention[0].o_l_form);
  EXPECT_FALSE(r.report.attention[1].o_l_form);
  EXPECT_EQ(r.report.attention[0].counted_bytes, all_p_bytes);
  // Budget 0: both O(L).
  LinearizeOptions zero;
  zero.residual_budget = 0;
  Linearized z = linearize(two_attentions(), two_inputs(), zero);
  EXPECT_EQ(count_op(*z.tangent_graph, ops::jvpc_attention_tangent), 2);
}

// The count is the cost model's prediction of the tangent graph the pipeline makes: after the
// later passes it holds no more than predicted.
TEST(AttentionFormChoice, TheCountBoundsTheTangentGraphsResidualsAndPeak) {
  for (int64_t budget : {int64_t(0), kNoMemoryLimit}) {
    LinearizeOptions o;
    o.residual_budget = budget;
    Linearized l = linearize(two_attentions(), two_inputs(), o);
    const GraphCost& c = l.report.tangent;
    EXPECT_LE(c.residual_bytes + c.peak_bytes + c.workspace_bytes, l.report.attention[0].counted_bytes) << budget;
    EXPECT_GT(c.residual_bytes + c.peak_bytes + c.workspace_bytes, l.report.attention[0].counted_bytes / 2) << budget;
  }
}

// The default budget (the device's memory) is met by a bound on the all-P count: P everywhere,
// nothing counted. A budget between the count and the bound counts.
TEST(AttentionFormChoice, ABudgetTheBoundMeetsKeepsPWithoutCounting) {
  LinearizeOptions inf;
  inf.residual_budget = kNoMemoryLimit;
  const int64_t exact = linearize(two_attentions(), two_inputs(), inf).report.attention[0].counted_bytes;
  Linearized d = linearize(two_attentions(), two_inputs());
  ASSERT_EQ(d.report.attention.size(), 2u);
  EXPECT_FALSE(d.report.attention[0].o_l_form);
  EXPECT_FALSE(d.report.attention[1].o_l_form);
  EXPECT_GT(d.report.attention[0].counted_bytes, exact);
  EXPECT_NE(d.report.attention[0].reason.find("takes at most"), std::string::npos) << d.report.attention[0].reason;
  LinearizeOptions between;
  between.residual_budget = exact;
  Linearized b = linearize(two_attentions(), two_inputs(), between);
  EXPECT_EQ(b.report.attention[0].counted_bytes, exact);
  EXPECT_EQ(b.report.attention[0].reason.find("at most"), std::string::npos) << b.report.attention[0].reason;
  EXPECT_FALSE(b.report.attention[0].o_l_form);
}

TEST(AttentionFormChoice, ABudgetNothingMeetsNamesTheSmallestThatWould) {
  LinearizeOptions tiny;
  tiny.residual_budget = 1000;
  std::string msg;
  try {
    linearize(two_attentions(), two_inputs(), tiny);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("the tangent graph needs at least "), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  // "needs at least 1.23 MiB (1290240 bytes) (residuals ...": the budget it names does, one byte less does not.
  size_t at = msg.find('(', msg.find("needs at least ")) + 1;
  int64_t smallest = std::stoll(msg.substr(at));
  ASSERT_GT(smallest, 1000);
  tiny.residual_budget = smallest - 1;
  test::expect_error([&] { linearize(two_attentions(), two_inputs(), tiny); },
                     "needs at least " + describe_bytes(smallest));
  tiny.residual_budget = smallest;
  EXPECT_NO_THROW(linearize(two_attentions(), two_inputs(), tiny));
}

// At --seq-len 2048 --model-dim 256 --head-dim 64 the O(L) form holds nothing of size Lq·Lk; the
// peak of a call, measured by the profiler's memory events, is within the cost model's
// prediction and bounded by the block size; the matmul FLOPs of a call, counted on the kernels
// that ran, are the formulas of either form.
TEST(AttentionFormChoice, TheOLFormHoldsNothingOfSizeLqLk) {
  examples::Instance ex = test::make_example({"sdpa", "--seq-len", "2048", "--model-dim", "256", "--head-dim", "64"},
                                             {"--backend", "flash"});
  const int64_t B = 1, H = 4, L = 2048, D = 64, Dv = 64;
  LinearizeOptions ol;
  ol.residual_budget = 0;
  Linearized a = linearize(ex.fn(), ex.inputs, ol);
  int64_t scores = B * H * L * L;
  for (const Input& in : a.tangent_graph->inputs()) EXPECT_LT(in.value->meta().numel(), scores) << in.name;
  // q, k, v, out (2 MiB each) and lse, against P's 64 MiB; a call's peak is the block workspace.
  EXPECT_LT(a.report.tangent.residual_bytes + a.report.tangent.aliased_input_bytes, scores * 4 / 7);
  int64_t predicted = a.report.tangent.peak_bytes + a.report.tangent.workspace_bytes;
  EXPECT_LT(predicted, scores * 4 / 4);

  at::manual_seed(3);
  std::vector<at::Tensor> tangents;
  for (const Input* in : a.jvp_fn->arguments()) tangents.push_back(at::randn(in->value->meta().sizes));
  a.jvp(tangents);  // first call: whatever the runtime sets up once
  int64_t measured = measured_peak_bytes([&] { a.jvp(tangents); });
  EXPECT_GT(measured, B * H * L * Dv * 4) << "at least the output";
  EXPECT_LE(measured, predicted);
  EXPECT_LT(measured, L * L * 4) << "not even one head's scores";

  KernelWatch watch;
  a.jvp(tangents);
  EXPECT_EQ(watch.matmul_flops(), 2 * B * H * L * L * (3 * D + 2 * Dv));

  // The P form: four matmuls per call.
  LinearizeOptions p_form;
  p_form.residual_budget = kNoMemoryLimit;
  Linearized p = linearize(ex.fn(), ex.inputs, p_form);
  KernelWatch p_watch;
  p.jvp(tangents);
  EXPECT_EQ(p_watch.matmul_flops(), 2 * B * H * L * L * (2 * D + 2 * Dv));
}

// The check's references (compiler/api/reference.h), as `jvpc linearize` chooses between them:
// the estimate of what LibTorch's forward AD of the math path needs bounds what it allocates;
// central differences in float64 through the fused kernel (O(L) memory) agree with the O(L) form.
TEST(CheckReference, ForwardAdEstimateBoundsWhatItAllocates) {
  EXPECT_EQ(forward_ad_bytes_estimate(100, 50, {10, 20}, 4), 2 * 150 + 6 * 30 * 4);
  EXPECT_EQ(forward_ad_bytes_estimate(kNoMemoryLimit / 2, kNoMemoryLimit / 2 + 5, {}, 4), kNoMemoryLimit);
  EXPECT_EQ(forward_ad_bytes_estimate(0, 0, {int64_t(1) << 62}, 8), kNoMemoryLimit);
  examples::Instance ex = test::make_example({"sdpa", "--seq-len", "512"}, {"--backend", "flash"});
  LinearizeOptions ol;
  ol.residual_budget = 0;
  Linearized a = linearize(ex.fn(), ex.inputs, ol);
  ASSERT_EQ(a.report.attention.size(), 1u);
  EXPECT_EQ(a.report.attention[0].score_elements, 5 * 512 * 512);
  std::vector<at::Tensor> primals;
  std::vector<std::optional<at::Tensor>> tangents;
  int64_t input_bytes = 0;
  for (const TraceInput& in : ex.inputs) {
    primals.push_back(in.value);
    tangents.push_back(at::randn_like(in.value));
    input_bytes += static_cast<int64_t>(in.value.nbytes());
  }
  at::Tensor keep;
  int64_t measured =
      measured_peak_bytes([&] { keep = forward_ad_jvp(ex.make_fn(examples::Backend::Math), primals, tangents)[0]; });
  int64_t estimate =
      forward_ad_bytes_estimate(input_bytes, a.report.forward.peak_bytes, {a.report.attention[0].score_elements}, 4);
  EXPECT_LE(measured, estimate);
  EXPECT_GT(measured, estimate / 4);
}

TEST(CheckReference, CentralDifferencesThroughTheFusedKernelAgreeWithTheOLForm) {
  for (const char* dtype : {"float32", "float64"}) {
    examples::Instance ex = test::make_example({"sdpa", "--causal", "--seq-len", "600", "--model-dim", "128"},
                                               {"--backend", "flash", "--dtype", dtype});
    LinearizeOptions ol;
    ol.residual_budget = 0;
    Linearized a = linearize(ex.fn(), ex.inputs, ol);
    ASSERT_EQ(count_op(*a.tangent_graph, ops::jvpc_attention_tangent), 1);
    at::manual_seed(7);
    std::vector<at::Tensor> primals, tangents;
    std::vector<std::optional<at::Tensor>> full;
    for (const TraceInput& in : ex.inputs) {
      primals.push_back(in.value);
      full.push_back(tangents.emplace_back(at::randn_like(in.value)));
    }
    std::vector<at::Tensor> got = a.jvp(tangents);
    std::vector<at::Tensor> cd = central_differences_jvp(ex.fn(), primals, full);
    c10::ScalarType dt = ex.inputs[0].value.scalar_type();
    EXPECT_LT(compare(got, cd).rel_error, central_differences_tolerance(dt)) << dtype;
  }
  EXPECT_EQ(central_differences_tolerance(c10::kDouble), 1e-7);
  EXPECT_EQ(central_differences_tolerance(c10::kFloat), 1e-5);
}

}  // namespace
}  // namespace jvpc
