// attention-match (passes/attention_match.cpp): attention on LibTorch's math path and attention
// written by hand (matmul, bmm or einsum) get the O(L) form of their tangent. In float64, on
// every variant, the O(L) form (budget 0) equals the P form (budget inf), LibTorch's forward AD
// (1e-10) and central differences; the matmul FLOPs of a call, counted on the kernels that ran,
// are the cost model's in both forms; with the P form the graph is the one the rules gave, so
// group-bmm and zero-blocks apply as before; the seed linearizes with the same 20,971,520 FLOPs.
// A chain of views that is not the reshape the match expects leaves the graph as it was.
#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "ir/cost/kernel_watch.h"
#include "ir/io/limits.h"
#include "examples/examples.h"
#include "runtime/attention_tangent.h"
#include "tests/helpers.h"
#include "tests/pass_helpers.h"
#include "tests/same_structure.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <map>

namespace jvpc {
namespace {

using test::count_op;

// The text form with value ids renumbered in order of appearance: the same graph up to its ids.
std::string canonical(const Graph& g) {
  std::string text = to_text(g), out;
  std::map<std::string, int> ids;
  for (size_t i = 0; i < text.size();) {
    if (text[i] == '%' && i + 1 < text.size() && isdigit(static_cast<unsigned char>(text[i + 1]))) {
      size_t j = i + 1;
      while (j < text.size() && isdigit(static_cast<unsigned char>(text[j]))) ++j;
      auto it = ids.emplace(text.substr(i, j - i), static_cast<int>(ids.size())).first;
      out += "%" + std::to_string(it->second);
      i = j;
    } else {
      out += text[i++];
    }
  }
  return out;
}

LinearizeOptions with_budget(int64_t budget) {
  LinearizeOptions o;
  o.residual_budget = budget;
  return o;
}

// Random tangents for the differentiable inputs, in the tangent graph's order, and the same per
// input (none for the others) for the references.
struct Tangents {
  std::vector<at::Tensor> ordered;
  std::vector<std::optional<at::Tensor>> per_input;
};
Tangents random_tangents(const Linearized& lin, const std::vector<TraceInput>& in) {
  at::manual_seed(11);
  Tangents t;
  t.per_input.resize(in.size());
  for (const std::string& name : lin.tangent_names())
    for (size_t i = 0; i < in.size(); ++i)
      if ("d" + in[i].name == name) t.per_input[i] = t.ordered.emplace_back(at::randn_like(in[i].value));
  EXPECT_EQ(t.ordered.size(), lin.tangent_names().size());
  return t;
}

// Matmul FLOPs of one call, counted on the kernels that ran.
int64_t call_flops(const Linearized& lin, const std::vector<at::Tensor>& t, std::vector<at::Tensor>* out = nullptr) {
  KernelWatch w;
  std::vector<at::Tensor> r = lin.jvp(t);
  if (out) *out = r;
  return w.matmul_flops();
}

// The O(L) form against the P form, forward AD of `reference` and central differences of `fn`.
// Returns the O(L) form's result.
// `only_attention`: the function is the attention alone, whose FLOPs are the tangent graph's.
std::vector<at::Tensor> check_forms(const TensorFn& fn, const std::vector<TraceInput>& in, int attentions = 1,
                                    TensorFn reference = nullptr, double tol = 1e-10, bool only_attention = true) {
  if (!reference) reference = fn;
  Linearized ol = linearize(fn, in, with_budget(0));
  Linearized p = linearize(fn, in, with_budget(kNoMemoryLimit));
  EXPECT_EQ(count_op(*ol.tangent_graph, ops::jvpc_attention_tangent), attentions) << to_text(*ol.tangent_graph);
  EXPECT_EQ(count_op(*p.tangent_graph, ops::jvpc_attention_tangent), 0);
  EXPECT_EQ(ol.report.attention.size(), static_cast<size_t>(attentions));
  for (const AttentionChoice& c : ol.report.attention) EXPECT_TRUE(c.o_l_form) << c.node;
  EXPECT_EQ(ol.tangent_names(), p.tangent_names());
  Tangents t = random_tangents(ol, in);
  std::vector<at::Tensor> got, want;
  // Counted on the kernels that ran: the cost model's FLOPs, in both forms.
  EXPECT_EQ(call_flops(ol, t.ordered, &got), ol.report.tangent.matmul_flops);
  EXPECT_EQ(call_flops(p, t.ordered, &want), p.report.tangent.matmul_flops);
  if (attentions == 1 && only_attention && ol.report.attention.size() == 1) {
    EXPECT_EQ(ol.report.tangent.matmul_flops, ol.report.attention[0].o_l.matmul_flops);
  }
  EXPECT_LT(compare(got, want).rel_error, tol) << "O(L) vs P";
  std::vector<at::Tensor> primals = test::values_of(in);
  EXPECT_LT(compare(got, forward_ad_jvp(reference, primals, t.per_input)).rel_error, tol) << "O(L) vs forward AD";
  if (tol <= 1e-10) {
    EXPECT_LT(compare(got, central_differences_jvp(fn, primals, t.per_input)).rel_error, 1e-6)
        << "O(L) vs central differences";
  }
  return got;
}

// --- The math path, as the sdpa example traces it ---------------------------------------------

std::vector<std::vector<std::string>> math_configs() {
  return {
      {"sdpa"},
      {"sdpa", "--causal"},
      {"sdpa", "--causal", "--seq-len", "600"},  // several blocks (256 × 512), not dividing L
      {"sdpa", "--mask", "bool", "--seq-len", "300", "--kv-seq-len", "600"},
      {"sdpa", "--mask", "float", "--kv-seq-len", "96"},  // the mask's tangent too
      {"sdpa", "--kv-heads", "1"},
      {"sdpa", "--kv-heads", "5", "--model-dim", "640", "--causal"},
      {"sdpa", "--scale", "0.3", "--seq-len", "64"},
      {"sdpa", "--bsz", "2", "--seq-len", "40", "--kv-seq-len", "72"},
  };
}

class MathPath : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(MathPath, OLFormEqualsPFormForwardAdAndDifferencesInFloat64) {
  examples::Instance ex = test::make_example(GetParam(), {"--backend", "math", "--dtype", "float64"});
  check_forms(ex.fn(), ex.inputs, 1, ex.make_fn(examples::Backend::Math));
}

INSTANTIATE_TEST_SUITE_P(Sdpa, MathPath, ::testing::ValuesIn(math_configs()), [](const auto& info) {
  std::string s = test::config_name(info.param);
  for (char& ch : s)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
});

// A transformer block: q, k and v are projections inside the graph, their tangents too.
TEST(AttentionMatch, ATransformerBlockInFloat64) {
  for (bool causal : {false, true}) {
    std::vector<std::string> cfg = {"block", "--backend", "math", "--dtype", "float64", "--seq-len", "40"};
    if (causal) cfg.push_back("--causal");
    examples::Instance ex = test::make_example(cfg);
    check_forms(ex.fn(), ex.inputs, 1, ex.make_fn(examples::Backend::Math), 1e-10, false);
  }
}

// Budget inf: nothing is matched, the graph is the rules' P form exactly. Any budget that keeps
// P: the same graph up to its value ids (the P form is the rules' again), so that group-bmm
// (grouped heads) and the other passes apply as before.
TEST(AttentionMatch, ThePFormIsTheRulesGraphAsBefore) {
  for (const auto& cfg : test::example_configs()) {
    examples::Instance ex = test::make_example(cfg);
    LinearizeOptions off;
    off.disabled_passes = {"attention-match"};
    Linearized before = linearize(ex.fn(), ex.inputs, off);
    Linearized inf = linearize(ex.fn(), ex.inputs, with_budget(kNoMemoryLimit));
    Linearized roomy = linearize(ex.fn(), ex.inputs, with_budget(int64_t(1) << 40));
    EXPECT_TRUE(test::same_structure(*before.tangent_graph, *inf.tangent_graph)) << test::config_name(cfg);
    EXPECT_EQ(to_text(*before.tangent_graph), to_text(*inf.tangent_graph)) << test::config_name(cfg);
    EXPECT_EQ(canonical(*before.tangent_graph), canonical(*roomy.tangent_graph)) << test::config_name(cfg);
    const GraphCost &a = before.report.tangent, &b = roomy.report.tangent;
    EXPECT_EQ(a.nodes, b.nodes) << test::config_name(cfg);
    EXPECT_EQ(a.ops, b.ops) << test::config_name(cfg);
    EXPECT_EQ(a.matmul_flops, b.matmul_flops) << test::config_name(cfg);
    EXPECT_EQ(a.other_flops, b.other_flops) << test::config_name(cfg);
    EXPECT_EQ(a.residual_bytes, b.residual_bytes) << test::config_name(cfg);
    EXPECT_EQ(a.peak_bytes, b.peak_bytes) << test::config_name(cfg);
    EXPECT_EQ(before.report.linearize_matmul_flops, roomy.report.linearize_matmul_flops) << test::config_name(cfg);
  }
}

// The seed: the logsumexp comes from the traced scores (fold evaluates one logsumexp, no
// second forward), so linearize runs the forward's 20,971,520 matmul FLOPs in either form.
TEST(AttentionMatch, TheSeedLinearizesWithTheForwardsFlopsInEitherForm) {
  examples::Instance ex = test::make_example({"sdpa"});
  for (int64_t budget : {int64_t(0), kNoMemoryLimit}) {
    Linearized lin = linearize(ex.fn(), ex.inputs, with_budget(budget));
    EXPECT_EQ(lin.report.linearize_matmul_flops, 20971520) << budget;
    EXPECT_EQ(lin.report.tangent.matmul_flops, budget == 0 ? 52428800 : 41943040) << budget;
  }
  // The O(L) form holds the output and the logsumexp; q, k and v are the caller's.
  Linearized ol = linearize(ex.fn(), ex.inputs, with_budget(0));
  EXPECT_EQ(ol.report.tangent.residual_bytes, 5 * 128 * 64 * 4 + 5 * 128 * 4);
  EXPECT_EQ(ol.report.tangent.aliased_input_bytes, 3 * 5 * 128 * 64 * 4);
}

// --- Attention written by hand -------------------------------------------------------------

at::TensorOptions f64() { return at::TensorOptions().dtype(at::kDouble); }
constexpr double kInf = std::numeric_limits<double>::infinity();

// B 2, H 4, Lq 300, Lk 600 (blocks do not divide either), D 16, Dv 24.
std::vector<TraceInput> qkv(int64_t hkv = 4, int64_t B = 2, int64_t H = 4, int64_t Lq = 300, int64_t Lk = 600,
                            int64_t D = 16, int64_t Dv = 24) {
  at::manual_seed(3);
  return {{"q", at::randn({B, H, Lq, D}, f64())},
          {"k", at::randn({B, hkv, Lk, D}, f64())},
          {"v", at::randn({B, hkv, Lk, Dv}, f64())}};
}

at::Tensor kt(const at::Tensor& k) { return k.transpose(-2, -1); }

TEST(HandWritten, MatmulScaledAfter) {
  check_forms(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor s = at::matmul(x[0], kt(x[1])) * 0.25;
        return std::vector<at::Tensor>{at::matmul(at::softmax(s, -1), x[2])};
      },
      qkv());
}

TEST(HandWritten, MatmulScaledBeforeOnBothSides) {
  check_forms(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor s = at::matmul(x[0] * 0.5, kt(x[1] * 0.5));
        return std::vector<at::Tensor>{at::matmul(at::softmax(s, -1), x[2])};
      },
      qkv());
}

TEST(HandWritten, DividedBySqrtD) {
  check_forms(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor s = at::matmul(x[0], kt(x[1])) / std::sqrt(16.0);
        return std::vector<at::Tensor>{at::matmul(at::softmax(s, -1), x[2])};
      },
      qkv());
}

// Scales held in one-element tensors (as Python's `s * scale` passes a wrapped number, or a
// module's captured scale): mul.Tensor and div.Tensor by a constant of the graph.
TEST(HandWritten, ScalesInOneElementTensors) {
  at::Tensor half = at::scalar_tensor(0.5, f64()), four = at::scalar_tensor(4.0, f64());
  check_forms(
      [half, four](const std::vector<at::Tensor>& x) {
        at::Tensor s = at::matmul(x[0] * half, kt(x[1])) / four;
        return std::vector<at::Tensor>{at::matmul(at::softmax(half * s, -1), x[2])};
      },
      qkv());
}

TEST(HandWritten, KTransposedByTheCaller) {
  std::vector<TraceInput> in = qkv();
  in[1].value = in[1].value.transpose(-2, -1).contiguous();  // [B, H, D, Lk]
  check_forms(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor s = at::matmul(x[0], x[1]) * 0.25;
        return std::vector<at::Tensor>{at::matmul(at::softmax(s, -1), x[2])};
      },
      in);
}

TEST(HandWritten, Bmm) {
  std::vector<TraceInput> in = qkv();
  for (TraceInput& i : in) i.value = i.value.reshape({-1, i.value.size(2), i.value.size(3)}).contiguous();
  check_forms(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor s = at::bmm(x[0], x[1].transpose(1, 2)) * 0.25;
        return std::vector<at::Tensor>{at::bmm(at::softmax(s, -1), x[2])};
      },
      in);
}

TEST(HandWritten, AdditiveMaskWithItsTangent) {
  std::vector<TraceInput> in = qkv();
  in.push_back({"mask", at::randn({300, 600}, f64())});
  check_forms(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor s = at::matmul(x[0], kt(x[1])) * 0.25 + x[3];
        return std::vector<at::Tensor>{at::matmul(at::softmax(s, -1), x[2])};
      },
      in);
}

TEST(HandWritten, MaskedFillWithABooleanMask) {
  std::vector<TraceInput> in = qkv();
  at::Tensor hidden = at::rand({300, 600}, f64()).gt(0.7);
  hidden.select(1, 0).fill_(false);  // no row entirely hidden (softmax would give NaN there)
  in.push_back({"hidden", hidden});
  check_forms(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor s = (at::matmul(x[0], kt(x[1])) * 0.25).masked_fill(x[3], -kInf);
        return std::vector<at::Tensor>{at::matmul(at::softmax(s, -1), x[2])};
      },
      in);
}

TEST(HandWritten, CausalByMaskedFillOfTriu) {
  check_forms(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor s = at::matmul(x[0], kt(x[1])) * 0.25;
        at::Tensor future = at::ones({s.size(-2), s.size(-1)}, at::TensorOptions().dtype(at::kBool)).triu(1);
        return std::vector<at::Tensor>{at::matmul(at::softmax(s.masked_fill(future, -kInf), -1), x[2])};
      },
      qkv());
  // Causal skipping: the cost model's FLOPs are those of the blocks that run, fewer than all.
  Linearized ol = linearize(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor s = at::matmul(x[0], kt(x[1])) * 0.25;
        at::Tensor future = at::ones({s.size(-2), s.size(-1)}, at::TensorOptions().dtype(at::kBool)).triu(1);
        return std::vector<at::Tensor>{at::matmul(at::softmax(s.masked_fill(future, -kInf), -1), x[2])};
      },
      qkv(), with_budget(0));
  ASSERT_EQ(ol.report.attention.size(), 1u);
  EXPECT_LT(ol.report.attention[0].o_l.matmul_flops, int64_t(2) * 2 * 4 * 300 * 600 * (3 * 16 + 2 * 24));
}

TEST(HandWritten, GroupedQueryAttentionByRepeatInterleave) {
  std::vector<at::Tensor> got = check_forms(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor k = x[1].repeat_interleave(2, 1), v = x[2].repeat_interleave(2, 1);
        at::Tensor s = at::matmul(x[0], kt(k)) * 0.25;
        return std::vector<at::Tensor>{at::matmul(at::softmax(s, -1), v)};
      },
      qkv(2));
  // Not repeated per call: the node reads the 2 key heads.
  Linearized ol = linearize(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor k = x[1].repeat_interleave(2, 1), v = x[2].repeat_interleave(2, 1);
        return std::vector<at::Tensor>{at::matmul(at::softmax(at::matmul(x[0], kt(k)) * 0.25, -1), v)};
      },
      qkv(2), with_budget(0));
  for (const Node* n : ol.tangent_graph->nodes()) {
    EXPECT_NE(n->op(), "aten::clone");
    if (n->op() == ops::jvpc_attention_tangent) {
      EXPECT_EQ(n->input(1)->meta().sizes[1], 2);
    }
  }
}

TEST(HandWritten, MultiQueryAttentionByExpand) {
  check_forms(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor k = x[1].expand({2, 4, 600, 16}), v = x[2].expand({2, 4, 600, 24});
        at::Tensor s = at::matmul(x[0], kt(k)) * 0.25;
        return std::vector<at::Tensor>{at::matmul(at::softmax(s, -1), v)};
      },
      qkv(1));
}

// Softmax in float32 over bfloat16 scores, as hand-written attention often does it: the O(L) form
// computes the scores in float32 itself, as the kernels do.
// Softmax in float32 over bfloat16 scores, as the fused kernels compute it: the O(L) form against
// the P form and, in float32 on the same values, against forward AD.
void check_reduced_softmax(const TensorFn& fn) {
  std::vector<TraceInput> in = qkv(2, 1, 2, 64, 96, 16, 16);
  for (TraceInput& i : in) i.value = i.value.to(at::kBFloat16);
  Linearized ol = linearize(fn, in, with_budget(0));
  Linearized p = linearize(fn, in, with_budget(kNoMemoryLimit));
  EXPECT_EQ(count_op(*ol.tangent_graph, ops::jvpc_attention_tangent), 1);
  Tangents t = random_tangents(ol, in);
  std::vector<at::Tensor> got = ol.jvp(t.ordered), want = p.jvp(t.ordered);
  EXPECT_LT(compare(got, want).rel_error, 2e-2);
  std::vector<at::Tensor> primals;
  std::vector<std::optional<at::Tensor>> t32;
  for (const TraceInput& i : in) primals.push_back(i.value.to(at::kFloat));
  for (const auto& x : t.per_input) t32.push_back(x ? std::optional<at::Tensor>(x->to(at::kFloat)) : std::nullopt);
  EXPECT_LT(compare(got, forward_ad_jvp(fn, primals, t32)).rel_error, 2e-2);
}

TEST(HandWritten, SoftmaxInAnotherDtype) {
  check_reduced_softmax([](const std::vector<at::Tensor>& x) {
    at::Tensor s = at::matmul(x[0], kt(x[1])) * 0.25;
    return std::vector<at::Tensor>{at::matmul(at::softmax(s.to(at::kFloat), -1).to(x[0].scalar_type()), x[2])};
  });
}

// --- Attention written with einsum --------------------------------------------------------------

// einsum reaches the bmms through unsqueezes and permutes of its operands, reshaped to [B·H, L, X]
// (k's to kᵀ), and the same on the result: chains whose composite is the reshape (or, for k, the
// transposed reshape) that matmul's are.
at::Tensor einsum(const char* eq, const at::Tensor& a, const at::Tensor& b) { return at::einsum(eq, {a, b}); }

std::vector<at::Tensor> einsum_attention(const std::vector<at::Tensor>& x) {
  at::Tensor s = einsum("bhqd,bhkd->bhqk", x[0], x[1]) * 0.25;
  return {einsum("bhqk,bhkd->bhqd", at::softmax(s, -1), x[2])};
}

// B 2, H 4, Lq 300, Lk 600, D 16, Dv 24: one call runs the O(L) form's 2·B·H·Lq·Lk·(3D + 2Dv)
// matmul FLOPs, counted on the kernels that ran.
TEST(Einsum, ScaledAfter) {
  check_forms(einsum_attention, qkv());
  Linearized ol = linearize(einsum_attention, qkv(), with_budget(0));
  EXPECT_EQ(call_flops(ol, random_tangents(ol, qkv()).ordered), int64_t(2) * 2 * 4 * 300 * 600 * (3 * 16 + 2 * 24));
  // The node reads the caller's q, k and v (aliases, not copies); it holds O and the logsumexp.
  EXPECT_EQ(ol.report.tangent.aliased_input_bytes, 8 * (2 * 4 * 300 * 16 + 2 * 4 * 600 * 16 + 2 * 4 * 600 * 24));
  EXPECT_EQ(ol.report.tangent.residual_bytes, 8 * (2 * 4 * 300 * 24 + 2 * 4 * 300));
}

TEST(Einsum, ScaledBeforeOnBothSides) {
  check_forms(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor s = einsum("bhqd,bhkd->bhqk", x[0] * 0.5, x[1] / 2.0);
        return std::vector<at::Tensor>{einsum("bhqk,bhkd->bhqd", at::softmax(s, -1), x[2])};
      },
      qkv());
}

// The operands in the other order: kᵀ·q's subscripts give the same scores, v·P's the same output.
TEST(Einsum, OperandsInTheOtherOrder) {
  check_forms(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor s = einsum("bhkd,bhqd->bhqk", x[1], x[0]) * 0.25;
        return std::vector<at::Tensor>{einsum("bhkd,bhqk->bhqd", x[2], at::softmax(s, -1))};
      },
      qkv());
}

// Sequence-major tensors [B, L, H, D], as projections give them, and the output in that layout.
TEST(Einsum, SequenceMajorLayout) {
  std::vector<TraceInput> in = qkv();
  for (TraceInput& i : in) i.value = i.value.transpose(1, 2).contiguous();
  check_forms(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor s = einsum("bqhd,bkhd->bhqk", x[0], x[1]) * 0.25;
        return std::vector<at::Tensor>{einsum("bhqk,bkhd->bqhd", at::softmax(s, -1), x[2])};
      },
      in);
}

TEST(Einsum, SoftmaxInAnotherDtype) {
  check_reduced_softmax([](const std::vector<at::Tensor>& x) {
    at::Tensor s = einsum("bhqd,bhkd->bhqk", x[0], x[1]) * 0.25;
    return std::vector<at::Tensor>{
        einsum("bhqk,bhkd->bhqd", at::softmax(s.to(at::kFloat), -1).to(x[0].scalar_type()), x[2])};
  });
}

TEST(Einsum, EllipsisWithAnAdditiveMaskAndItsTangent) {
  std::vector<TraceInput> in = qkv();
  in.push_back({"mask", at::randn({300, 600}, f64())});
  check_forms(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor s = einsum("...qd,...kd->...qk", x[0], x[1]) / std::sqrt(16.0) + x[3];
        return std::vector<at::Tensor>{einsum("...qk,...kd->...qd", at::softmax(s, -1), x[2])};
      },
      in);
}

// Three dims, [B·H, L, X], causal by masked_fill of triu.
TEST(Einsum, ThreeDimsCausal) {
  std::vector<TraceInput> in = qkv();
  for (TraceInput& i : in) i.value = i.value.reshape({-1, i.value.size(2), i.value.size(3)}).contiguous();
  auto fn = [](const std::vector<at::Tensor>& x) {
    at::Tensor s = einsum("nqd,nkd->nqk", x[0], x[1]) * 0.25;
    at::Tensor future = at::ones({s.size(-2), s.size(-1)}, at::TensorOptions().dtype(at::kBool)).triu(1);
    return std::vector<at::Tensor>{einsum("nqk,nkd->nqd", at::softmax(s.masked_fill(future, -kInf), -1), x[2])};
  };
  check_forms(fn, in);
  Linearized ol = linearize(fn, in, with_budget(0));
  ASSERT_EQ(ol.report.attention.size(), 1u);
  EXPECT_LT(ol.report.attention[0].o_l.matmul_flops, int64_t(2) * 2 * 4 * 300 * 600 * (3 * 16 + 2 * 24));
}

// Grouped-query attention as einsum writes it: q [B, Hkv, G, Lq, D] against k [B, Hkv, Lk, D],
// whose bmm takes the G·Lq query rows of a key head together. Not repeated per call: the node
// reads the 2 key heads.
TEST(Einsum, GroupedQueryHeads) {
  auto fn = [](const std::vector<at::Tensor>& x) {
    at::Tensor q = x[0].view({2, 2, 2, 300, 16});
    at::Tensor s = einsum("bhgqd,bhkd->bhgqk", q, x[1]) * 0.25;
    return std::vector<at::Tensor>{einsum("bhgqk,bhkd->bhgqd", at::softmax(s, -1), x[2]).reshape({2, 4, 300, 24})};
  };
  check_forms(fn, qkv(2));
  Linearized ol = linearize(fn, qkv(2), with_budget(0));
  for (const Node* n : ol.tangent_graph->nodes()) {
    EXPECT_NE(n->op(), "aten::clone");
    if (n->op() == ops::jvpc_attention_tangent) {
      EXPECT_EQ(n->input(1)->meta().sizes, (std::vector<int64_t>{2, 2, 600, 16}));
    }
  }
}

// Scores written [.., k, q], the softmax over q: einsum's bmm then multiplies k by qᵀ, attention
// with k's rows as the queries, and it is matched as that.
TEST(Einsum, ScoresWrittenKeysFirst) {
  check_forms(
      [](const std::vector<at::Tensor>& x) {
        at::Tensor s = einsum("bhqd,bhkd->bhkq", x[0], x[1]) * 0.25;
        return std::vector<at::Tensor>{einsum("bhkq,bhqd->bhkd", at::softmax(s, -1), x[2])};
      },
      qkv(4, 2, 4, 64, 64));
}

// Near misses, with Lq = Lk so that every size fits: the scores as a transposition of the bmm's
// result (taken as the reshape, q and k would swap roles), and P transposed before it meets v
// (Pᵀ·v). Neither is attention: the graph stays the rules' and its tangents are exact.
TEST(Einsum, NearMissesAreNotMatched) {
  std::vector<TensorFn> fns = {
      [](const std::vector<at::Tensor>& x) {
        at::Tensor s = einsum("bhqd,bhkd->bhqk", x[0], x[1]).transpose(-2, -1) * 0.25;
        return std::vector<at::Tensor>{einsum("bhkq,bhqd->bhkd", at::softmax(s, -1), x[2])};
      },
      [](const std::vector<at::Tensor>& x) {
        at::Tensor p = at::softmax(einsum("bhqd,bhkd->bhqk", x[0], x[1]) * 0.25, -1);
        return std::vector<at::Tensor>{einsum("bhqk,bhkd->bhqd", p.transpose(-2, -1), x[2])};
      },
  };
  std::vector<TraceInput> in = qkv(4, 2, 4, 64, 64);
  LinearizeOptions off;
  off.disabled_passes = {"attention-match"};
  for (size_t i = 0; i < fns.size(); ++i) {
    Linearized before = linearize(fns[i], in, off);
    Linearized ol = linearize(fns[i], in, with_budget(0));
    EXPECT_EQ(count_op(*ol.tangent_graph, ops::jvpc_attention_tangent), 0) << i;
    EXPECT_TRUE(ol.report.attention.empty()) << i;
    EXPECT_EQ(canonical(*before.tangent_graph), canonical(*ol.tangent_graph)) << i;
    Tangents t = random_tangents(ol, in);
    EXPECT_LT(compare(ol.jvp(t.ordered), forward_ad_jvp(fns[i], test::values_of(in), t.per_input)).rel_error, 1e-10)
        << i;
  }
}

// --- Masked rows and blocks -------------------------------------------------------------------

// A query row and a whole key block (keys 512..599 of the second block) masked out, on the math
// path: _safe_softmax gives the row 0, and so do both forms.
TEST(AttentionMatch, AFullyMaskedRowAndKeyBlockOnTheMathPath) {
  at::Tensor keep = at::rand({300, 600}, f64()).gt(0.3);
  keep.narrow(1, 512, 88).fill_(false);
  keep.select(0, 7).fill_(false);
  std::vector<TraceInput> in = qkv(4, 1);
  in.push_back({"keep", keep});
  auto fn = [](const std::vector<at::Tensor>& x) {
    examples::BackendScope math(examples::Backend::Math);
    return std::vector<at::Tensor>{at::scaled_dot_product_attention(x[0], x[1], x[2], x[3])};
  };
  std::vector<at::Tensor> got = check_forms(fn, in);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].select(2, 7).abs().max().item<double>(), 0.0);
}

// --- Composition ------------------------------------------------------------------------------

// A decoding step over a KV cache (a constant past): with the P form zero-blocks skips the
// cache's zero tangent as before; the O(L) form is exact too.
TEST(AttentionMatch, AKvCacheKeepsZeroBlocksInThePForm) {
  at::manual_seed(4);
  at::Tensor past_k = at::randn({1, 4, 64, 16}, f64()), past_v = at::randn({1, 4, 64, 16}, f64());
  auto fn = [past_k, past_v](const std::vector<at::Tensor>& x) {
    examples::BackendScope math(examples::Backend::Math);
    at::Tensor k = at::cat({past_k, x[1]}, 2), v = at::cat({past_v, x[2]}, 2);
    return std::vector<at::Tensor>{at::scaled_dot_product_attention(x[0], k, v)};
  };
  std::vector<TraceInput> in = {{"q", at::randn({1, 4, 1, 16}, f64())},
                                {"k", at::randn({1, 4, 1, 16}, f64())},
                                {"v", at::randn({1, 4, 1, 16}, f64())}};
  LinearizeOptions off;
  off.disabled_passes = {"attention-match"};
  Linearized before = linearize(fn, in, off);
  Linearized roomy = linearize(fn, in, with_budget(int64_t(1) << 40));
  EXPECT_EQ(before.report.tangent.matmul_flops, roomy.report.tangent.matmul_flops);
  EXPECT_EQ(before.report.tangent.ops, roomy.report.tangent.ops);
  EXPECT_EQ(canonical(*before.tangent_graph), canonical(*roomy.tangent_graph));
  EXPECT_LT(roomy.report.tangent.matmul_flops, roomy.report.attention.at(0).p.matmul_flops);  // the zeros skipped
  check_forms(fn, in);
}

// Two attentions, each chosen by the budget like the fused kernels' (AttentionFormChoice).
TEST(AttentionMatch, TwoAttentionsAreChosenApart) {
  auto fn = [](const std::vector<at::Tensor>& x) {
    examples::BackendScope math(examples::Backend::Math);
    at::Tensor a = at::scaled_dot_product_attention(x[0], x[0], x[0]);
    at::Tensor b = at::scaled_dot_product_attention(x[1], x[1], x[1], {}, 0.0, true);
    return std::vector<at::Tensor>{a, b};
  };
  at::manual_seed(2);
  std::vector<TraceInput> in = {{"x", at::randn({1, 2, 600, 16}, f64())}, {"y", at::randn({1, 2, 64, 16}, f64())}};
  check_forms(fn, in, 2);
  Linearized p = linearize(fn, in, with_budget(kNoMemoryLimit));
  // A roomy budget keeps P on a bound of the count; one just under that bound counts.
  Linearized roomy = linearize(fn, in, with_budget(int64_t(1) << 40));
  ASSERT_EQ(roomy.report.attention.size(), 2u);
  Linearized all_p = linearize(fn, in, with_budget(roomy.report.attention[0].counted_bytes - 1));
  ASSERT_EQ(all_p.report.attention.size(), 2u);
  EXPECT_FALSE(all_p.report.attention[0].o_l_form);
  EXPECT_FALSE(all_p.report.attention[1].o_l_form);
  int64_t total = all_p.report.attention[0].counted_bytes;  // the whole tangent graph, P everywhere
  EXPECT_LT(total, roomy.report.attention[0].counted_bytes);
  Linearized tight = linearize(fn, in, with_budget(total - 1));
  EXPECT_TRUE(tight.report.attention[0].o_l_form);
  EXPECT_FALSE(tight.report.attention[1].o_l_form);
  EXPECT_EQ(count_op(*tight.tangent_graph, ops::jvpc_attention_tangent), 1);
  Tangents t = random_tangents(tight, in);
  EXPECT_LT(compare(tight.jvp(t.ordered), p.jvp(t.ordered)).rel_error, 1e-10);
}

}  // namespace
}  // namespace jvpc
