// The JVP rule of the CUDA fused attention kernels, checked on the CPU.
//
// LibTorch has CUDA kernels only for aten::_scaled_dot_product_{flash,efficient,cudnn}_attention.
// This file registers CPU kernels for them, written from their definition with the output
// layouts the CUDA kernels have (torch/_meta_registrations.py in 2.11):
//   flash      out [B,H,Sq,Dv] (laid out as [B,Sq,H,Dv]); lse float32 [B,H,Sq]
//   efficient  out laid out as [B,Sq,H,Dv]; lse float32 [B,H,ceil(Sq/32)·32], padding NaN here
//   cuDNN      out [B,H,Sq,Dv]; lse float32 [B,H,Sq,1]
// and their other returns (flash: rng_state uint64 [2], unused uint64 []; cuDNN: no debug mask),
// so that the tracer, the rule (its argument positions, the padded and 4-d logsumexp, grouped
// heads, masks, causal, scale) and the passes run on the real schemas without a GPU. The
// emulation stands in for the kernels only: on a GPU, Linearize.CudaFusedKernelsMatchMathPathForwardAd
// runs the real ones.
#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "ir/io/limits.h"
#include "ir/io/graph_files.h"
#include "ir/io/graph_json.h"
#include "ir/io/json_text.h"
#include "examples/examples.h"
#include "runtime/executable.h"
#include "tests/helpers.h"

#include <torch/library.h>

#include <cmath>
#include <limits>

namespace jvpc {
namespace {

struct Call {
  at::Tensor q, k, v;
  std::optional<at::Tensor> bias;
  bool causal = false;
  std::optional<double> scale;
};

// Argument positions as in each schema (None: the kernel has no such argument).
constexpr int kNone = -1;
struct Layout {
  int bias, causal, scale;
};

Call pop_call(torch::jit::Stack* s, size_t nargs, Layout at) {
  auto a = torch::jit::last(*s, nargs);
  Call c{a[0].toTensor(), a[1].toTensor(), a[2].toTensor(), std::nullopt, a[at.causal].toBool(), std::nullopt};
  if (at.bias != kNone && a[at.bias].isTensor()) c.bias = a[at.bias].toTensor();
  if (!a[at.scale].isNone()) c.scale = a[at.scale].toDouble();
  torch::jit::drop(*s, nargs);
  return c;
}

// Attention by its definition, accumulated in float32 (float64 for float64 inputs).
// Returns the output in the inputs' dtype and the logsumexp in float32 [B,H,Sq].
std::pair<at::Tensor, at::Tensor> attend(const Call& c) {
  auto acc = c.q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor q = c.q.to(acc), k = c.k.to(acc), v = c.v.to(acc);
  int64_t groups = q.size(1) / k.size(1);
  k = k.repeat_interleave(groups, 1);
  v = v.repeat_interleave(groups, 1);
  double scale = c.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  at::Tensor s = at::matmul(q, k.transpose(-2, -1)) * scale;
  if (c.bias) s = s + c.bias->to(acc);
  if (c.causal)
    s = s.masked_fill(at::ones({q.size(2), k.size(2)}, at::kBool).triu(1), -std::numeric_limits<double>::infinity());
  at::Tensor lse = s.logsumexp(-1);
  return {at::matmul(at::softmax(s, -1), v).to(c.q.scalar_type()), lse.to(at::kFloat)};
}

// [B,H,Sq,Dv] with the strides of a [B,Sq,H,Dv] tensor, as flash and efficient attention return it.
at::Tensor bshd(const at::Tensor& out) { return out.transpose(1, 2).contiguous().transpose(1, 2); }

void flash(const c10::OperatorHandle&, torch::jit::Stack* s) {
  Call c = pop_call(s, 7, {kNone, 4, 6});
  auto [out, lse] = attend(c);
  auto none = at::empty({0}, c.q.options());
  torch::jit::push(*s, bshd(out), lse, at::Tensor(), at::Tensor(), c10::SymInt(c.q.size(2)), c10::SymInt(c.k.size(2)),
                   at::empty({2}, at::kUInt64), at::empty({}, at::kUInt64), none);
}

void efficient(const c10::OperatorHandle&, torch::jit::Stack* s) {
  bool compute_log_sumexp = torch::jit::peek(*s, 4, 8).toBool();  // without it: an empty logsumexp
  Call c = pop_call(s, 8, {3, 6, 7});
  TORCH_CHECK(c.q.size(1) == c.k.size(1), "efficient attention: query and key/value heads differ");
  auto [out, lse] = attend(c);
  int64_t sq = c.q.size(2), padded = compute_log_sumexp ? (sq + 31) / 32 * 32 : 0;
  at::Tensor lse_padded = at::full({c.q.size(0), c.q.size(1), padded}, std::nan(""), lse.options());
  if (compute_log_sumexp) lse_padded.narrow(2, 0, sq).copy_(lse);
  torch::jit::push(*s, bshd(out), lse_padded, at::empty({}, at::kLong), at::empty({}, at::kLong));
}

void cudnn(const c10::OperatorHandle&, torch::jit::Stack* s) {
  Call c = pop_call(s, 9, {3, 6, 8});
  auto [out, lse] = attend(c);
  torch::jit::push(*s, out, lse.unsqueeze(-1), at::Tensor(), at::Tensor(), c10::SymInt(c.q.size(2)),
                   c10::SymInt(c.k.size(2)), at::empty({}, at::kLong), at::empty({}, at::kLong), at::Tensor());
}

TORCH_LIBRARY_IMPL(aten, CPU, m) {
  m.impl("_scaled_dot_product_flash_attention", torch::CppFunction::makeFromBoxedFunction<&flash>());
  m.impl("_scaled_dot_product_efficient_attention", torch::CppFunction::makeFromBoxedFunction<&efficient>());
  m.impl("_scaled_dot_product_cudnn_attention", torch::CppFunction::makeFromBoxedFunction<&cudnn>());
}

struct Case {
  std::string kernel;  // flash | efficient | cudnn
  int64_t batch = 2, heads = 4, kv_heads = 4, sq = 40, sk = 40, d = 16;
  bool causal = false, bias = false;
  std::optional<double> scale;
  c10::ScalarType dtype = at::kFloat;
  double dropout = 0.0;
};

std::string name_of(const Case& c) {
  return c.kernel + " h" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " sq" + std::to_string(c.sq) +
         " sk" + std::to_string(c.sk) + (c.causal ? " causal" : "") + (c.bias ? " bias" : "") +
         (c.scale ? " scale" : "") + " " + c10::toString(c.dtype);
}

void PrintTo(const Case& c, std::ostream* os) { *os << name_of(c); }

std::string test_name(const Case& c) {
  std::string s = name_of(c);
  for (char& ch : s)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

// Calls the fused kernel directly, as LibTorch's SDPA does on a GPU.
TensorFn fused(const Case& c) {
  return [c](const std::vector<at::Tensor>& x) {
    const at::Tensor &q = x[0], &k = x[1], &v = x[2];
    std::optional<at::Tensor> bias;
    if (c.bias) bias = x[3].expand({q.size(0), q.size(1), q.size(2), k.size(2)});
    if (c.kernel == "flash")
      return std::vector<at::Tensor>{
          std::get<0>(at::_scaled_dot_product_flash_attention(q, k, v, c.dropout, c.causal, false, c.scale))};
    if (c.kernel == "efficient")  // compute_log_sumexp false: the tracer asks for it
      return std::vector<at::Tensor>{
          std::get<0>(at::_scaled_dot_product_efficient_attention(q, k, v, bias, false, c.dropout, c.causal, c.scale))};
    return std::vector<at::Tensor>{std::get<0>(
        at::_scaled_dot_product_cudnn_attention(q, k, v, bias, false, c.dropout, c.causal, false, c.scale))};
  };
}

// The same attention on LibTorch's math backend, which forward AD differentiates.
TensorFn math(const Case& c) {
  return [c](const std::vector<at::Tensor>& x) {
    examples::BackendScope scope(examples::Backend::Math);
    std::optional<at::Tensor> mask;
    if (c.bias) mask = x[3];
    return std::vector<at::Tensor>{
        at::scaled_dot_product_attention(x[0], x[1], x[2], mask, 0.0, c.causal, c.scale, c.heads != c.kv_heads)};
  };
}

std::vector<TraceInput> inputs(const Case& c) {
  at::manual_seed(3);
  auto opt = at::TensorOptions().dtype(c.dtype);
  std::vector<TraceInput> in = {{"q", at::randn({c.batch, c.heads, c.sq, c.d}, opt)},
                                {"k", at::randn({c.batch, c.kv_heads, c.sk, c.d}, opt)},
                                {"v", at::randn({c.batch, c.kv_heads, c.sk, c.d}, opt)}};
  if (c.bias) in.push_back({"mask", at::randn({c.sq, c.sk}, opt), false});
  return in;
}

class FusedEmulated : public ::testing::TestWithParam<Case> {};

TEST_P(FusedEmulated, MatchesMathPathForwardAdAtTheFourBmmFloor) {
  const Case& c = GetParam();
  std::vector<TraceInput> in = inputs(c);

  // The trace holds the kernel; its FLOPs carry a note where FlopCounterMode has no rule (GQA).
  int kernels = 0;
  Trace t = trace(fused(c), in);
  for (const Node* n : t.graph->nodes())
    if (n->op() == "aten::_scaled_dot_product_" + c.kernel + "_attention") {
      ++kernels;
      EXPECT_EQ(node_cost(*n).note != nullptr, c.heads != c.kv_heads);
    }
  ASSERT_EQ(kernels, 1);

  Linearized lin = linearize(fused(c), in);

  std::vector<at::Tensor> tangents;
  std::vector<std::optional<at::Tensor>> ref(in.size());
  for (size_t i = 0; i < 3; ++i) ref[i] = tangents.emplace_back(at::randn_like(in[i].value));
  std::vector<at::Tensor> got = lin.jvp(tangents);

  // Reference: forward AD of the math path in float64.
  std::vector<at::Tensor> primals64;
  for (auto& i : in) primals64.push_back(i.value.to(at::kDouble));
  for (auto& t : ref)
    if (t) t = t->to(at::kDouble);
  std::vector<at::Tensor> want = forward_ad_jvp(math(c), primals64, ref);
  ErrorStats err = compare(got, want);
  EXPECT_LT(err.rel_error, tolerance_for(c.dtype)) << "max_abs_error " << err.max_abs_error;

  // The tangent graph is the four-bmm floor; linearizing adds one q·kᵀ to the forward.
  int64_t qk = 2 * c.batch * c.heads * c.sq * c.sk * c.d;
  EXPECT_EQ(lin.report.tangent.matmul_flops, 4 * qk);
  EXPECT_EQ(lin.report.forward.matmul_flops, 2 * qk);
  EXPECT_EQ(lin.report.linearize_matmul_flops, 3 * qk);
}

// The O(L) form (jvpc::attention_tangent, residual budget 0) on each kernel's real schema and
// output layouts, in float64: equal to the P form and to forward AD of the math path. These
// kernels return their logsumexp in float32 whatever the dtype, which bounds both forms'
// agreement in float64 near float32's precision (the CPU flash kernel's, in the dtype, is held
// to 1e-10 in test_attention_form.cpp).
TEST_P(FusedEmulated, TheOLFormMatchesThePFormAndForwardAdInFloat64) {
  Case c = GetParam();
  c.dtype = at::kDouble;
  std::vector<TraceInput> in = inputs(c);
  LinearizeOptions ol, p;
  ol.residual_budget = 0;
  p.residual_budget = kNoMemoryLimit;
  Linearized a = linearize(fused(c), in, ol), b = linearize(fused(c), in, p);
  ASSERT_EQ(a.report.attention.size(), 1u);
  EXPECT_TRUE(a.report.attention[0].o_l_form);
  EXPECT_FALSE(b.report.attention[0].o_l_form);
  std::vector<at::Tensor> tangents;
  std::vector<std::optional<at::Tensor>> ref(in.size());
  for (size_t i = 0; i < 3; ++i) ref[i] = tangents.emplace_back(at::randn_like(in[i].value));
  std::vector<at::Tensor> got = a.jvp(tangents);
  EXPECT_LT(compare(got, b.jvp(tangents)).rel_error, 1e-6) << "O(L) vs P";
  std::vector<at::Tensor> primals;
  for (auto& i : in) primals.push_back(i.value);
  EXPECT_LT(compare(got, forward_ad_jvp(math(c), primals, ref)).rel_error, 1e-6) << "O(L) vs forward AD";
  // Five bmms per block where P takes four.
  int64_t qk = 2 * c.batch * c.heads * c.sq * c.sk * c.d;
  EXPECT_EQ(a.report.tangent.matmul_flops, 5 * qk);
}

// A graph file holding a fused kernel (with its non-tensor and undefined outputs) loads, folds
// through the runtime and gives the same linear map as linearizing the callable.
TEST_P(FusedEmulated, LinearizesTheSameFromAGraphFile) {
  const Case& c = GetParam();
  std::vector<TraceInput> in = inputs(c);
  std::string path = test::temp_path("graph.json");
  save(*trace(fused(c), in, TraceOptions::graph_only()).graph, path);
  Linearized from_file = linearize(load(path), test::values_of(in));
  Linearized direct = linearize(fused(c), in);
  EXPECT_EQ(from_file.report.tangent.matmul_flops, direct.report.tangent.matmul_flops);
  std::vector<at::Tensor> tangents;
  for (size_t i = 0; i < 3; ++i) tangents.push_back(at::randn_like(in[i].value));
  EXPECT_TRUE(from_file.jvp(tangents)[0].equal(direct.jvp(tangents)[0]));
}

TEST(FusedEmulated, AResultThatContradictsTheGraphFileIsAnError) {
  // The loader checks the declared output shapes by the kernel's shape rule and names the node.
  Case c;
  c.kernel = "efficient";
  std::vector<TraceInput> in = inputs(c);
  nlohmann::json j = to_json(*trace(fused(c), in, TraceOptions::graph_only()).graph);
  bool edited = false;
  for (auto& n : j["nodes"])
    if (n["op"] == "aten::_scaled_dot_product_efficient_attention") {
      n["outputs"][1]["meta"]["sizes"][2] = c.sq;  // the real logsumexp is padded to 64
      n["outputs"][1]["meta"]["strides"] = {c.heads * c.sq, c.sq, 1};
      edited = true;
    }
  ASSERT_TRUE(edited);
  for (auto run : std::vector<std::function<void()>>{[&] { linearize(from_json(j), test::values_of(in)); },
                                                     [&] { Executable(from_json(j)).run(test::values_of(in)); }})
    test::expect_error(run,
                       "node aten::_scaled_dot_product_efficient_attention -> %3: output %4 is declared f32[2,4,40] "
                       "but aten::_scaled_dot_product_efficient_attention produces f32[2,4,64]");
}

TEST(FusedEmulated, DropoutIsAnErrorNamingTheKernel) {
  for (std::string k : {"flash", "efficient", "cudnn"}) {
    Case c;
    c.kernel = k, c.dropout = 0.1;
    test::expect_error([&] { linearize(fused(c), inputs(c)); },
                       "aten::_scaled_dot_product_" + k + "_attention with dropout draws its mask inside the kernel");
  }
}

TEST(FusedEmulated, CudaFlashCausalWithUnequalLengthsIsAnErrorNamingTheKernel) {
  // FlashAttention-2 aligns a causal mask to the bottom right when Sq != Sk (LibTorch's SDPA
  // never sends that case to it); the rule covers top-left alignment only.
  Case c;
  c.kernel = "flash", c.causal = true, c.sq = 24, c.sk = 40;
  test::expect_error(
      [&] { linearize(fused(c), inputs(c)); },
      "pass 'jvp': JVP rule of aten::_scaled_dot_product_flash_attention: causal attention with query length 24 and key "
      "length 40 is aligned to the bottom right");
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (std::string k : {"flash", "efficient", "cudnn"}) {
    Case c;
    c.kernel = k;
    v.push_back(c);
    Case causal = c;
    causal.causal = true;
    v.push_back(causal);
    Case gqa = c;  // grouped heads (not for efficient attention, which takes equal heads), Sq != Sk, scale
    gqa.kv_heads = k == "efficient" ? 4 : 2, gqa.sq = 24, gqa.sk = 56, gqa.scale = 0.3;
    v.push_back(gqa);
    Case bf16 = causal;
    bf16.heads = bf16.kv_heads = 2, bf16.sq = bf16.sk = 33, bf16.d = 8, bf16.dtype = at::kBFloat16;
    v.push_back(bf16);
    Case seed = c;  // the seed's sizes, in bfloat16
    seed.batch = 1, seed.heads = seed.kv_heads = 5, seed.sq = seed.sk = 128, seed.d = 64, seed.dtype = at::kBFloat16;
    v.push_back(seed);
    if (k != "flash") {  // an additive mask (CUDA flash attention takes none)
      Case bias = c;
      bias.heads = bias.kv_heads = 2, bias.sk = 72, bias.bias = true;
      v.push_back(bias);
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Kernels, FusedEmulated, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return test_name(i.param); });

}  // namespace
}  // namespace jvpc
