// JVP rules at the points a table of random cases does not reach: singular and transposed
// matrices, factorizations the tangent graph must not repeat, underflowing scans, masked
// softmax inputs, normalization without affine parameters, running statistics, mixed dtypes,
// and the names the jvp pass gives tangents.
#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "ir/builder.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/passes.h"
#include "tests/helpers.h"

#include <ATen/ATen.h>

#include <set>

namespace jvpc {
namespace {

// det at a singular matrix: the tangent is Σ cof(A) ⊙ dA, which central differences confirm
// (LibTorch's forward AD gives 0 there: det times an inverse that does not exist).
TEST(SolverRules, DetOfASingularMatrixHasItsCofactorsAsTangent) {
  at::Tensor s = at::tensor({1., 2., 3., 2., 4., 6., 0., 1., 1.}, at::kDouble).view({3, 3});  // rank 2
  TensorFn fn = [](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{at::linalg_det(x[0])}; };
  for (const at::Tensor& a : {s, s.mT()}) {  // factored as Aᵀ and as A
    at::Tensor t = at::randn({3, 3}, at::kDouble);
    at::Tensor got = linearize(fn, {{"A", a}}).jvp({t})[0];
    at::Tensor fd = central_differences_jvp(fn, {a}, {t})[0];
    EXPECT_LT(test::rel_error(got, fd), 1e-6);
    EXPECT_GT(got.abs().item<double>(), 1e-3);
  }
}

// det and slogdet factor Aᵀ when A is contiguous as LibTorch counts it, ignoring the strides of
// size-1 dims ([1, 3, 3] with strides (3, 3, 1) is contiguous; taking it as transposed flips the adjoint).
TEST(SolverRules, ContiguityIsLibTorchsForDetAndSlogdet) {
  at::Tensor a = at::randn({3, 1, 3}, at::kDouble).transpose(0, 1), t = at::randn({1, 3, 3}, at::kDouble);
  ASSERT_TRUE(a.is_contiguous());
  for (bool log : {false, true}) {
    TensorFn fn = [log](const std::vector<at::Tensor>& x) {
      return std::vector<at::Tensor>{log ? std::get<1>(at::linalg_slogdet(x[0])) : at::linalg_det(x[0])};
    };
    at::Tensor got = linearize(fn, {{"A", a}}).jvp({t})[0];
    EXPECT_LT(test::rel_error(got, forward_ad_jvp(fn, {a}, {t})[0]), 1e-10) << (log ? "slogdet" : "det");
  }
}

// A tangent graph reuses the primal's factorization, held as a residual: it runs no
// factorization, and svdvals and eigvalsh (whose tangents need the vectors the primal op did not
// compute) cost one matmul per call.
TEST(SolverRules, TangentGraphsRunNoFactorization) {
  const std::set<std::string> factorizations = {
      "aten::_linalg_svd",      "aten::linalg_qr",     "aten::linalg_lu_factor_ex",          "aten::linalg_lu",
      "aten::lu_unpack",        "aten::_linalg_eigh",  "aten::linalg_pinv.atol_rtol_tensor", "aten::linalg_lstsq",
      "aten::_linalg_solve_ex", "aten::linalg_inv_ex", "aten::linalg_cholesky_ex",           "aten::_linalg_det",
      "aten::_linalg_slogdet"};
  auto two = [](std::function<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&)> f) -> TensorFn {
    return [f](const std::vector<at::Tensor>& x) {
      auto [a, b] = f(x[0]);
      return std::vector<at::Tensor>{a, b};
    };
  };
  std::vector<std::pair<std::string, TensorFn>> fns = {
      {"svd",
       [](auto& x) {
         auto [u, s, vh] = at::linalg_svd(x[0], false);
         return std::vector<at::Tensor>{u, s, vh};
       }},
      {"svdvals", [](auto& x) { return std::vector<at::Tensor>{at::linalg_svdvals(x[0])}; }},
      {"eigvalsh", [](auto& x) { return std::vector<at::Tensor>{at::linalg_eigvalsh(x[0].narrow(0, 0, 3))}; }},
      {"qr", two([](auto& a) { return at::linalg_qr(a); })},
      {"qr r", two([](auto& a) { return at::linalg_qr(a, "r"); })},
      {"lu_factor", two([](auto& a) { return at::linalg_lu_factor(a); })},
      {"pinv", [](auto& x) { return std::vector<at::Tensor>{at::linalg_pinv(x[0])}; }},
      {"lstsq",
       [](auto& x) { return std::vector<at::Tensor>{std::get<0>(at::linalg_lstsq(x[0], x[0].sum(-1, true)))}; }},
      {"slogdet",
       [](auto& x) { return std::vector<at::Tensor>{std::get<1>(at::linalg_slogdet(x[0].narrow(0, 0, 3)))}; }},
  };
  for (const auto& [name, fn] : fns) {
    Linearized lin = linearize(fn, {{"A", at::randn({4, 3}, at::kDouble)}});
    for (const Node* n : lin.tangent_graph->nodes())
      EXPECT_FALSE(factorizations.count(n->op())) << name << ": " << n->op();
    if (name == "svdvals" || name == "eigvalsh") {
      EXPECT_EQ(lin.report.tangent.ops.count("aten::mm") ? lin.report.tangent.ops.at("aten::mm") : 0, 1) << name;
    }
  }
}

// lu_solve's tangent through LU exists for left=true, adjoint=false; otherwise an error naming it.
TEST(SolverRules, LuSolveThroughLuOfATransposedSystemIsAnError) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    auto [LU, piv] = at::linalg_lu_factor(x[0]);
    return std::vector<at::Tensor>{at::linalg_lu_solve(LU, piv, x[1], /*left=*/true, /*adjoint=*/true)};
  };
  test::expect_error(
      [&] {
        linearize(fn, {{"A", at::randn({3, 3}, at::kDouble)}, {"B", at::randn({3, 2}, at::kDouble)}});
      },
      "JVP rule of aten::linalg_lu_solve: no tangent through LU for left=false or adjoint=true");
}

// Q of a complete QR with more rows than columns is not determined by A: an error naming the op.
TEST(SolverRules, CompleteQrOfATallMatrixIsAnError) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{std::get<0>(at::linalg_qr(x[0], "complete"))};
  };
  test::expect_error(
      [&] {
        linearize(fn, {{"A", at::randn({5, 3}, at::kDouble)}});
      },
      "JVP rule of aten::linalg_qr: Q of a complete QR");
}

// logcumsumexp where a prefix's exponentials underflow or are exp(−inf): 0 there, as in LibTorch,
// not NaN.
TEST(ScanRules, LogcumsumexpIsFiniteWherePrefixesUnderflow) {
  at::Tensor x = at::tensor({-INFINITY, -1000., 0., 1.}, at::kDouble), t = at::randn({4}, at::kDouble);
  TensorFn fn = [](const std::vector<at::Tensor>& v) { return std::vector<at::Tensor>{v[0].logcumsumexp(0)}; };
  at::Tensor got = linearize(fn, {{"x", x}}).jvp({t})[0];
  EXPECT_TRUE(got.isfinite().all().item<bool>()) << got;
  EXPECT_LT(test::rel_error(got.slice(0, 2), forward_ad_jvp(fn, {x}, {t})[0].slice(0, 2)), 1e-12);
}

// A norm asked for in float32 of float16 values: computed in float32, where the norm does not
// overflow (a factor cast down to float16 would be inf, and the tangent 0).
TEST(NormRule, WidensToTheResultsDtype) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{at::linalg_vector_norm(x[0], 2, std::nullopt, false, at::kFloat)};
  };
  at::Tensor x = at::full({20000}, 1000.0, at::kHalf), t = at::full({20000}, 1e-3, at::kHalf);
  at::Tensor got = linearize(fn, {{"x", x}}).jvp({t}).at(0);
  at::Tensor want = forward_ad_jvp(fn, {x.to(at::kFloat)}, {t.to(at::kFloat)}).at(0);
  EXPECT_LT(test::rel_error(got, want), 1e-3) << got << want;
}

// The tangent of a softmax's input filled with −inf keeps its mask: where the fill hides the
// log of a zero, the tangent there is inf, and out · t = 0 · inf would make the row NaN (so the
// mask stays even though the output is 0 there).
TEST(SoftmaxRules, TheTangentOfAMaskedFillKeepsItsMask) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{
        x[0].log().masked_fill(x[0] == 0, -std::numeric_limits<double>::infinity()).softmax(-1)};
  };
  at::Tensor x = at::tensor({0.5, 0.0, 1.0}, at::kDouble), t = at::ones({3}, at::kDouble);
  at::Tensor got = linearize(fn, {{"x", x}}).jvp({t})[0];
  EXPECT_TRUE(got.isfinite().all().item<bool>()) << got;
  EXPECT_LT(test::rel_error(got, forward_ad_jvp(fn, {x}, {t})[0]), 1e-12) << got;
}

// Without weight and bias, a normalization's output is x̂: the rule reads it rather than a
// recomputed copy, so a matmul reading that output too keeps one residual.
TEST(NormalizationRules, AnOutputWithoutAffineIsItsOwnNormalizedInput) {
  for (const char* norm : {"layer", "group"}) {
    TensorFn fn = [norm](const std::vector<at::Tensor>& x) {
      at::Tensor h = std::string(norm) == "layer" ? at::layer_norm(x[0], {32})
                                                  : at::group_norm(x[0].view({16, 32, 1}), 4).view({16, 32});
      return std::vector<at::Tensor>{at::mm(h, x[1])};
    };
    Linearized lin = linearize(fn, {{"x", at::randn({16, 32})}, {"w", at::randn({32, 8})}});
    int64_t stats = std::string(norm) == "layer" ? 16 : 16 * 4;  // rstd per row, or per group
    EXPECT_EQ(lin.report.tangent.residual_bytes, (16 * 32 + stats) * 4) << norm << "\n" << to_text(*lin.tangent_graph);
  }
}

// Running statistics are buffers: differentiating them is an error naming them, as in LibTorch.
TEST(BatchNormRule, RunningStatisticsAreNotDifferentiable) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{at::batch_norm(x[0], {}, {}, x[1], x[2], false, 0.1, 1e-5, false)};
  };
  std::vector<TraceInput> in = {{"x", at::randn({4, 3})}, {"mean", at::zeros({3})}, {"var", at::ones({3})}};
  test::expect_error([&] { linearize(fn, in); },
                     "JVP rule of aten::native_batch_norm: running_mean and running_var are not differentiable");
  LinearizeOptions only_x;
  only_x.wrt = {"x"};
  EXPECT_EQ(linearize(fn, in, only_x).jvp({at::ones({4, 3})}).at(0).sizes(), at::IntArrayRef({4, 3}));
}

// On CUDA, native_layer_norm keeps float16 statistics in float32, and the rule's arithmetic
// with them is float32; the jvp pass casts each tangent to its primal's dtype, so the next
// matmul does not mix float32 and float16 (LibTorch's own forward AD fails there). Checked on
// the meta device, whose shape rule follows CUDA (the CPU kernel keeps the input's dtype).
TEST(LayerNormRule, TangentsTakeTheirPrimalsDtypesWhenTheStatisticsAreFloat32) {
  Graph g;
  auto half = [](std::vector<int64_t> s) {
    return TensorMeta::contiguous(std::move(s), c10::kHalf, c10::Device("meta"));
  };
  Value* x = g.add_input("x", half({2, 3, 8}), Role::Primal, true);
  Value* w = g.add_input("w", half({8}), Role::Primal, true);
  Value* b = g.add_input("b", half({8}), Role::Primal, true);
  Value* m = g.add_input("m", half({8, 4}), Role::Primal, true);
  Builder bld(g);
  std::vector<Value*> ln = bld.emit("aten::native_layer_norm", {x, std::vector<int64_t>{8}, w, b, 1e-5});
  ASSERT_EQ(ln[1]->meta().dtype, c10::kFloat);
  g.add_output(bld.call("aten::mm", {bld.call("aten::view", {ln[0], std::vector<int64_t>{6, 8}}), m}));
  ASSERT_TRUE(jvp(g));
  verify(g);
  EXPECT_EQ(g.outputs().back()->meta().dtype, c10::kHalf) << to_text(g);
}

// Tangent names never collide with the graph's own names, and each tangent says whose it is.
TEST(JvpPass, TangentNamesAreFreshAndSayWhoseTheyAre) {
  Graph g;
  Value* x = g.add_input("x", test::f32({3}), Role::Primal, true);
  Value* dx = g.add_input("dx", test::f32({3}), Role::Primal, true);
  Builder b(g);
  g.add_output(b.call("aten::sin", {b.call("aten::mul.Tensor", {x, dx})}), "out0");
  g.add_output(b.call("aten::cos", {x}), "dout0");
  ASSERT_TRUE(jvp(g));
  verify(g);
  std::vector<std::pair<std::string, std::string>> tangents;
  for (const Input& in : g.inputs())
    if (in.role == Role::Tangent) tangents.emplace_back(in.name, in.tangent_of);
  EXPECT_EQ(tangents, (std::vector<std::pair<std::string, std::string>>{{"dx'", "x"}, {"ddx", "dx"}}));
  EXPECT_EQ(g.output_names(), (std::vector<std::string>{"out0", "dout0", "dout0'", "ddout0"}));
}
}  // namespace
}  // namespace jvpc
