// The batching transform (passes/batch.cpp, passes/batch_rules/) and the batched linear map
// (Linearized::batched, jvp_batched): K tangents in one call equal K single calls in float64,
// for every SDPA variant (both attention forms), the MLP and the block; the batched graph saves,
// loads under the op list and runs; its matmul FLOPs, counted on the kernels that ran, are the
// cost model's and at most K times one call's; its measured peak holds no residual per tangent;
// an op without a rule is unrolled and named; bad tangents are one-line errors naming them.
#include "compiler/api/linearize.h"
#include "ir/cost/cost_model.h"
#include "ir/cost/kernel_watch.h"
#include "ir/builder.h"
#include "ir/io/files.h"
#include "ir/ops.h"
#include "ir/printer.h"
#include "ir/io/graph_files.h"
#include "ir/io/json_text.h"
#include "ir/verifier.h"
#include "runtime/attention_tangent.h"
#include "runtime/plan.h"
#include "tests/batch_check.h"
#include "tests/helpers.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/library.h>

#include <map>
#include <thread>

namespace jvpc {
namespace {

// A test-only op with no batching rule: the fallback unrolls it.
at::Tensor twice_rows(const at::Tensor& x) { return x * 2 + x.sum(-1, true); }
at::Tensor twice_rows_meta(const at::Tensor& x) { return at::empty_like(x); }

}  // namespace
}  // namespace jvpc

TORCH_LIBRARY(jvpc_batch_test, m) { m.def("twice_rows(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(jvpc_batch_test, CPU, m) { m.impl("twice_rows", &jvpc::twice_rows); }
TORCH_LIBRARY_IMPL(jvpc_batch_test, Meta, m) { m.impl("twice_rows", &jvpc::twice_rows_meta); }

namespace jvpc {
namespace {

bool has_op(const Graph& g, const std::string& op) {
  for (const Node* n : g.nodes())
    if (n->op() == op) return true;
  return false;
}

std::vector<LinearizeOptions> forms(const std::vector<std::string>& cfg) {
  std::vector<LinearizeOptions> out(1);
  if (std::find(cfg.begin(), cfg.end(), "flash") != cfg.end()) {  // also the O(L) form
    out.emplace_back();
    out.back().residual_budget = 0;
  }
  return out;
}

std::string form_name(const LinearizeOptions& o) { return o.residual_budget ? " (O(L) form)" : ""; }

TEST(Batch, ExamplesEqualKSingleCallsInFloat64) {
  for (const auto& cfg : test::example_configs())
    for (const LinearizeOptions& o : forms(cfg)) {
      std::string where = test::config_name(cfg) + form_name(o);
      at::manual_seed(0);
      examples::Instance ex = test::make_example(cfg, {"--dtype", "float64"});
      Linearized lin = linearize(ex.fn(), ex.inputs, o);
      if (o.residual_budget) {
        ASSERT_TRUE(has_op(*lin.tangent_graph, ops::jvpc_attention_tangent)) << where;
      }
      for (int64_t K : {1, 3}) {
        test::BatchCheck r = test::batched_vs_single(lin, K);
        EXPECT_LT(r.rel_error, 1e-12) << where << ", K = " << K;
        EXPECT_TRUE(r.unrolled.empty()) << where << ": " << r.unrolled.front();
      }
      if (o.residual_budget) {
        EXPECT_TRUE(has_op(lin.batched(3).fn->graph(), ops::jvpc_attention_tangent_batched)) << where;
      }
    }
}

// The batched graph is an ordinary graph: it verifies, saves, loads under the loader's op list
// (every shape re-derived) and runs to the same results.
TEST(Batch, BatchedGraphsSaveLoadAndRun) {
  for (const auto& cfg : test::example_configs())
    for (const LinearizeOptions& o : forms(cfg)) {
      std::string where = test::config_name(cfg) + form_name(o);
      examples::Instance ex = test::make_example(cfg, {"--dtype", "float64"});
      Linearized lin = linearize(ex.fn(), ex.inputs, o);
      const BatchedLinear& b = lin.batched(2);
      std::string path = test::temp_path("batched.json");
      save(b.fn->graph(), path);
      std::unique_ptr<Graph> back = load(path);
      verify(*back, VerifyOptions::untrusted());
      std::vector<at::Tensor> tangents = test::random_batched_tangents(lin, 2);
      std::vector<at::Tensor> want = b.fn->run(tangents);
      std::vector<at::Tensor> got = Executable(std::move(back)).run(tangents);
      ASSERT_EQ(got.size(), want.size()) << where;
      for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::allclose(got[i], want[i], 1e-12, 1e-12)) << where;
    }
}

// Matmul FLOPs of a batched call on the kernels that ran are the cost model's figure for the
// batched graph: exactly K times one call's where nothing is shared (every product is by a
// residual, folded), less where the O(L) attention recomputes its scores once for all K.
TEST(Batch, MatmulFlopsOfTheKernelsThatRanAreTheCostModelsBatchedFigure) {
  const int64_t K = 4;
  for (const auto& cfg : test::example_configs())
    for (const LinearizeOptions& o : forms(cfg)) {
      std::string where = test::config_name(cfg) + form_name(o);
      examples::Instance ex = test::make_example(cfg);
      Linearized lin = linearize(ex.fn(), ex.inputs, o);
      int64_t single = graph_cost(*lin.tangent_graph).matmul_flops;
      const BatchedLinear& b = lin.batched(K);
      int64_t model = graph_cost(b.fn->graph()).matmul_flops;
      std::vector<at::Tensor> tangents = test::random_batched_tangents(lin, K);
      b.fn->run(tangents);  // the first call also checks results; count a later one
      KernelWatch watch;
      b.fn->run(tangents);
      EXPECT_EQ(watch.matmul_flops(), model) << where;
      if (o.residual_budget) {
        EXPECT_LT(model, K * single) << where;
        // The score recompute (2·B·H·Lq·Lk·D) once instead of K times.
        const Node* att = nullptr;
        for (const Node* n : lin.tangent_graph->nodes())
          if (n->op() == ops::jvpc_attention_tangent) att = n;
        ASSERT_NE(att, nullptr);
        AttentionTangentShape a = attention_tangent_shape(*att);
        int64_t recompute = 2 * a.B * a.H * attention_tangent_score_elements(a) * a.D;
        EXPECT_EQ(model, K * single - (K - 1) * recompute) << where;
      } else {
        EXPECT_EQ(model, K * single) << where;
      }
    }
}

// Each product of the tangent graph stays ONE product of the batched graph, K folded into its
// rows or columns: as many matmul nodes as one call has. At the seed, the sums dq·kᵀ + q·dkᵀ and
// (P⊙dS)·v + P·dv stay accumulated in their baddbmm: two bmm, two baddbmm, no add.
TEST(Batch, EachProductIsOneProductWithKFolded) {
  auto count = [](const Graph& g) {
    std::map<std::string, int> n;
    for (const Node* node : g.nodes())
      if (node->op() == "aten::mm" || node->op() == "aten::bmm" || node->op() == "aten::addmm" ||
          node->op() == "aten::baddbmm" || node->op() == "aten::add.Tensor")
        n[node->op()]++;
    return n;
  };
  auto products = [&](const Graph& g) {
    std::map<std::string, int> n = count(g);
    return n["aten::mm"] + n["aten::bmm"] + n["aten::addmm"] + n["aten::baddbmm"];
  };
  for (const auto& cfg : test::example_configs())
    for (const LinearizeOptions& o : forms(cfg)) {
      std::string where = test::config_name(cfg) + form_name(o);
      examples::Instance ex = test::make_example(cfg);
      Linearized lin = linearize(ex.fn(), ex.inputs, o);
      int single = products(*lin.tangent_graph);
      for (int64_t K : {4, 16}) EXPECT_EQ(products(lin.batched(K).fn->graph()), single) << where << ", K = " << K;
    }
  examples::Instance ex = test::make_example({"sdpa"});
  Linearized lin = linearize(ex.fn(), ex.inputs);
  std::map<std::string, int> want = {{"aten::baddbmm", 2}, {"aten::bmm", 2}};
  ASSERT_EQ(count(*lin.tangent_graph), want);
  EXPECT_EQ(count(lin.batched(16).fn->graph()), want);
}

// The seed's batched graph accumulates q·dkᵀ into dq·kᵀ's result (a view of it, K folded the
// other way) and P·dv into (P⊙dS)·v's likewise, and softmax's tangent (written out, so that P
// broadcasts) overwrites dS: the plan runs those in place, no copy of self, no fresh [K, ...]
// score buffer but the two bmm results.
TEST(Batch, TheSeedsBatchedGraphRunsInPlace) {
  examples::Instance ex = test::make_example({"sdpa"});
  Linearized lin = linearize(ex.fn(), ex.inputs);
  const Graph& g = lin.batched(16).fn->graph();
  Plan plan = make_plan(g, analyze_liveness(g), /*reuse_buffers=*/true);
  std::map<std::string, int> in_place;
  for (const PlanStep& st : plan.steps)
    if (st.functional) in_place[st.info->name]++;
  std::map<std::string, int> want = {{"aten::baddbmm_", 2}, {"aten::mul_.Tensor", 1}, {"aten::addcmul_", 1}};
  EXPECT_EQ(in_place, want) << to_text(g);
  // And a call runs them so: the dead base a view of a product's result keeps is no other holder.
  std::vector<at::Tensor> tangents = test::random_batched_tangents(lin, 16);
  lin.jvp_batched(16, tangents);
  std::map<std::string, int> ran;
  {
    KernelWatch watch;
    lin.jvp_batched(16, tangents);
    for (const std::string& k : watch.kernels())
      if (want.count(k) || k == "aten::baddbmm" || k == "aten::addcmul") ran[k]++;
  }
  EXPECT_EQ(ran, want);
}

// K cannot be folded next to a product's rows or columns without a copy of the tangent (it
// arrives [K, B·H, L, D]). That copy moves whole contiguous rows: in every example's batched
// graph, each clone reads a value whose last dim is its contiguous one. The tangent that reaches
// q·dkᵀ as the transpose dkᵀ is copied as dk folded into rows, then transposed back (a view), not
// gathered element by element across the transpose (which is 6x slower on this CPU).
TEST(Batch, EveryCopyOfATangentMovesContiguousRows) {
  for (const auto& cfg : test::example_configs())
    for (const LinearizeOptions& o : forms(cfg)) {
      std::string where = test::config_name(cfg) + form_name(o);
      examples::Instance ex = test::make_example(cfg);
      Linearized lin = linearize(ex.fn(), ex.inputs, o);
      const Graph& g = lin.batched(16).fn->graph();
      for (const Node* n : g.nodes()) {
        if (n->op() != "aten::clone") continue;
        const TensorMeta& m = n->tensor_arg(0)->meta();
        if (m.sizes.back() > 1) {
          EXPECT_EQ(m.strides.back(), 1) << where << ": " << to_text(g);
        }
      }
    }
}

// Peak bytes allocated during a call, from the profiler's memory events.
int64_t measured_peak(const std::function<void()>& fn) {
  namespace prof = torch::autograd::profiler;
  namespace impl = torch::profiler::impl;
  impl::ProfilerConfig cfg(impl::ProfilerState::KINETO, false, /*profile_memory=*/true);
  prof::prepareProfiler(cfg, {impl::ActivityType::CPU});
  prof::enableProfiler(cfg, {impl::ActivityType::CPU}, {at::RecordScope::FUNCTION});
  fn();
  auto result = prof::disableProfiler();
  int64_t now = 0, peak = 0;
  for (const auto& e : result->events()) {
    if (e.name() != "[memory]") continue;
    now += e.nBytes();
    peak = std::max(peak, now);
  }
  return peak;
}

// An MLP whose weights (residuals) are large beside its activations' tangents: a batched call's
// peak stays within K single calls' peaks, where a copy of a weight per tangent would add
// K times its bytes.
TEST(Batch, MeasuredPeakHoldsNoResidualPerTangent) {
  const int64_t K = 8;
  examples::Instance ex = test::make_example({"mlp"}, {"--bsz", "1", "--seq-len", "4", "--model-dim", "256"});
  LinearizeOptions o;
  o.wrt = {"x"};
  Linearized lin = linearize(ex.fn(), ex.inputs, o);
  int64_t largest = 0;
  for (const Input& in : lin.tangent_graph->inputs())
    if (in.role == Role::Constant && in.data.defined()) largest = std::max<int64_t>(largest, in.data.nbytes());
  std::vector<at::Tensor> one;
  for (const Input* in : lin.jvp_fn->arguments()) one.push_back(at::randn(in->value->meta().sizes));
  std::vector<at::Tensor> batched = test::random_batched_tangents(lin, K);
  lin.jvp(one);
  lin.jvp_batched(K, batched);
  int64_t single = measured_peak([&] { lin.jvp(one); });
  int64_t peak = measured_peak([&] { lin.jvp_batched(K, batched); });
  ASSERT_GT(largest, 4 * single) << "the test needs residuals larger than a call's peak";
  EXPECT_GT(peak, 0);
  EXPECT_LE(peak, K * single + 4096) << "largest residual " << largest << " bytes";
}

// A tangent graph with an op that has no batching rule: K unrolled copies of that op alone,
// named; the rest batched.
TEST(Batch, AnOpWithoutARuleIsUnrolledAndNamed) {
  auto g = std::make_shared<Graph>();
  Value* dx = g->add_input("dx", TensorMeta::contiguous({3, 4}, at::kDouble, at::kCPU), Role::Tangent);
  g->inputs().back().tangent_of = "x";
  Value* r = g->add_constant("r", at::randn({3, 4}, at::kDouble));
  Builder b(*g);
  Value* y = b.call("aten::mul.Tensor", {dx, r});
  Value* z = b.call("jvpc_batch_test::twice_rows", {y});
  g->add_output(b.call("aten::add.Tensor", {z, dx}), "dy");
  Linearized lin;
  lin.tangent_graph = g;
  lin.jvp_fn = std::make_shared<Executable>(std::shared_ptr<const Graph>(g));
  test::BatchCheck c = test::batched_vs_single(lin, 5);
  EXPECT_LT(c.rel_error, 1e-12);
  EXPECT_EQ(c.unrolled, std::vector<std::string>{"jvpc_batch_test::twice_rows"});
  int copies = 0;
  for (const Node* n : lin.batched(5).fn->graph().nodes()) copies += n->op() == "jvpc_batch_test::twice_rows";
  EXPECT_EQ(copies, 5);
  EXPECT_TRUE(lin.batched(3).unrolled == c.unrolled);
}

TEST(Batch, WrongTangentsAreErrorsNamingThem) {
  examples::Instance ex = test::make_example({"sdpa"}, {"--seq-len", "8"});
  Linearized lin = linearize(ex.fn(), ex.inputs);
  std::vector<at::Tensor> t = test::random_batched_tangents(lin, 3);
  auto with = [&](size_t i, at::Tensor x) {
    std::vector<at::Tensor> u = t;
    u[i] = x;
    return u;
  };
  test::expect_error([&] { lin.jvp_batched(4, t); }, "tangent 'dq': expected K = 4 tangents on the leading dim, got 3");
  test::expect_error([&] { lin.jvp_batched(3, with(1, t[1].narrow(3, 0, 4))); }, "tangent 'dk': expected f32[3,");
  test::expect_error([&] { lin.jvp_batched(3, with(2, t[2].to(at::kDouble))); }, "tangent 'dv': expected f32[3,");
  test::expect_error([&] { lin.jvp_batched(3, {t[0]}); }, "expected 3 tangents, got 1");
  test::expect_error([&] { lin.jvp_batched(0, t); }, "K must be at least 1");
  test::expect_error([&] { lin.jvp_batched(3, with(0, at::Tensor())); }, "tangent 'dq' is an undefined tensor");
}

// Compiled once per K, shared by threads that ask at once.
TEST(Batch, CompiledOncePerKAndCachedAcrossThreads) {
  examples::Instance ex = test::make_example({"mlp"});
  Linearized lin = linearize(ex.fn(), ex.inputs);
  std::vector<const BatchedLinear*> seen(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i) threads.emplace_back([&, i] { seen[i] = &lin.batched(2); });
  for (auto& th : threads) th.join();
  for (const BatchedLinear* s : seen) EXPECT_EQ(s, seen[0]);
  EXPECT_NE(&lin.batched(3), seen[0]);
  Linearized copy = lin;
  EXPECT_EQ(&copy.batched(2), seen[0]);
}

}  // namespace
}  // namespace jvpc
