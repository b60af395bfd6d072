// Random programs: seeded compositions of the ops the rules cover (elementwise, reductions,
// views, matmuls, softmax, layer norm, in-place updates), linearized in float64 and checked
// against LibTorch's forward AD and central differences. They put the rules and every pass
// (cse, simplify, fold, scale-to-residual, merge-factors, group-bmm, fuse) in arrangements no
// example has.
#include "compiler/api/linearize.h"
#include "compiler/api/program.h"
#include "compiler/api/reference.h"
#include "ir/printer.h"
#include "tests/batch_check.h"
#include "tests/helpers.h"

#include <random>

namespace jvpc {
namespace {

using Tensors = std::vector<at::Tensor>;
// One step: reads values a, b, c of the program so far ([3, 4] each) and returns a new one.
using Step = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

const std::vector<std::pair<const char*, Step>>& steps() {
  using T = const at::Tensor&;
  static const std::vector<std::pair<const char*, Step>> s = {
      {"tanh", [](T a, T, T) { return a.tanh(); }},
      {"sin", [](T a, T, T) { return a.sin(); }},
      {"sigmoid", [](T a, T, T) { return a.sigmoid(); }},
      {"exp-tanh", [](T a, T, T) { return a.tanh().exp(); }},
      {"gelu", [](T a, T, T) { return at::gelu(a); }},
      {"silu", [](T a, T, T) { return at::silu(a); }},
      {"scale", [](T a, T, T) { return a * 0.5 - 0.25; }},
      {"neg", [](T a, T, T) { return -a; }},
      {"square", [](T a, T, T) { return a.pow(2); }},
      {"sqrt", [](T a, T, T) { return (a * a + 1).sqrt(); }},
      {"log", [](T a, T, T) { return (a * a + 1).log(); }},
      {"rsqrt", [](T a, T, T) { return (a * a + 1).rsqrt(); }},
      {"erf", [](T a, T, T) { return a.erf(); }},
      {"add", [](T a, T b, T) { return at::add(a, b, 0.5); }},
      {"sub", [](T a, T b, T) { return a - b; }},
      {"mul", [](T a, T b, T) { return a * b; }},
      {"div", [](T a, T b, T) { return a / (b * b + 1); }},
      {"where", [](T a, T b, T c) { return at::where(c > 0, a, b); }},
      {"masked_fill_", [](T a, T b, T) { return a.clone().masked_fill_(b > 0.5, 0.5); }},
      {"mul_", [](T a, T b, T) { return a.clone().mul_(b).add_(a); }},
      {"tanh-mul_",
       [](T a, T b, T) {
         auto y = a.tanh();
         y.mul_(b);
         return y;
       }},  // mul_ writes a value a rule reads
      {"sin_",
       [](T a, T b, T) {
         auto y = a * b;
         y.sin_();
         return y;
       }},
      {"where-scalar", [](T a, T, T c) { return at::where(c > 0, a, 0.5); }},
      {"softmax", [](T a, T, T) { return a.softmax(-1); }},
      {"log_softmax", [](T a, T, T) { return a.log_softmax(0); }},
      {"layer_norm", [](T a, T, T) { return at::layer_norm(a, {4}); }},
      {"layer_norm_affine", [](T a, T b, T c) { return at::layer_norm(a, {4}, b[0], c[1]); }},
      {"row_sum", [](T a, T b, T) { return (a * a).sum(-1, true) * b; }},  // a's rows may sum to 0 (layer norm)
      {"col_mean", [](T a, T b, T) { return a.mean(0, true) + b; }},
      {"abc^T", [](T a, T b, T c) { return at::mm(at::mm(a, b.t()), c); }},
      {"addmm", [](T a, T b, T c) { return at::addmm(a[0], b, at::mm(c.t(), a)); }},
      {"bmm",
       [](T a, T b, T c) {
         return at::bmm(a.view({1, 3, 4}), b.t().reshape({1, 4, 3})).view({3, 3}).mm(c);
       }},
      {"matmul",
       [](T a, T b, T) {
         return at::matmul(a.unsqueeze(0).expand({2, 3, 4}), b.t()).sum(0).softmax(1).mm(b);
       }},
      {"transpose",
       [](T a, T, T) {
         return a.t().contiguous().view({4, 3}).t().contiguous().view({3, 4});
       }},
      {"flip", [](T a, T, T) { return a.flip({1}); }},
      {"roll", [](T a, T, T) { return a.roll({1}, {0}); }},
      {"cat",
       [](T a, T b, T) {
         return at::cat({a.slice(1, 0, 2), b.slice(1, 2, 4)}, 1);
       }},
      {"stack",
       [](T a, T b, T) {
         return at::stack({a, b}).sum(0);
       }},
      {"select", [](T a, T b, T) { return b * a.select(0, 1); }},
      {"index_select",
       [](T a, T, T) {
         return a.index_select(0, at::tensor({2, 0, 1}, at::kLong));
       }},
      {"tril", [](T a, T b, T) { return a.tril() + b.triu(1); }},
      {"clamp", [](T a, T, T) { return a.clamp(-0.6, 0.8); }},
      {"maximum", [](T a, T b, T) { return at::maximum(a, b); }},
      {"leaky_relu", [](T a, T, T) { return at::leaky_relu(a, 0.1); }},
      {"softplus", [](T a, T, T) { return at::softplus(a); }},
      {"addcmul", [](T a, T b, T c) { return at::addcmul(a, b, c, 0.5); }},
      {"lerp", [](T a, T b, T) { return at::lerp(a, b, 0.3); }},
      {"logsumexp", [](T a, T b, T) { return a.logsumexp(1, true) * b; }},
      {"var", [](T a, T b, T) { return a.var(0, true) + b; }},
      {"normalize", [](T a, T, T) { return a / at::linalg_vector_norm(a, 2, {1}, true).clamp_min(1e-6); }},
      {"amax", [](T a, T b, T) { return a.amax(1, true) + b; }},
      {"sort", [](T a, T, T) { return std::get<0>(a.sort(1)); }},
      {"cumsum", [](T a, T, T) { return a.cumsum(1); }},
      {"pad", [](T a, T, T) { return at::constant_pad_nd(a, {1, 0}, 2.0).slice(1, 0, 4); }},
      {"scatter_add",
       [](T a, T b,
          T) { return a.scatter_add(1, at::tensor({0, 3, 3, 1, 2, 0}, at::kLong).view({3, 2}), b.slice(1, 0, 2)); }},
  };
  return s;
}

struct Program {
  std::vector<std::tuple<size_t, size_t, size_t, size_t>> code;  // step, operands a, b, c
  std::string text;
};

Program make_program(uint32_t seed) {
  std::mt19937 rng(seed);
  Program p;
  size_t values = 3;  // the inputs
  size_t length = 4 + rng() % 6;
  for (size_t i = 0; i < length; ++i) {
    size_t s = rng() % steps().size();
    // Operands lean towards recent values, so programs are deep as well as wide.
    auto pick = [&] { return values - 1 - std::min<size_t>(rng() % 4, values - 1); };
    size_t a = pick(), b = pick(), c = rng() % values;
    p.code.emplace_back(s, a, b, c);
    p.text += std::string(p.text.empty() ? "" : "; ") + "v" + std::to_string(values) + " = " + steps()[s].first + "(v" +
              std::to_string(a) + ", v" + std::to_string(b) + ", v" + std::to_string(c) + ")";
    ++values;
  }
  return p;
}

TensorFn run(const Program& p) {
  return [p](const Tensors& in) {
    Tensors v = in;
    for (const auto& [s, a, b, c] : p.code) v.push_back(steps()[s].second(v[a], v[b], v[c]));
    return Tensors{v.back(), v[v.size() - 2]};  // two outputs, which may share work
  };
}

void check(uint32_t seed) {
  Program p = make_program(seed);
  TensorFn fn = run(p);
  at::manual_seed(seed);
  std::vector<TraceInput> primals;
  Tensors values, tangents;
  std::vector<std::optional<at::Tensor>> ref_tangents;
  for (int i = 0; i < 3; ++i) {
    values.push_back(at::randn({3, 4}, at::kDouble));
    tangents.push_back(at::randn({3, 4}, at::kDouble));
    ref_tangents.push_back(tangents.back());
    primals.push_back({"x" + std::to_string(i), values.back()});
  }
  Linearized lin = linearize(fn, primals);
  Tensors got = lin.jvp(tangents);
  Tensors ad = forward_ad_jvp(fn, values, ref_tangents);
  Tensors fd = central_differences_jvp(fn, values, ref_tangents);
  EXPECT_LT(compare(got, ad).rel_error, 1e-10) << "seed " << seed << ": " << p.text << "\n"
                                               << to_text(*lin.tangent_graph);
  EXPECT_LT(compare(got, fd).rel_error, 1e-5) << "seed " << seed << ": " << p.text;
  // The primal outputs are the callable's.
  Tensors eager = fn(values);
  for (size_t i = 0; i < eager.size(); ++i)
    EXPECT_TRUE(lin.primal_outputs[i].allclose(eager[i])) << "seed " << seed << ": " << p.text;
}

// One test for all seeds: each takes milliseconds, a process per seed would take a second.
// (Seeds up to 3000 were run once, and passed. Steps avoid exact cancellation: the row sums
// of a layer norm's output are 0, and the tangent of 0 is rounding noise.)
TEST(RandomPrograms, MatchForwardAdAndCentralDifferencesInFloat64) {
  const char* env = std::getenv("JVPC_RANDOM_PROGRAMS");  // more seeds, for a one-off run
  uint32_t seeds = env ? static_cast<uint32_t>(std::stoul(env)) : 300;
  for (uint32_t seed = 0; seed < seeds; ++seed) check(seed);
}

// Compiled once at one point, each program linearizes at another (compiler/api/program.h) as
// linearize does there, and as LibTorch's forward AD.
TEST(RandomPrograms, CompiledProgramsMatchLinearizeAtANewPointInFloat64) {
  for (uint32_t seed = 0; seed < 300; ++seed) {
    Program p = make_program(seed);
    TensorFn fn = run(p);
    at::manual_seed(seed);
    std::vector<TraceInput> primals, moved;
    Tensors values, tangents;
    std::vector<std::optional<at::Tensor>> ref;
    for (int i = 0; i < 3; ++i) {
      primals.push_back({"x" + std::to_string(i), at::randn({3, 4}, at::kDouble)});
      values.push_back(at::randn({3, 4}, at::kDouble));
      moved.push_back({"x" + std::to_string(i), values.back()});
      tangents.push_back(at::randn({3, 4}, at::kDouble));
      ref.push_back(tangents.back());
    }
    jvpc::Program prog = compile(fn, primals);
    Linearized got = prog.linearize(values);
    Tensors dy = got.jvp(tangents);
    EXPECT_LT(compare(dy, linearize(fn, moved).jvp(tangents)).rel_error, 1e-10) << "seed " << seed << ": " << p.text;
    EXPECT_LT(compare(dy, forward_ad_jvp(fn, values, ref)).rel_error, 1e-10) << "seed " << seed << ": " << p.text;
    EXPECT_LT(compare(got.primal_outputs, fn(values)).rel_error, 1e-12) << "seed " << seed << ": " << p.text;
  }
}

// The batched tangent graph (passes/batch.cpp) of each program: K tangents in one call equal K
// single calls, every op batched by a rule.
TEST(RandomPrograms, BatchedTangentsEqualKSingleCallsInFloat64) {
  for (uint32_t seed = 0; seed < 150; ++seed) {
    Program p = make_program(seed);
    at::manual_seed(seed);
    std::vector<TraceInput> primals;
    for (int i = 0; i < 3; ++i) primals.push_back({"x" + std::to_string(i), at::randn({3, 4}, at::kDouble)});
    Linearized lin = linearize(run(p), primals);
    test::BatchCheck r = test::batched_vs_single(lin, 3);
    EXPECT_LT(r.rel_error, 1e-12) << "seed " << seed << ": " << p.text;
    EXPECT_TRUE(r.unrolled.empty()) << "seed " << seed << ": " << ::testing::PrintToString(r.unrolled);
  }
}

}  // namespace
}  // namespace jvpc
