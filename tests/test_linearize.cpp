// linearize end to end: the seed's numbers, the 2x rule over a sweep of sizes, every SDPA
// variant, MLP and transformer block against forward AD, residual accounting, and errors.
#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "ir/cost/kernel_watch.h"
#include "ir/printer.h"
#include "ir/io/graph_files.h"
#include "compiler/trace/tracer.h"
#include "passes/linearize_pipeline.h"
#include "runtime/executable.h"
#include "tests/helpers.h"

#include <random>
#include <unordered_set>

namespace jvpc {
namespace {

struct Checked {
  Linearized lin;
  ErrorStats err;
};

// Linearizes an example, runs the linear map on random tangents, and compares with forward AD
// of the untraced callable on the math backend.
Checked linearize_and_check(const examples::Instance& ex, const LinearizeOptions& opt = {}) {
  Checked c{linearize(ex.fn(), ex.inputs, opt), {}};
  std::vector<at::Tensor> tangents;
  std::vector<std::optional<at::Tensor>> ref(ex.inputs.size());
  for (const Input* in : c.lin.jvp_fn->arguments()) {
    at::Tensor t = at::randn(in->value->meta().sizes,
                             at::TensorOptions().dtype(in->value->meta().dtype).device(in->value->meta().device));
    tangents.push_back(t);
    for (size_t i = 0; i < ex.inputs.size(); ++i)
      if (ex.inputs[i].name == in->tangent_of) ref[i] = t;
  }
  auto got = c.lin.jvp(tangents);
  auto want = forward_ad_jvp(ex.make_fn(examples::Backend::Math), test::values_of(ex.inputs), ref);
  c.err = compare(got, want);
  return c;
}

int64_t matmul_kernels(const GraphCost& c) {
  int64_t n = 0;
  for (const char* op : {"aten::bmm", "aten::baddbmm", "aten::mm", "aten::addmm"})
    if (c.ops.count(op)) n += c.ops.at(op);
  return n;
}

TEST(Linearize, SeedSdpaReachesTheFourBmmFloorAndOneForward) {
  auto ex = test::make_example({"sdpa"});
  Checked c = linearize_and_check(ex);
  const CompileReport& r = c.lin.report;
  EXPECT_EQ(r.forward.matmul_flops, 20971520);
  EXPECT_EQ(r.tangent.matmul_flops, 41943040);    // PyTorch's first jvp_fn call: 62,914,560
  EXPECT_EQ(r.linearize_matmul_flops, 20971520);  // PyTorch's linearize: 83,886,080
  EXPECT_EQ(matmul_kernels(r.tangent), 4);
  EXPECT_LT(c.err.rel_error, 1e-5);
}

// Each linear layer's tangent accumulates into its bias tangent: addmm(addmm(db, dx, Wᵀ), x, dWᵀ),
// with no separate mm or add (the addmm rule sums d(self) first; fuse-matmul-add takes the
// broadcast bias as addmm's self).
TEST(Linearize, LinearLayersAccumulateIntoTheBiasTangent) {
  auto ex = test::make_example({"mlp", "--seq-len", "16"});
  Checked c = linearize_and_check(ex);
  const auto& ops = c.lin.report.tangent.ops;
  EXPECT_EQ(ops.count("aten::addmm") ? ops.at("aten::addmm") : 0, 4);
  EXPECT_EQ(ops.count("aten::mm"), 0u);
  EXPECT_EQ(ops.count("aten::add.Tensor"), 0u);
  EXPECT_LT(c.err.rel_error, 1e-5);
}

TEST(Linearize, EveryPassHasACostRowWithPassCosts) {
  auto ex = test::make_example({"sdpa"});
  LinearizeOptions every;
  every.pass_costs = true;
  Linearized lin = linearize(ex.fn(), ex.inputs, every);
  ASSERT_EQ(lin.report.passes.size(), linearize_passes().size() + 1);
  EXPECT_EQ(lin.report.passes.front().pass, "trace");
  EXPECT_EQ(lin.report.passes[1].pass, "jvp");
  EXPECT_EQ(lin.report.passes.front().cost.matmul_flops, 20971520);
  EXPECT_EQ(lin.report.passes.back().cost.matmul_flops, 41943040);
  // Without: the traced graph and the tangent graph, counted alike.
  Linearized two = linearize(ex.fn(), ex.inputs);
  ASSERT_EQ(two.report.passes.size(), 2u);
  EXPECT_EQ(two.report.passes[0].pass, "trace");
  EXPECT_EQ(two.report.passes[1].pass, "tangent graph");
  EXPECT_EQ(two.report.passes[0].cost.matmul_flops, 20971520);
  EXPECT_EQ(two.report.passes[1].cost.matmul_flops, 41943040);
  EXPECT_EQ(two.report.passes[1].cost.residual_bytes, lin.report.passes.back().cost.residual_bytes);
  EXPECT_EQ(two.report.tangent.peak_bytes, lin.report.tangent.peak_bytes);
}

TEST(Linearize, TangentMatmulFlopsAreTwiceTheForwardOnARandomSweep) {
  std::mt19937 rng(7);
  auto pick = [&](std::vector<int64_t> v) { return v[rng() % v.size()]; };
  for (int i = 0; i < 12; ++i) {
    int64_t hd = pick({8, 16, 32}), heads = pick({1, 2, 3, 4}), seq = pick({5, 16, 33}), kv = pick({5, 16, 40});
    std::vector<std::string> cfg = {"sdpa",
                                    "--bsz",
                                    std::to_string(pick({1, 2})),
                                    "--head-dim",
                                    std::to_string(hd),
                                    "--model-dim",
                                    std::to_string(hd * heads),
                                    "--seq-len",
                                    std::to_string(seq),
                                    "--kv-seq-len",
                                    std::to_string(kv)};
    int variant = static_cast<int>(rng() % 3);
    if (variant == 1) cfg.insert(cfg.end(), {"--mask", "bool"});
    if (variant == 2) cfg.insert(cfg.end(), {"--mask", "float"});
    if (rng() % 2) cfg.insert(cfg.end(), {"--dtype", "float64"});
    if (heads > 1 && rng() % 2) cfg.insert(cfg.end(), {"--kv-heads", std::to_string(heads % 2 ? 1 : heads / 2)});
    auto ex = test::make_example(cfg);
    Checked c = linearize_and_check(ex);
    SCOPED_TRACE(test::config_name(cfg));
    EXPECT_EQ(c.lin.report.tangent.matmul_flops, 2 * c.lin.report.forward.matmul_flops);
    EXPECT_EQ(c.lin.report.linearize_matmul_flops, c.lin.report.forward.matmul_flops);
    EXPECT_LT(c.err.rel_error, tolerance_for(ex.dtype));
    EXPECT_EQ(c.lin.report.tangent.ops.count("aten::clone"), 0u);  // grouped heads too: no copies per call
  }
}

TEST(Linearize, FusedBackendsAddOneQkTransposeToLinearize) {
  auto ex = test::make_example({"sdpa", "--backend", "flash"});
  Checked c = linearize_and_check(ex);
  int64_t qk = 2 * 5 * 128 * 128 * 64;
  EXPECT_EQ(c.lin.report.linearize_matmul_flops, c.lin.report.forward.matmul_flops + qk);
  EXPECT_EQ(c.lin.report.tangent.matmul_flops, 41943040);
  EXPECT_LT(c.err.rel_error, 1e-5);
}

class WholeGraph : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(WholeGraph, MatchesForwardAdInEveryFloatingDtype) {
  for (const char* dtype : {"float32", "float64", "float16", "bfloat16"}) {
    auto ex = test::make_example(GetParam(), {"--dtype", dtype});
    Checked c = linearize_and_check(ex);
    EXPECT_LT(c.err.rel_error, tolerance_for(ex.dtype)) << test::config_name(GetParam()) << " " << dtype;
    EXPECT_EQ(c.lin.report.tangent.matmul_flops, 2 * c.lin.report.forward.matmul_flops) << dtype;
  }
}

// A second reference that shares nothing with LibTorch's forward AD: central differences of
// the example's own callable (its own SDPA backend) in float64, (f(x + h·t) − f(x − h·t)) / 2h.
TEST_P(WholeGraph, MatchesCentralDifferencesInFloat64) {
  auto ex = test::make_example(GetParam(), {"--dtype", "float64"});
  Linearized lin = linearize(ex.fn(), ex.inputs);
  std::vector<at::Tensor> tangents;
  std::vector<std::optional<at::Tensor>> ref(ex.inputs.size());
  for (const Input* arg : lin.jvp_fn->arguments()) {
    tangents.push_back(at::randn(arg->value->meta().sizes, at::kDouble));
    for (size_t i = 0; i < ex.inputs.size(); ++i)
      if (ex.inputs[i].name == arg->tangent_of) ref[i] = tangents.back();
  }
  auto fd = central_differences_jvp(ex.fn(), test::values_of(ex.inputs), ref);
  EXPECT_LT(compare(lin.jvp(tangents), fd).rel_error, 1e-6) << test::config_name(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Examples, WholeGraph, ::testing::ValuesIn(test::example_configs()),
                         [](const auto& info) { return "config" + std::to_string(info.index); });

TEST(Linearize, EveryResidualIsReadAndResidualBytesAreTheirSum) {
  for (auto cfg : test::example_configs()) {
    auto ex = test::make_example(cfg);
    Linearized lin = linearize(ex.fn(), ex.inputs);
    std::unordered_set<const void*> storages;
    int64_t owned = 0, aliased = 0;
    for (const Input& in : lin.tangent_graph->inputs()) {
      if (in.role != Role::Constant) continue;
      EXPECT_TRUE(in.value->has_uses()) << test::config_name(cfg) << ": residual " << in.name << " is never read";
      if (!storages.insert(in.data.storage().unsafeGetStorageImpl()).second) continue;
      (in.aliases.empty() ? owned : aliased) += static_cast<int64_t>(in.data.storage().nbytes());
    }
    EXPECT_EQ(lin.report.tangent.residual_bytes, owned) << test::config_name(cfg);
    EXPECT_EQ(lin.report.tangent.aliased_input_bytes, aliased) << test::config_name(cfg);
  }
}

TEST(Linearize, ResidualsOfTheSeedAreTheScaledOperandsTheProbabilitiesAndV) {
  auto ex = test::make_example({"sdpa"});
  Linearized lin = linearize(ex.fn(), ex.inputs);
  EXPECT_EQ(lin.report.tangent.residual_bytes, 2 * 163840 + 327680);  // q·s, k·s, softmax
  EXPECT_EQ(lin.report.tangent.aliased_input_bytes, 163840);          // v, held by the caller
}

TEST(Linearize, JvpCallsCopyNoTangent) {
  // Grouped-query attention too: its repeated heads are read unrepeated (group_bmm.cpp).
  for (auto cfg : std::vector<std::vector<std::string>>{
           {"sdpa"}, {"sdpa", "--kv-heads", "1"}, {"sdpa", "--backend", "flash", "--kv-heads", "1"}}) {
    SCOPED_TRACE(test::config_name(cfg));
    auto ex = test::make_example(cfg);
    Linearized lin = linearize(ex.fn(), ex.inputs);
    std::vector<at::Tensor> tangents;
    for (const Input* in : lin.jvp_fn->arguments()) tangents.push_back(at::randn(in->value->meta().sizes));
    KernelWatch watch;
    lin.jvp(tangents);
    for (const auto& k : watch.kernels())
      for (const char* copy : {"aten::clone", "aten::copy_", "aten::_to_copy", "aten::contiguous"}) EXPECT_NE(k, copy);
    EXPECT_EQ(watch.matmul_flops(), 41943040);
    EXPECT_EQ(matmul_kernels(lin.report.tangent), 4);
  }
}

// In-place ops on intermediates whose earlier values a rule reads: folding must see each value as
// it was before the write (a value kept by reference would be seen after it).
TEST(Linearize, InPlaceUpdatesKeepTheValuesFoldingSees) {
  using V = std::vector<at::Tensor>;
  std::vector<std::pair<const char*, TensorFn>> fns = {
      {"mul_",
       [](const V& x) {
         auto y = x[0] * 2;
         y.mul_(x[0]);
         return V{y};
       }},
      {"sin_",
       [](const V& x) {
         auto y = x[0] * 2;
         y.sin_();
         return V{y};
       }},
      {"exp_ of exp",
       [](const V& x) {
         auto y = x[0].exp();
         y.exp_();
         return V{y};
       }},
      {"read before add_",
       [](const V& x) {
         auto y = x[0].sigmoid();
         auto z = y * 1.0;
         y.add_(1);
         return V{z};
       }},
      {"view of the written",
       [](const V& x) {
         auto y = x[0].tanh();
         auto v = y.view({12}) * y.view({12});
         y.mul_(3);
         return V{v, y};
       }},
  };
  for (const auto& [name, fn] : fns) {
    at::Tensor x = at::randn({3, 4}, at::kDouble), t = at::randn({3, 4}, at::kDouble);
    Linearized lin = linearize(fn, {{"x", x}});
    EXPECT_LT(compare(lin.jvp({t}), forward_ad_jvp(fn, {x}, {t})).rel_error, 1e-10) << name;
  }
}

// A zero tangent folds to a constant; each call returns a copy of it, so writing into one
// result changes no later result. Identity tangents are the caller's own.
TEST(Linearize, ConstantResultsAreCopiesAndIdentitiesAreTheCallersTangents) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{x[0] * 2, at::ones({3}, at::kDouble) * 3, x[0]};
  };
  Linearized lin = linearize(fn, {{"x", at::randn({3}, at::kDouble)}});
  at::Tensor dx = at::randn({3}, at::kDouble);
  std::vector<at::Tensor> first = lin.jvp({dx});
  first[1].add_(100);
  EXPECT_TRUE(lin.jvp({dx})[1].equal(at::zeros({3}, at::kDouble)));
  EXPECT_TRUE(first[2].is_same(dx));
}

TEST(Linearize, WrtChoosesTheDifferentiatedInputs) {
  auto ex = test::make_example({"sdpa"});
  LinearizeOptions opt;
  opt.wrt = {"v"};
  Checked c = linearize_and_check(ex, opt);
  EXPECT_EQ(c.lin.tangent_names(), std::vector<std::string>{"dv"});
  EXPECT_EQ(matmul_kernels(c.lin.report.tangent), 1);  // P·dv
  EXPECT_LT(c.err.rel_error, 1e-5);
}

TEST(Linearize, FromAGraphFileGivesTheSameTangentGraph) {
  auto ex = test::make_example({"sdpa"});
  Trace t = trace(ex.fn(), ex.inputs, TraceOptions::graph_only());
  std::string path = test::temp_path("graph.json");
  save(*t.graph, path);
  Linearized from_file = linearize(load(path), test::values_of(ex.inputs));
  Linearized direct = linearize(ex.fn(), ex.inputs);
  EXPECT_EQ(to_text(*from_file.tangent_graph).size(), to_text(*direct.tangent_graph).size());
  EXPECT_EQ(from_file.report.linearize_matmul_flops, 20971520);
  EXPECT_EQ(from_file.report.tangent.matmul_flops, 41943040);
  std::vector<at::Tensor> tangents;
  for (const Input* in : direct.jvp_fn->arguments()) tangents.push_back(at::randn(in->value->meta().sizes));
  EXPECT_TRUE(from_file.jvp(tangents)[0].allclose(direct.jvp(tangents)[0], 1e-5, 1e-6));
}

TEST(Linearize, TheTangentGraphSavesAndRunsAlone) {
  auto ex = test::make_example({"sdpa"});
  Linearized lin = linearize(ex.fn(), ex.inputs);
  std::string path = test::temp_path("tangent.json");
  save(*lin.tangent_graph, path);
  Executable alone(load(path));
  std::vector<at::Tensor> tangents;
  for (const Input* in : alone.arguments()) tangents.push_back(at::randn(in->value->meta().sizes));
  EXPECT_TRUE(alone.run(tangents)[0].equal(lin.jvp(tangents)[0]));
}

using test::expect_error;

TEST(Linearize, WrongTangentsAreErrorsNamingTheTangent) {
  auto ex = test::make_example({"sdpa"});
  Linearized lin = linearize(ex.fn(), ex.inputs);
  at::Tensor ok = at::randn({1, 5, 128, 64});
  expect_error([&] { lin.jvp({ok, ok}); }, "expected 3 input tensors, got 2");
  expect_error([&] { lin.jvp({ok, at::randn({1, 5, 128, 32}), ok}); }, "tangent 'dk': expected shape");
  expect_error([&] { lin.jvp({ok, ok, ok.to(at::kDouble)}); }, "tangent 'dv': expected dtype");
  expect_error(
      [&] {
        lin.jvp({at::empty({1, 5, 128, 64}, at::device(at::kMeta)), ok, ok});
      },
      "tangent 'dq': expected device");
}

// An integer input (indices) is not differentiated by default; naming it in wrt is an error.
TEST(Linearize, IntegerInputsAreNotDifferentiatedByDefault) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{x[0].index_select(0, x[1])}; };
  std::vector<TraceInput> in = {{"x", at::randn({4, 3})}, {"idx", at::tensor({3, 0}, at::kLong)}};
  Linearized lin = linearize(fn, in);
  EXPECT_EQ(lin.tangent_names(), std::vector<std::string>{"dx"});
  LinearizeOptions wrt_idx;
  wrt_idx.wrt = {"idx"};
  expect_error([&] { linearize(fn, in, wrt_idx); }, "input 'idx' has dtype Long and cannot be differentiated");
}

TEST(Linearize, AnOpWithoutARuleIsAnErrorNamingIt) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{at::linalg_householder_product(x[0], x[0].select(1, 0))};
  };
  expect_error([&] { linearize(fn, {{"x", at::randn({3, 3})}}); }, "no JVP rule for aten::linalg_householder_product");
}

// A random op's draw is the tracing run's: the map is for that draw, as forward AD's is for the
// one it makes, so both agree when seeded alike; a jvp call draws nothing. Dropout on the CPU is
// empty_like(x).bernoulli_(1 - p), and SDPA's math path takes it for its dropout_p.
TEST(Linearize, RandomOpsUseTheTracingRunsDraw) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    at::Tensor noise = at::randn_like(x[0]) * 0.1;
    return std::vector<at::Tensor>{at::dropout(x[0].sin(), 0.5, true) + noise};
  };
  TensorFn attn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{at::scaled_dot_product_attention(x[0], x[0], x[0], {}, 0.5)};
  };
  for (auto [f, shape] : {std::pair{fn, std::vector<int64_t>{64}}, std::pair{attn, std::vector<int64_t>{1, 2, 6, 4}}}) {
    at::Tensor x = at::randn(shape, at::kDouble), t = at::randn(shape, at::kDouble);
    at::manual_seed(7);
    Linearized lin = linearize(f, {{"x", x}});
    at::Tensor after = at::rand({4});
    at::manual_seed(7);
    at::Tensor want = forward_ad_jvp(f, {x}, {t}).at(0);
    at::Tensor after_ad = at::rand({4});
    EXPECT_TRUE(at::equal(after, after_ad)) << "the trace draws as eager code does";
    at::manual_seed(11);
    EXPECT_LT(compare(lin.jvp({t}), {want}).rel_error, 1e-12);
    at::Tensor after_jvp = at::rand({4});
    at::manual_seed(11);
    EXPECT_TRUE(at::equal(after_jvp, at::rand({4}))) << "a jvp call draws nothing";
  }
}

TEST(Linearize, UnknownWrtIsAnError) {
  auto ex = test::make_example({"sdpa"});
  LinearizeOptions opt;
  opt.wrt = {"mask"};
  expect_error([&] { linearize(ex.fn(), ex.inputs, opt); }, "wrt: no primal input named 'mask'");
}

// Tangents are taken in wrt's order, not graph order (with wrt = {v, k} graph order would swap two
// tangents of one shape, silently).
TEST(Linearize, TangentsFollowWrtsOrder) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{x[0] * 2 + x[1] * 3}; };
  at::Tensor k = at::randn({4}, at::kDouble), v = at::randn({4}, at::kDouble), dk = at::randn({4}, at::kDouble),
             dv = at::randn({4}, at::kDouble);
  LinearizeOptions opt;
  opt.wrt = {"v", "k"};
  Linearized lin = linearize(fn, {{"k", k}, {"v", v}}, opt);
  EXPECT_EQ(lin.tangent_names(), (std::vector<std::string>{"dv", "dk"}));
  EXPECT_TRUE(lin.jvp({dv, dk})[0].allclose(dk * 2 + dv * 3));
  opt.wrt = {"k", "k"};
  expect_error([&] { linearize(fn, {{"k", k}, {"v", v}}, opt); }, "wrt: names 'k' twice");
}

// A residual that is a view of a caller's input holds the caller's tensor; writing into that input
// after linearize would mix new values with residuals computed from the old ones (W.mul_(2)).
// jvp() refuses, naming the input.
TEST(Linearize, WritingAnAliasedInputAfterLinearizeIsAnError) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{at::matmul(x[0], x[1]).sin()}; };
  at::Tensor x = at::randn({3, 4}, at::kDouble), w = at::randn({4, 5}, at::kDouble);
  at::Tensor dx = at::randn({3, 4}, at::kDouble), dw = at::randn({4, 5}, at::kDouble);
  Linearized lin = linearize(fn, {{"x", x}, {"W", w}});
  bool aliased = false;
  for (const Input& in : lin.tangent_graph->inputs()) aliased |= in.aliases == "W";
  ASSERT_TRUE(aliased) << "the test needs a residual that aliases W";
  lin.jvp({dx, dw});
  w.mul_(2);
  expect_error(
      [&] {
        lin.jvp({dx, dw});
      },
      "aliases the input 'W', which was written in place after the graph was compiled");
}

// The same hazard through the other ways a caller shares a residual: a tensor the function
// captured (weights in a closure), and the graph saved or compiled again after the write (each
// would silently give results that match neither the old point nor the new one).
TEST(Linearize, WritingACapturedTensorAfterLinearizeIsAnError) {
  at::Tensor w = at::randn({4, 4}, at::kDouble), x = at::randn({3, 4}, at::kDouble),
             dx = at::randn({3, 4}, at::kDouble);
  TensorFn fn = [w](const std::vector<at::Tensor>& a) {
    return std::vector<at::Tensor>{at::mm(at::tanh(at::mm(a[0], w)), w)};
  };
  Linearized lin = linearize(fn, {{"x", x}});
  lin.jvp({dx});
  w.add_(0.5);  // an optimizer step
  expect_error([&] { lin.jvp({dx}); },
               "was written in place after the graph was compiled (it is a tensor the traced function captured");
  expect_error([&] { save(*lin.tangent_graph, test::temp_path("t.json")); },
               "was written in place after the graph was compiled");
  expect_error([&] { Executable again(lin.tangent_graph); }, "was written in place after the graph was compiled");
}

// A primal output that is a residual (exp's output is its derivative) goes to the caller as a
// copy: writing into one's result does not change later jvp calls.
TEST(Linearize, WritingAPrimalOutputLeavesTheJvpAlone) {
  TensorFn fn = [](const std::vector<at::Tensor>& a) { return std::vector<at::Tensor>{a[0].exp(), a[0].softmax(-1)}; };
  at::Tensor x = at::randn({3, 4}, at::kDouble), dx = at::randn({3, 4}, at::kDouble);
  Linearized lin = linearize(fn, {{"x", x}});
  std::vector<at::Tensor> before = lin.jvp({dx});
  for (at::Tensor& out : lin.primal_outputs) out.mul_(10);
  std::vector<at::Tensor> after = lin.jvp({dx});
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(after[i].equal(before[i])) << i;
}

// ATen's recurrent cells and layers: the cells chunk their gates (unsafe_chunk) and apply the
// activations in place, which the tracer writes through to the gates (so LSTMs and GRUs trace at
// all). In float32 on the CPU, at::lstm runs oneDNN's fused layer
// (mkldnn_rnn_layer), whose rule is checked against forward AD of the unfused path.
TEST(Linearize, RecurrentCellsAndLayersFromATen) {
  auto o = at::TensorOptions().dtype(at::kDouble);
  at::Tensor seq = at::randn({5, 3, 4}, o), h = at::randn({3, 5}, o), c = at::randn({3, 5}, o);
  at::Tensor w4 = at::randn({20, 4}, o), u4 = at::randn({20, 5}, o), b4 = at::randn({20}, o), d4 = at::randn({20}, o);
  at::Tensor w3 = at::randn({15, 4}, o), u3 = at::randn({15, 5}, o), b3 = at::randn({15}, o), d3 = at::randn({15}, o);
  std::vector<std::pair<std::string, TensorFn>> fns = {
      {"lstm_cell",
       [&](auto& a) {
         auto [h1, c1] = at::lstm_cell(a[0][0], {a[1], c}, a[2], u4, b4, d4);
         return std::vector<at::Tensor>{h1, c1};
       }},
      {"gru_cell", [&](auto& a) { return std::vector<at::Tensor>{at::gru_cell(a[0][0], a[1], a[2], u3, b3, d3)}; }},
      {"lstm",
       [&](auto& a) {
         auto r =
             at::lstm(a[0], {a[1].unsqueeze(0), c.unsqueeze(0)}, {a[2], u4, b4, d4}, true, 1, 0.0, false, false, false);
         return std::vector<at::Tensor>{std::get<0>(r), std::get<2>(r)};
       }},
      {"gru",
       [&](auto& a) {
         auto r = at::gru(a[0], a[1].unsqueeze(0), {a[2], u3, b3, d3}, true, 1, 0.0, false, false, false);
         return std::vector<at::Tensor>{std::get<0>(r)};
       }},
  };
  for (const auto& [name, fn] : fns) {
    std::vector<at::Tensor> x = {seq, h, name == "gru" || name == "gru_cell" ? w3 : w4}, t;
    std::vector<std::optional<at::Tensor>> ref;
    for (const at::Tensor& v : x) t.push_back(at::randn_like(v)), ref.push_back(t.back());
    std::vector<at::Tensor> got = linearize(fn, {{"x", x[0]}, {"h", x[1]}, {"w", x[2]}}).jvp(t),
                            want = forward_ad_jvp(fn, x, ref);
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_LT(test::rel_error(got[i], want[i]), 1e-12) << name << " output " << i;
  }
}

TEST(Linearize, OneDnnLstmLayersMatchForwardAdOfTheUnfusedPath) {
  if (!at::hasMKLDNN() || !at::globalContext().userEnabledMkldnn()) GTEST_SKIP() << "no oneDNN";
  auto f32 = [](std::vector<int64_t> s) { return at::randn(s, at::kFloat); };
  // two layers, both directions, batch first; the weights of the first layer's forward direction differentiated
  std::vector<at::Tensor> w = {f32({20, 4}),  f32({20, 5}), f32({20}),     f32({20}),    f32({20, 4}), f32({20, 5}),
                               f32({20}),     f32({20}),    f32({20, 10}), f32({20, 5}), f32({20}),    f32({20}),
                               f32({20, 10}), f32({20, 5}), f32({20}),     f32({20})};
  for (bool biases : {true, false}) {
    TensorFn fn = [&](const std::vector<at::Tensor>& a) {
      std::vector<at::Tensor> params = {a[3], a[4], w[2], a[5]};
      for (size_t i = 4; i < w.size(); ++i) params.push_back(w[i]);
      if (!biases) params = {a[3], a[4], w[4], w[5], w[8], w[9], w[12], w[13]};
      auto r = at::lstm(a[0], {a[1], a[2]}, params, biases, 2, 0.0, false, true, true);
      return std::vector<at::Tensor>{std::get<0>(r), std::get<1>(r), std::get<2>(r)};
    };
    std::vector<at::Tensor> x = {f32({3, 6, 4}), f32({4, 3, 5}), f32({4, 3, 5}),
                                 w[0].clone(),   w[1].clone(),   w[3].clone()},
                            t;
    std::vector<std::optional<at::Tensor>> ref;
    std::vector<TraceInput> in;
    for (size_t i = 0; i < x.size(); ++i) {
      t.push_back(at::randn_like(x[i]));
      ref.push_back(t.back());
      in.push_back({"x" + std::to_string(i), x[i]});
    }
    // the biases alone too: their tangent has no time or batch dims
    LinearizeOptions biases_only;
    biases_only.wrt = {"x5"};
    std::vector<at::Tensor> got_b = linearize(fn, in, biases_only).jvp({t[5]});
    std::vector<std::optional<at::Tensor>> ref_b(x.size());
    ref_b[5] = t[5];
    std::vector<at::Tensor> want_b;
    at::globalContext().setUserEnabledMkldnn(false);
    want_b = forward_ad_jvp(fn, x, ref_b);
    at::globalContext().setUserEnabledMkldnn(true);
    for (size_t i = 0; i < got_b.size(); ++i)
      EXPECT_LT(test::rel_error(got_b[i], want_b[i]), 1e-5) << "biases alone, output " << i;
    Linearized lin = linearize(fn, in);
    bool fused = false;
    for (std::string_view k : trace(fn, in, TraceOptions::graph_only()).kernels) fused |= k == "aten::mkldnn_rnn_layer";
    ASSERT_TRUE(fused) << "the trace does not run oneDNN's layer";
    std::vector<at::Tensor> got = lin.jvp(t);
    at::globalContext().setUserEnabledMkldnn(false);
    std::vector<at::Tensor> want = forward_ad_jvp(fn, x, ref);
    at::globalContext().setUserEnabledMkldnn(true);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LT(test::rel_error(got[i], want[i]), 1e-5) << "biases " << biases << " output " << i;
      EXPECT_GT(want[i].abs().max().item<double>(), 1e-3) << "a tangent that is all zero tests nothing";
    }
  }
}

TEST(Linearize, OneShotJvp) {
  auto ex = test::make_example({"mlp", "--seq-len", "8"});
  std::vector<at::Tensor> tangents;
  for (const auto& in : ex.inputs) tangents.push_back(at::randn(in.value.sizes()));
  JvpResult r = jvp(ex.fn(), ex.inputs, tangents);
  std::vector<std::optional<at::Tensor>> ref(tangents.begin(), tangents.end());
  auto want = forward_ad_jvp(ex.fn(), test::values_of(ex.inputs), ref);
  EXPECT_LT(compare(r.tangents, want).rel_error, 1e-5);
  EXPECT_TRUE(r.outputs[0].allclose(ex.fn()(test::values_of(ex.inputs))[0]));
}

TEST(Linearize, CudaMatchesForwardAd) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (auto cfg : std::vector<std::vector<std::string>>{{"sdpa"}, {"sdpa", "--causal"}, {"mlp"}, {"block"}}) {
    std::vector<std::string> flags(cfg.begin() + 1, cfg.end());
    flags.insert(flags.end(), {"--device", "cuda", "--dtype", "float32"});
    auto ex = examples::make(cfg[0], flags);
    Checked c = linearize_and_check(ex);
    EXPECT_LT(c.err.rel_error, 1e-4) << test::config_name(cfg);
  }
}

// Convolutions and batch norm on CUDA, where LibTorch runs cuDNN's batch norm
// (aten::cudnn_batch_norm, whose rule is batch norm's) and the conv kernels of cuDNN.
TEST(Linearize, CudaConvolutionsAndBatchNormMatchForwardAd) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);  // cuDNN's batch norm takes float32, not float64
  for (bool training : {true, false}) {
    TensorFn fn = [training](const std::vector<at::Tensor>& x) {
      at::Tensor h = at::conv2d(x[0], x[1], x[2], 1, 1);
      at::Tensor mean = at::zeros({4}, h.options()), var = at::ones({4}, h.options());
      h = at::batch_norm(h, x[3], x[4], mean, var, training, 0.1, 1e-5, /*cudnn_enabled=*/true);
      return std::vector<at::Tensor>{at::relu(h).sum({2, 3})};
    };
    std::vector<TraceInput> in = {{"x", at::randn({2, 3, 6, 6}, opts)},
                                  {"w", at::randn({4, 3, 3, 3}, opts)},
                                  {"b", at::randn({4}, opts)},
                                  {"g", at::randn({4}, opts)},
                                  {"beta", at::randn({4}, opts)}};
    std::vector<at::Tensor> values, tangents;
    std::vector<std::optional<at::Tensor>> ref_tangents;
    for (const auto& i : in) {
      values.push_back(i.value);
      tangents.push_back(at::randn_like(i.value));
      ref_tangents.push_back(tangents.back());
    }
    Linearized lin = linearize(fn, in);
    at::Tensor want = forward_ad_jvp(fn, values, ref_tangents).at(0);
    EXPECT_LT(test::rel_error(lin.jvp(tangents).at(0), want), 1e-4) << "training " << training;
    bool cudnn = false;
    for (const Node* n : lin.tangent_graph->nodes()) cudnn |= n->op() == "aten::cudnn_batch_norm";
    Trace t = trace(fn, in, TraceOptions::graph_only());
    for (const Node* n : t.graph->nodes()) cudnn |= n->op() == "aten::cudnn_batch_norm";
    EXPECT_TRUE(cudnn) << "LibTorch did not choose cuDNN's batch norm";
  }
}

// cuDNN's grid sampler (bilinear, zero padding, aligned corners on CUDA) has the rule of
// grid_sampler_2d, which the CPU tests check; LibTorch has no forward AD for either, so the
// reference is jvpc's own tangent with cuDNN off.
TEST(Linearize, CudaCudnnGridSamplerMatchesTheNativeKernel) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{at::grid_sampler(x[0], x[1].tanh(), 0, 0, true)};
  };
  std::vector<TraceInput> in = {{"x", at::randn({2, 3, 5, 5}, opts)}, {"grid", at::randn({2, 4, 4, 2}, opts)}};
  std::vector<at::Tensor> tangents = {at::randn({2, 3, 5, 5}, opts), at::randn({2, 4, 4, 2}, opts)};
  Linearized with = linearize(fn, in);
  bool cudnn = false;
  for (const Node* n : trace(fn, in, TraceOptions::graph_only()).graph->nodes())
    cudnn |= n->op() == "aten::cudnn_grid_sampler";
  auto& ctx = at::globalContext();
  bool enabled = ctx.userEnabledCuDNN();
  ctx.setUserEnabledCuDNN(false);
  Linearized without = linearize(fn, in);
  ctx.setUserEnabledCuDNN(enabled);
  EXPECT_TRUE(cudnn) << "LibTorch did not choose cuDNN's grid sampler";
  EXPECT_LT(test::rel_error(with.jvp(tangents).at(0), without.jvp(tangents).at(0)), 1e-5);
}

TEST(Linearize, CudaFusedKernelsMatchMathPathForwardAd) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  // Each fused backend, where the GPU supports it, against forward AD of the math path.
  // Flash attention takes these inputs on any GPU LibTorch 2.11 supports (sm80 and later).
  int flash_checked = 0;
  for (const char* backend : {"flash", "efficient", "cudnn"})
    for (auto extra : std::vector<std::vector<std::string>>{{}, {"--causal"}, {"--kv-heads", "1"}}) {
      std::vector<std::string> flags = {"--device", "cuda", "--dtype", "bfloat16", "--backend", backend};
      flags.insert(flags.end(), extra.begin(), extra.end());
      examples::Instance ex = examples::make("sdpa", flags);
      bool fused = false;
      try {
        Trace t = trace(ex.fn(), ex.inputs, TraceOptions::graph_only());
        for (const Node* n : t.graph->nodes()) fused |= n->op().find("_scaled_dot_product_") != std::string::npos;
      } catch (const std::exception&) {  // LibTorch has no such kernel for these inputs on this GPU
      }
      if (!fused) continue;
      Checked c = linearize_and_check(ex);
      SCOPED_TRACE(std::string(backend) + " " + test::config_name(extra));
      EXPECT_LT(c.err.rel_error, 2e-2);
      EXPECT_EQ(c.lin.report.tangent.matmul_flops, 41943040);
      flash_checked += std::string(backend) == "flash";
    }
  EXPECT_GE(flash_checked, 2) << "LibTorch chose no flash kernel for bf16 inputs of head dim 64";
}

}  // namespace
}  // namespace jvpc

namespace jvpc {
namespace {

// The check's tolerance follows the least precise floating-point output; bool and integer outputs
// (no tangent) do not set it (review: a bool first output made a float32 check 2000x looser).
// The reference for graph files: fused attention replaced by the math path computes the same
// outputs (in the fused kernel's memory layout, which later views of the block rely on), and
// forward AD runs through it.
TEST(Reference, MathAttentionComputesWhatTheFusedKernelDoes) {
  for (auto cfg : std::vector<std::vector<std::string>>{
           {"sdpa", "--backend", "flash", "--kv-heads", "1", "--mask", "float", "--kv-seq-len", "96"},
           {"block", "--backend", "flash", "--causal", "--seq-len", "16"}}) {
    SCOPED_TRACE(test::config_name(cfg));
    auto ex = test::make_example(cfg, {"--dtype", "float64"});
    std::unique_ptr<Graph> g = trace(ex.fn(), ex.inputs, TraceOptions::graph_only()).graph;
    std::unique_ptr<Graph> math = with_math_attention(*g);
    for (const Node* n : math->nodes()) EXPECT_EQ(n->op().find("_scaled_dot_product_flash"), std::string::npos);
    auto x = test::values_of(ex.inputs);
    Executable fused(std::move(g)), ref(std::move(math));
    EXPECT_TRUE(fused.run(x)[0].allclose(ref.run(x)[0], 1e-12, 1e-12));
    std::vector<std::optional<at::Tensor>> t;
    for (const auto& v : x) t.push_back(at::randn_like(v));
    EXPECT_NO_THROW(forward_ad_jvp([&](const std::vector<at::Tensor>& in) { return ref.run(in); }, x, t));
  }
}

TEST(Reference, ToleranceFollowsTheLeastPreciseFloatingOutput) {
  at::Tensor b = at::ones({2}, at::kBool), f = at::ones({2}), d = at::ones({2}, at::kDouble),
             h = at::ones({2}, at::kHalf);
  EXPECT_EQ(tolerance_for({b, f}), 1e-5);
  EXPECT_EQ(tolerance_for({d, f}), 1e-5);
  EXPECT_EQ(tolerance_for({d}), 1e-10);
  EXPECT_EQ(tolerance_for({f, h}), 2e-2);
  EXPECT_EQ(tolerance_for({at::ones({2}, at::kLong)}), 1e-5);
}

}  // namespace
}  // namespace jvpc

namespace jvpc {
namespace {

// The cost model has a FLOP convention for every op the examples and their SDPA variants run,
// in the traced forward and in the tangent graph (an op without one would be reported as
// uncosted, counted as 1 FLOP per output element).
TEST(Cost, TheExamplesHaveNoUncostedOps) {
  for (auto cfg : test::example_configs()) {
    auto ex = test::make_example(cfg);
    Linearized lin = linearize(ex.fn(), ex.inputs);
    EXPECT_TRUE(lin.report.forward.uncosted_ops.empty())
        << test::config_name(cfg) << ": " << ::testing::PrintToString(lin.report.forward.uncosted_ops);
    EXPECT_TRUE(lin.report.tangent.uncosted_ops.empty())
        << test::config_name(cfg) << ": " << ::testing::PrintToString(lin.report.tangent.uncosted_ops);
  }
}

}  // namespace
}  // namespace jvpc
