// Every JVP rule, table-driven (tests/rule_cases.h): each case's jvpc JVP (trace, jvp, fold,
// simplify, run) is checked in float64 against LibTorch's forward AD and against central
// differences. Fused attention kernels are checked against forward AD of the math path. And
// what the table cannot hold: errors on complex tensors, NaN tangents.
#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "ir/io/graph_files.h"
#include "passes/jvp_rules/rules.h"
#include "tests/helpers.h"
#include "tests/rule_cases.h"

#include <ATen/ATen.h>

#include <limits>
#include <optional>
#include <set>

namespace jvpc {
namespace {

using namespace test;  // the rule cases (tests/rule_cases.h)

class ComplexRule : public ::testing::TestWithParam<size_t> {};

TEST_P(ComplexRule, MatchesForwardAdAndCentralDifferences) {
  const ComplexCase& cc = complex_cases()[GetParam()];
  at::manual_seed(static_cast<uint64_t>(GetParam()));
  std::vector<TraceInput> primals;
  std::vector<at::Tensor> values, tangents;
  std::vector<std::optional<at::Tensor>> ref_tangents;
  for (size_t i = 0; i < cc.shapes.size(); ++i) {
    auto dtype = cc.complex[i] ? at::kComplexDouble : at::kDouble;
    at::Tensor v = at::randn(cc.shapes[i], dtype) + 0.5, t = at::randn(cc.shapes[i], dtype);
    primals.push_back({"x" + std::to_string(i), v});
    values.push_back(v), tangents.push_back(t), ref_tangents.push_back(t);
  }
  Linearized lin = linearize(cc.fn, primals);
  Trace tr = trace(cc.fn, primals, TraceOptions::graph_only());
  bool seen = false;
  for (const Node* n : tr.graph->nodes()) seen |= n->op() == cc.op;
  ASSERT_TRUE(seen) << cc.op << " does not appear in the trace";
  std::vector<at::Tensor> got = lin.jvp(tangents), ad = forward_ad_jvp(cc.fn, values, ref_tangents),
                          fd = central_differences_jvp(cc.fn, values, ref_tangents);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].scalar_type(), ad[i].scalar_type()) << cc.op;
    EXPECT_LT(test::rel_error(got[i], ad[i]), 1e-10) << cc.op << " vs forward AD";
    EXPECT_LT(test::rel_error(got[i], fd[i]), 1e-6) << cc.op << " vs central differences";
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, ComplexRule, ::testing::Range<size_t>(0, complex_cases().size()), [](const auto& info) {
  std::string name = complex_cases()[info.param].op.substr(6) + "_" + std::to_string(info.param);
  for (char& ch : name)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
});

class JvpRule : public ::testing::TestWithParam<size_t> {};

TEST_P(JvpRule, MatchesForwardAdAndCentralDifferencesInFloat64) {
  RuleCase rc = cases()[GetParam()];
  at::manual_seed(static_cast<uint64_t>(GetParam()));
  std::vector<TraceInput> primals;
  std::vector<at::Tensor> tangents, values;
  std::vector<std::optional<at::Tensor>> ref_tangents;
  for (size_t i = 0; i < rc.shapes.size(); ++i) {
    at::Tensor v = rc.positive ? at::rand(rc.shapes[i], at::kDouble) + 0.5 : at::randn(rc.shapes[i], at::kDouble);
    at::Tensor t = at::randn(rc.shapes[i], at::kDouble);
    primals.push_back({"x" + std::to_string(i), v});
    values.push_back(v);
    tangents.push_back(t);
    ref_tangents.push_back(t);
  }
  Linearized lin = linearize(rc.fn, primals);
  // The rule under test was exercised: the traced graph contained the op.
  bool seen = false;
  for (const Node* n : lin.tangent_graph->nodes()) seen |= n->op() == rc.op;
  Trace t = trace(rc.fn, primals, TraceOptions::graph_only());
  for (const Node* n : t.graph->nodes()) seen |= n->op() == rc.op;
  ASSERT_TRUE(seen) << rc.op << " does not appear in the trace";

  std::vector<at::Tensor> got = lin.jvp(tangents);
  Fn ref_fn = rc.reference ? rc.reference : rc.fn;
  std::vector<at::Tensor> ad = rc.ad_outputs ? forward_ad_jvp(ref_fn, values, ref_tangents) : std::vector<at::Tensor>{};
  std::vector<at::Tensor> fd = central_differences_jvp(ref_fn, values, ref_tangents);
  ASSERT_EQ(got.size(), fd.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (i < rc.ad_outputs) {
      EXPECT_LT(test::rel_error(got[i], ad[i]), 1e-10) << rc.op << " output " << i << " vs forward AD";
    }
    if (rc.central_differences) {
      EXPECT_LT(test::rel_error(got[i], fd[i]), 1e-6) << rc.op << " output " << i << " vs central differences";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, JvpRule, ::testing::Range<size_t>(0, cases().size()), [](const auto& info) {
  std::string name = cases()[info.param].op.substr(6) + "_" + std::to_string(info.param);
  for (char& ch : name)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
});

// Every rule in the registry has a case above, except the CUDA kernels, which need a GPU: the
// fused attention kernels (Linearize.CudaFusedKernelsMatchMathPathForwardAd; also checked on
// CPU kernels that emulate them, test_fused_emulated.cpp), cuDNN's batch norm, whose rule is
// native_batch_norm's (Linearize.CudaConvolutionsAndBatchNormMatchForwardAd), and cuDNN's grid
// sampler, whose rule is grid_sampler_2d's (Linearize.CudaCudnnGridSamplerMatchesTheNativeKernel).
TEST(JvpRules, EveryRegisteredRuleHasACase) {
  std::set<std::string> covered = {
      "aten::_scaled_dot_product_flash_attention",
      "aten::_scaled_dot_product_efficient_attention",
      "aten::_scaled_dot_product_cudnn_attention",
      "aten::cudnn_batch_norm",
      "aten::cudnn_grid_sampler",
      "aten::mkldnn_rnn_layer"};  // float32 only: Linearize.OneDnnLstmLayersMatchForwardAdOfTheUnfusedPath
  for (const RuleCase& rc : cases()) covered.insert(rc.op);
  for (const ComplexCase& cc : complex_cases()) covered.insert(cc.op);
  for (const std::string& op : jvp_rules::registry().ops()) {
    if (has_op(op)) {
      EXPECT_TRUE(covered.count(op)) << op << " has no case";
    }
  }
  for (const std::string& op : jvp_rules::registry().complex_ops()) EXPECT_TRUE(jvp_rules::registry().find(op)) << op;
}

// A complex graph stays in memory: save refuses it rather than write what load refuses.
TEST(JvpRules, ComplexGraphsAreNotSaved) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{at::fft_irfft(at::fft_rfft(x[0]) * 2, 8)};
  };
  Linearized lin = linearize(fn, {{"x", at::randn({8}, at::kDouble)}});
  test::expect_error([&] { save(*lin.tangent_graph, test::temp_path("c.json")); },
                     "dtype ComplexDouble cannot be saved");
}

// nansum's tangent sums the tangent where x is a number: a NaN tangent there stays NaN (forward
// AD's answer), which a nansum of the tangent would drop.
TEST(JvpRules, NansumKeepsANanTangentWhereXIsANumber) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{at::nansum(x[0])}; };
  at::Tensor x = at::tensor({1.0, NAN, 2.0}, at::kDouble), t = at::tensor({NAN, 5.0, 1.0}, at::kDouble);
  EXPECT_TRUE(linearize(fn, {{"x", x}}).jvp({t})[0].isnan().item<bool>());
  EXPECT_TRUE(forward_ad_jvp(fn, {x}, {t})[0].isnan().item<bool>());
}

// hypot where its result overflows: LibTorch's ta·a / out is NaN where ta·a overflows too, and
// 0 where it does not; the rule gives the same, entry by entry.
TEST(JvpRules, HypotMatchesForwardAdWhereItsResultOverflows) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{at::hypot(x[0], x[1])}; };
  const double big = std::numeric_limits<double>::max();
  at::Tensor a = at::tensor({big, big, 3.0}, at::kDouble), b = at::tensor({big, 1.0, 4.0}, at::kDouble);
  at::Tensor ta = at::tensor({-1.5, 0.5, 1.0}, at::kDouble), tb = at::tensor({2.0, 1.0, 2.0}, at::kDouble);
  at::Tensor got = linearize(fn, {{"a", a}, {"b", b}}).jvp({ta, tb})[0];
  at::Tensor want = forward_ad_jvp(fn, {a, b}, {ta, tb})[0];
  EXPECT_TRUE(got.isnan().equal(want.isnan())) << got << want;
  EXPECT_TRUE(at::allclose(got.nan_to_num(0), want.nan_to_num(0)));
  EXPECT_TRUE(got[0].isnan().item<bool>());
}

// A complex number as an op's scalar argument: an error naming the op and the way around it.
TEST(JvpRules, ComplexScalarArgumentsAreAnErrorNamingTheOp) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{x[0] * c10::complex<double>(0, 1)};
  };
  test::expect_error(
      [&] {
        linearize(fn, {{"z", at::randn({3}, at::kComplexDouble)}});
      },
      "aten::mul.Scalar: argument 'other' is a complex number");
}

// A rule not marked as holding for complex tensors is an error there, not a silent real formula.
TEST(JvpRules, ARealRuleOnComplexTensorsIsAnError) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{at::atan(x[0])}; };
  test::expect_error(
      [&] {
        linearize(fn, {{"z", at::randn({3}, at::kComplexDouble)}});
      },
      "no JVP rule for aten::atan of complex tensors");
}
}  // namespace
}  // namespace jvpc
